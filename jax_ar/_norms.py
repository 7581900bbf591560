"""The public norms: argument checks, then the primitives of ops/."""
from __future__ import annotations

import functools
import numbers

import numpy as np

import jax
import jax.numpy as jnp

from . import config
from .ops._axes import classify_axes, communicator_for, normalize_axes
from .ops._primitive import call_lax, log_lax
from .ops.all_reduce_rms_norm import composed, fused_or_composed
from .ops.multi_axis import all_reduce_over
from .ops.norm_math import reference
from .ops.rms_norm import SUPPORTED_DTYPES, rms_norm_p

__all__ = ["all_reduce_rms_norm", "rms_norm"]


def rms_norm(x, gamma, eps=1e-6, residual=None):
    """RMSNorm over the last dimension, optionally after a residual add.

    Without `residual`: returns out = x * rsqrt(mean(x^2, -1) + eps) * gamma.
    With `residual`: returns (out, residual_out) where residual_out = x +
    residual (rounded to x's dtype) and out is the norm of residual_out.
    Arithmetic in float32, one rounding per output. x: [..., H] of float32,
    bfloat16 or float16; gamma: [H] and residual: like x, same dtype.

    Works in plain jit on sharded arrays (leading dims keep their sharding,
    the last is gathered), inside shard_map, under vmap, and is
    differentiable (forward and reverse mode).
    """
    op = "jax_ar.rms_norm"
    x, residual, gamma = _check_operands(op, x, residual, gamma)
    eps = _check_eps(op, eps)
    if np.size(x) == 0:  # nothing for a kernel to do
        outs = reference(x, gamma, eps, residual)
    elif residual is None:
        outs = rms_norm_p.bind(x, gamma, eps=eps)
    else:
        outs = rms_norm_p.bind(x, residual, gamma, eps=eps)
    return outs[0] if residual is None else (outs[0], outs[1])


def all_reduce_rms_norm(x, residual, gamma, axis_name, eps=1e-6, algorithm="auto",
                        quant_scale=None):
    """Inside jax.shard_map: residual_out = all_reduce(x) + residual and out =
    RMSNorm(residual_out) * gamma, both invariant over `axis_name`.

    x: this rank's partial sums [..., H] (float32, bfloat16 or float16);
    residual: like x, and gamma: [H], the same on every rank and of x's dtype.
    The sum and the norm run in float32; residual_out is rounded to x's dtype
    and the norm reads that rounded value. With quant_scale (a positive
    scalar), out is float8_e4m3fn: saturate(out / quant_scale) to +-448.
    algorithm: "auto" | "oneshot" | "twoshot" | "psum". Returns (out,
    residual_out). Differentiable except with quant_scale.
    """
    op = "jax_ar.all_reduce_rms_norm"
    if not isinstance(algorithm, str) or algorithm not in config.ALGORITHMS:
        raise ValueError(f"{op}: algorithm must be one of {config.ALGORITHMS}, got {algorithm!r}")
    if residual is None:
        raise TypeError(f"{op}: residual is required (pass zeros for a block without one)")
    x, residual, gamma = _check_operands(op, x, residual, gamma)
    eps = _check_eps(op, eps)
    quantize = quant_scale is not None
    scale = _check_quant_scale(quant_scale) if quantize else jnp.ones((), jnp.float32)
    axes = normalize_axes(axis_name, op)
    kinds = classify_axes(axes, op)
    if algorithm == "auto":
        algorithm = config.algorithm_override() or "auto"
    if len(axes) == 1 and kinds.mesh:  # the fused kernel's case
        comm = communicator_for(axes[0], op)
        if comm is not None:
            return fused_or_composed(x, residual, gamma, scale, axes, comm, eps, algorithm,
                                     quantize)
        reduce = functools.partial(jax.lax.psum, axis_name=axes)
    elif not axes:
        reduce = lambda v: v  # a sum over no axis
    elif kinds.positional:
        log_lax(op, axes, "jax.lax.psum", f"positional axes {kinds.positional}")
        reduce = lambda v: call_lax(op, "jax.lax.psum", jax.lax.psum, v, axes)
    else:  # several axes, vmap axes, size-1 axes: all_reduce's composition
        reduce = lambda v: all_reduce_over([v], kinds, "sum", algorithm, op)[0]
    return composed(x, residual, gamma, scale, reduce, eps, quantize)


# ----------------------------------------------------------------------------
# Argument checks.

def _check_eps(op: str, eps) -> float:
    """eps as a Python float, or a clear error."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{op}: eps must be a Python float, got {type(eps).__name__} {eps!r}")
    value = float(eps)
    if not value > 0 or not np.isfinite(value):
        raise ValueError(f"{op}: eps must be positive and finite, got {eps!r}")
    if not np.float32(value) > 0:
        raise ValueError(f"{op}: eps={eps!r} is zero in float32")
    return value


def _check_operands(op: str, x, residual, gamma):
    """Converts to arrays and checks dtypes and shapes: x [..., H], residual
    like x (if given), gamma [H], all of one float dtype jax_ar serves."""
    names = ("x", "residual", "gamma")
    arrays = []
    for name, a in zip(names, (x, residual, gamma)):
        if a is None:
            arrays.append(None)
            continue
        if not hasattr(a, "dtype") or not hasattr(a, "shape"):
            try:
                a = jnp.asarray(a)
            except TypeError:
                raise TypeError(f"{op}: {name} must be an array, got {type(a).__name__}") from None
        arrays.append(a)
    x, residual, gamma = arrays
    dtype = np.dtype(x.dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{op}: x has dtype {dtype}; supported: "
                        f"{', '.join(str(d) for d in SUPPORTED_DTYPES)}")
    for name, a in (("residual", residual), ("gamma", gamma)):
        if a is not None and np.dtype(a.dtype) != dtype:
            raise TypeError(f"{op}: {name} has dtype {np.dtype(a.dtype)} but x has {dtype}; "
                            f"cast them to one dtype")
    if np.ndim(x) < 1:
        raise ValueError(f"{op}: x must have at least one dimension (the hidden one), got a scalar")
    if residual is not None and tuple(residual.shape) != tuple(x.shape):
        raise ValueError(f"{op}: residual has shape {tuple(residual.shape)} but x has "
                         f"{tuple(x.shape)}; they must match")
    hidden = x.shape[-1]
    if tuple(gamma.shape) != (hidden,):
        raise ValueError(f"{op}: gamma has shape {tuple(gamma.shape)}, expected ({hidden},) "
                         f"for x of shape {tuple(x.shape)} (one scale per hidden feature)")
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
