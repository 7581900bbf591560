"""The public norms: argument checks, then the primitives of ops/ (for
all_reduce_rms_norm, as the call's plan says: ops/plan.py)."""
from __future__ import annotations

import numbers

import numpy as np

import jax
import jax.numpy as jnp

from . import config
from .ops._axes import classify_axes, normalize_axes
from .ops.all_reduce_rms_norm import run_norm
from .ops.norm_math import reference, scale_vector, widen
from .ops.plan import plan_norm
from .ops.rms_norm import SUPPORTED_DTYPES, kernel_takes_residual, rms_norm_p

__all__ = ["all_reduce_rms_norm", "rms_norm"]

_SMALLEST_NORMAL_F32 = float(np.finfo(np.float32).tiny)


def rms_norm(x, gamma, eps=1e-6, scale_offset=0.0, residual=None):
    """RMSNorm over the last dimension, optionally after a residual add.

    Without `residual`: returns out = x * rsqrt(mean(x^2, -1) + eps) *
    (gamma + scale_offset). With `residual`: returns (out, residual_out)
    where residual_out = x + residual (rounded to the residual's dtype) and
    out is the norm of residual_out. Arithmetic in float32, one rounding per
    output; out has x's dtype. x: [..., H] of float32, bfloat16 or float16;
    residual: like x, of any of those dtypes (a float32 residual stream
    beside 16-bit x runs in the kernel); gamma: [H] of any float dtype.
    scale_offset=1.0 is Gemma's zero-centred (1 + scale).

    Works in plain jit on sharded arrays (leading dims keep their sharding,
    the last is gathered), inside shard_map, under vmap, and is
    differentiable (forward and reverse mode).
    """
    op = "jax_ar.rms_norm"
    x, residual, gamma = _check_operands(op, x, residual, gamma)
    eps = _check_eps(op, eps)
    gamma = scale_vector(gamma, _check_offset(op, scale_offset))
    reason = None if residual is None else kernel_takes_residual(x.dtype, residual.dtype)
    if reason is not None:
        config.report(op, None, "XLA's own ops",
                      config.Reason(reason, "cast the residual to x's dtype or float32"))
    if np.size(x) == 0 or reason is not None:  # nothing for a kernel to do
        outs = reference(x, gamma, eps, residual)
    elif residual is None:
        outs = rms_norm_p.bind(x, gamma, eps=eps)
    else:
        outs = rms_norm_p.bind(x, residual, gamma, eps=eps)
    return outs[0] if residual is None else (outs[0], outs[1])


def all_reduce_rms_norm(x, residual, gamma, axis_name, eps=1e-6, algorithm="auto",
                        quant_scale=None, scale_offset=0.0, post_gamma=None, bias=None):
    """Inside jax.shard_map: the tensor-parallel block boundary in one call,
    both results invariant over `axis_name`:

        y = all_reduce(x) (+ bias)
        with post_gamma: y = rms(y) * (post_gamma + scale_offset)
        residual_out = y + residual                       (residual's dtype)
        out = rms(residual_out) * (gamma + scale_offset)   (x's dtype)

    where rms(v) = v * rsqrt(mean(v^2, -1) + eps), all in float32 (the sum
    over ranks is the float32 rank-order sum). x: this rank's partial sums
    [..., H] (float32, bfloat16 or float16); residual: like x, of any of
    those dtypes; gamma, post_gamma, bias: [H] of any float dtype, the same
    on every rank (bias is added once, after the reduction). scale_offset=1.0
    is Gemma's (1 + scale); post_gamma is Gemma 2/3's post-norm. With
    quant_scale (a positive scalar), out is float8_e4m3fn: saturate(out /
    quant_scale) to +-448. algorithm: "auto" | "oneshot" | "twoshot" |
    "psum" ("oneshot"/"twoshot" force the fused kernel; "auto" may run
    jax_ar.all_reduce then jax_ar.rms_norm where the cost table says that is
    faster, see docs/rms_norm.md). Returns (out, residual_out).
    Differentiable in reverse mode (jax.grad, jax.vjp) except with
    quant_scale; forward mode (jax.jvp, jax.jacfwd) raises JAX's TypeError
    where the fused kernel serves the call (its derivative is a custom VJP).
    Under vmap gamma may differ per batch member (stacked layers).
    """
    op = "jax_ar.all_reduce_rms_norm"
    if not isinstance(algorithm, str) or algorithm not in config.ALGORITHMS:
        raise ValueError(f"{op}: algorithm must be one of {config.ALGORITHMS}, got {algorithm!r}")
    if residual is None:
        raise TypeError(f"{op}: residual is required (pass zeros for a block without one)")
    x, residual, gamma = _check_operands(op, x, residual, gamma)
    post_gamma = _check_vector(op, "post_gamma", post_gamma, x)
    bias = _check_vector(op, "bias", bias, x)
    eps = _check_eps(op, eps)
    offset = _check_offset(op, scale_offset)
    quantize = quant_scale is not None
    scale = _check_quant_scale(quant_scale) if quantize else jnp.ones((), jnp.float32)
    axes = normalize_axes(axis_name, op)
    kinds = classify_axes(axes, op)
    if algorithm == "auto":
        algorithm = config.algorithm_override() or "auto"
    gamma = scale_vector(gamma, offset)
    post_gamma = None if post_gamma is None else scale_vector(post_gamma, offset)
    bias = None if bias is None else widen(bias)
    plan = plan_norm(op, kinds, x, residual, post_gamma is not None or bias is not None,
                     quantize, algorithm)
    return run_norm(plan, x, residual, gamma, post_gamma, bias, scale, eps, quantize)


# ----------------------------------------------------------------------------
# Argument checks.

def _check_eps(op: str, eps) -> float:
    """eps as a Python float, or a clear error."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{op}: eps must be a Python float, got {type(eps).__name__} {eps!r}")
    value = float(eps)
    if not value > 0 or not np.isfinite(value):
        raise ValueError(f"{op}: eps must be positive and finite, got {eps!r}")
    if not np.float32(value) >= _SMALLEST_NORMAL_F32:
        # Subnormal (or zero) in float32: XLA's CPU code and the fused kernel
        # flush it to zero, where an all-zero row has no RMS.
        raise ValueError(f"{op}: eps={eps!r} is below float32's smallest normal number "
                         f"({_SMALLEST_NORMAL_F32:.8g}), which kernels flush to zero")
    return value


def _check_offset(op: str, scale_offset) -> float:
    """scale_offset as a Python float, or a clear error."""
    if isinstance(scale_offset, bool) or not isinstance(scale_offset, numbers.Real):
        raise TypeError(f"{op}: scale_offset must be a Python float (0.0, or 1.0 for Gemma's "
                        f"1 + scale), got {type(scale_offset).__name__} {scale_offset!r}")
    value = float(scale_offset)
    if not np.isfinite(value):
        raise ValueError(f"{op}: scale_offset must be finite, got {scale_offset!r}")
    return value


def _as_array(op: str, name: str, a):
    if not hasattr(a, "dtype") or not hasattr(a, "shape"):
        try:
            a = jnp.asarray(a)
        except TypeError:
            raise TypeError(f"{op}: {name} must be an array, got {type(a).__name__}") from None
    return a


def _check_vector(op: str, name: str, v, x):
    """A per-feature vector (gamma, post_gamma, bias): None, or [H] of a
    float dtype."""
    if v is None:
        return None
    v = _as_array(op, name, v)
    if not jnp.issubdtype(v.dtype, jnp.floating):
        raise TypeError(f"{op}: {name} has dtype {np.dtype(v.dtype)}; it must be a float dtype")
    hidden = x.shape[-1]
    if tuple(v.shape) != (hidden,):
        raise ValueError(f"{op}: {name} has shape {tuple(v.shape)}, expected ({hidden},) "
                         f"for x of shape {tuple(x.shape)} (one value per hidden feature)")
    return v


def _check_operands(op: str, x, residual, gamma):
    """Converts to arrays and checks dtypes and shapes: x [..., H] and
    residual like x (if given), each of a float dtype jax_ar serves; gamma
    [H] of any float dtype."""
    x = _as_array(op, "x", x)
    dtype = np.dtype(x.dtype)
    supported = ", ".join(str(d) for d in SUPPORTED_DTYPES)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{op}: x has dtype {dtype}; supported: {supported}")
    if np.ndim(x) < 1:
        raise ValueError(f"{op}: x must have at least one dimension (the hidden one), got a scalar")
    if residual is not None:
        residual = _as_array(op, "residual", residual)
        if np.dtype(residual.dtype) not in SUPPORTED_DTYPES:
            raise TypeError(f"{op}: residual has dtype {np.dtype(residual.dtype)}; supported: "
                            f"{supported}")
        if tuple(residual.shape) != tuple(x.shape):
            raise ValueError(f"{op}: residual has shape {tuple(residual.shape)} but x has "
                             f"{tuple(x.shape)}; they must match")
    if gamma is None:
        raise TypeError(f"{op}: gamma is required (ones for a norm without a scale)")
    gamma = _check_vector(op, "gamma", gamma, x)
    return x, residual, gamma


def _check_quant_scale(quant_scale):
    """quant_scale as a float32 scalar array, or a clear error."""
    op = "jax_ar.all_reduce_rms_norm"
    if hasattr(quant_scale, "dtype"):
        if not jnp.issubdtype(quant_scale.dtype, jnp.floating):
            raise TypeError(f"{op}: quant_scale must have a float dtype, got {quant_scale.dtype}")
    elif isinstance(quant_scale, bool) or not isinstance(quant_scale, (int, float)):
        raise TypeError(f"{op}: quant_scale must be a positive float scalar (a Python number or "
                        f"a float array of shape ()), got {type(quant_scale).__name__}")
    if np.shape(quant_scale) != ():
        raise ValueError(f"{op}: quant_scale must be a scalar (shape ()), one scale for the "
                         f"whole output; got shape {np.shape(quant_scale)}")
    try:
        value = float(quant_scale)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        value = None  # traced: the kernel divides by whatever arrives
    if value is not None and (not value > 0 or not np.isfinite(value)):
        raise ValueError(f"{op}: quant_scale must be positive and finite, got {value}")
    return jnp.asarray(quant_scale, dtype=jnp.float32)
