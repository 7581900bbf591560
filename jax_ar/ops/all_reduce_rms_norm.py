"""jax_ar.all_reduce_rms_norm: all-reduce + residual add + RMSNorm (+ FP8 out)
in one call, the boundary of every tensor-parallel transformer block.

The primitive binds the FFI target `jax_ar_all_reduce_rms_norm`:

  args   x [T, H] (this rank's partial sums), residual [T, H], gamma [H]
         (one of float32 | bfloat16 | float16), scale f32[] (read only when
         quantize=1)
  rets   out [T, H] (x's dtype, or float8_e4m3fn when quantize=1),
         residual_out [T, H] (x's dtype)
  attrs  comm_id:i64, algorithm:i32 (protocol.h codes), eps:f32, quantize:i32

  t = float32 sum of x over ranks in rank order + float32(residual)
  residual_out = round(t); v = float32(residual_out)
  out = round(v * rsqrt(mean(v * v, -1) + eps) * float32(gamma)), or
        float8_e4m3fn(saturate(v * rsqrt(...) * float32(gamma) / scale)).

Like all_reduce, the results no longer vary over the reduced axis. Paths:
the fused kernel; the "general" path (jax_ar.all_reduce of float32 x, then
the norm in jnp) for shapes the kernel does not take; and psum + jnp when
jax_ar cannot serve the axis (algorithm="psum", a fallback communicator, a
build without the fused target). Gradients (custom VJP) match the unfused
composition all_reduce + add + norm; the FP8 output is not differentiable.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

import jax
import jax.numpy as jnp
from jax.interpreters import batching

from .. import _compat, _native, config, selection
from .._native import ALGORITHM_CODES
from ._axes import as_varying
from ._primitive import collective_primitive, fallback_reason, log_fallback
from .all_reduce import all_reduce_p, reduce_leaves
from .norm_math import FP8_DTYPE, norm_tangent, normalize, quantize_fp8
from .rms_norm import module_serves

__all__ = ["all_reduce_rms_norm_p", "composed", "fused_or_composed"]

TARGET = "jax_ar_all_reduce_rms_norm"


_FP8_NOT_DIFFERENTIABLE = (
    "jax_ar.all_reduce_rms_norm with quant_scale (float8_e4m3fn output) is not differentiable: "
    "differentiate the unquantized call (quant_scale=None) and quantize separately")

# The primitive. Operands: x [T, H], residual [T, H], gamma [H], scale f32[].
# Params: axes, algorithm ("oneshot" | "twoshot"), comm_id, world_size, eps,
# quantize (bool).

def _abstract_eval(x, residual, gamma, scale, *, axes, quantize, **_):
    varying = frozenset().union(*(_compat.varying_axes(a) for a in (x, residual, gamma, scale)))
    varying = varying - set(axes)  # all-reduced, like psum
    residual_out = _compat.with_varying_axes(x.update(weak_type=False), varying)
    out = residual_out.update(dtype=FP8_DTYPE) if quantize else residual_out
    return [out, residual_out]


def _ffi_attributes(*, algorithm, comm_id, eps, quantize, **_):
    return dict(comm_id=np.int64(comm_id), algorithm=np.int32(ALGORITHM_CODES[algorithm]),
                eps=np.float32(eps), quantize=np.int32(1 if quantize else 0))


all_reduce_rms_norm_p = collective_primitive(TARGET, "all_reduce_rms_norm", _abstract_eval,
                                             _ffi_attributes,
                                             axis_of=lambda params: params["axes"][0],
                                             multiple_results=True)


def _batch(args, dims, **params):
    x, residual, gamma, scale = args
    if dims[2] is not None or dims[3] is not None:
        raise NotImplementedError(
            "jax_ar.all_reduce_rms_norm under vmap: gamma and quant_scale must be the same for "
            "every batch member (vmap over x and residual only)")
    size = x.shape[dims[0]] if dims[0] is not None else residual.shape[dims[1]]
    rows = [jnp.moveaxis(a, d, 0) if d is not None else jnp.broadcast_to(a, (size,) + a.shape)
            for a, d in zip((x, residual), dims[:2])]
    shape = rows[0].shape
    flat = [r.reshape((-1, shape[-1])) for r in rows]  # rows are independent
    outs = all_reduce_rms_norm_p.bind(*flat, gamma, scale, **params)
    return [o.reshape(shape) for o in outs], [0, 0]


batching.primitive_batchers[all_reduce_rms_norm_p] = _batch


# ----------------------------------------------------------------------------
# Differentiation: a custom VJP around the primitive.

@dataclasses.dataclass(frozen=True)
class _Call:
    """Everything static about one fused call (hashable, for custom_vjp)."""
    axes: tuple
    algorithm: str
    comm_id: int
    world_size: int
    eps: float
    quantize: bool
    vma: bool  # the enclosing shard_map tracks varying axes
    residual_varies: bool  # residual / gamma vary over the axis (vma only)
    gamma_varies: bool

    def primitive_params(self):
        return dict(axes=self.axes, algorithm=self.algorithm, comm_id=self.comm_id,
                    world_size=self.world_size, eps=self.eps, quantize=self.quantize)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(call, x, residual, gamma, scale):
    return tuple(all_reduce_rms_norm_p.bind(x, residual, gamma, scale, **call.primitive_params()))


def _fused_fwd(call, x, residual, gamma, scale):
    if call.quantize:
        raise NotImplementedError(_FP8_NOT_DIFFERENTIABLE)
    outs = _fused(call, x, residual, gamma, scale)
    return outs, (outs[1], gamma)


def _fused_bwd(call, saved, cotangents):
    residual_out, gamma = saved
    dtype = residual_out.dtype
    f32 = jnp.float32
    g_out, g_residual_out = (c.astype(f32) for c in cotangents)
    v = residual_out.astype(f32)
    # The norm's transpose: the VJP of norm_tangent's linear map.
    _, vjp = jax.vjp(lambda dv, dg: norm_tangent(v, gamma.astype(f32), dv, dg, call.eps),
                     jnp.zeros_like(v), jnp.zeros(gamma.shape, f32))
    g_v, g_gamma = vjp(g_out)
    g_t = (g_v + g_residual_out).astype(dtype)  # cotangent of all_reduce(x) + residual
    if call.vma:
        # all_reduce's transpose (as psum's): each rank's x gets the cotangent
        # of the invariant sum, marked varying.
        g_x = as_varying(g_t, call.axes)
    else:
        (g_x,) = all_reduce_p.bind(g_t, axes=call.axes, op="sum", algorithm=call.algorithm,
                                   comm_id=call.comm_id, world_size=call.world_size, vma=False)
    g_res = as_varying(g_t, call.axes) if call.residual_varies else g_t
    g_gamma = g_gamma.astype(gamma.dtype)
    if call.gamma_varies:
        g_gamma = as_varying(g_gamma, call.axes)
    return g_x, g_res, g_gamma, None


_fused.defvjp(_fused_fwd, _fused_bwd)


def _not_differentiable(fn, *args):
    """fn(*args), with an error instead of a gradient (FP8 output)."""
    @jax.custom_vjp
    def wrapped(*a):
        return fn(*a)

    def fwd(*a):
        raise NotImplementedError(_FP8_NOT_DIFFERENTIABLE)

    wrapped.defvjp(fwd, lambda saved, cotangents: None)
    return wrapped(*args)


# ----------------------------------------------------------------------------
# The unfused paths.

def _unfused(x, residual, gamma, scale, *, reduce, eps, quantize):
    """The same math from separate ops: reduce(float32 x) + residual, norm."""
    f32 = jnp.float32
    residual_out = (reduce(x.astype(f32)) + residual.astype(f32)).astype(x.dtype)
    y = normalize(residual_out.astype(f32), eps)[0] * gamma.astype(f32)
    out = quantize_fp8(y, scale) if quantize else y.astype(x.dtype)
    return out, residual_out


def _kernel_refuses(x, platform) -> str | None:
    """Why the fused kernels (the compiled module's limits) do not take x's
    rows, or None."""
    limits = _native.limits(platform)
    low, high = limits["fused_min_hidden"], limits["fused_max_hidden"]
    hidden, itemsize = x.shape[-1], np.dtype(x.dtype).itemsize
    vector = limits["vector_bytes"] // itemsize
    if not low <= hidden <= high or hidden % vector:
        return (f"hidden size {hidden} is not a multiple of {vector} in "
                f"[{low}, {high}] for {np.dtype(x.dtype)}")
    return None


# ----------------------------------------------------------------------------
# Which path serves a call.

def composed(x, residual, gamma, scale, reduce, eps, quantize):
    """jax_ar.all_reduce_rms_norm of checked operands as separate ops:
    reduce(float32 x) (an all-reduce over the call's axes) + residual, then
    the norm in jnp."""
    fn = functools.partial(_unfused, reduce=reduce, eps=eps, quantize=quantize)
    return _not_differentiable(fn, x, residual, gamma, scale) if quantize else \
        fn(x, residual, gamma, scale)


def fused_or_composed(x, residual, gamma, scale, axes, comm, eps, algorithm, quantize):
    """jax_ar.all_reduce_rms_norm of checked operands over one mesh axis
    (`axes`, served by `comm`): the fused kernel where it serves, else the
    same math composed of an all-reduce (jax_ar's, or psum where jax_ar
    cannot serve) and the norm in jnp."""
    def unfused(reduce):
        return composed(x, residual, gamma, scale, reduce, eps, quantize)

    psum = functools.partial(jax.lax.psum, axis_name=axes)
    if algorithm == "psum":
        return unfused(psum)
    reason = fallback_reason(comm) or module_serves(comm.platform, TARGET)
    if reason is not None:
        log_fallback(comm, "all_reduce_rms_norm", axes[0], "psum", reason)
        return unfused(psum)
    if algorithm == "auto":
        algorithm = selection.choose_for(comm, x.size * x.dtype.itemsize)
        if algorithm == "psum":
            return unfused(psum)

    # A fused call carries as many whole rows per round through the
    # workspace as fit (the handlers run several rounds for the rest); a row
    # too long for one round takes the general path, whose all_reduce cuts
    # anywhere.
    reason = _kernel_refuses(x, comm.platform) if x.size else "no elements"
    row_bytes = x.shape[-1] * x.dtype.itemsize
    if reason is None and row_bytes > comm.capacity_bytes("max_fused_row_bytes"):
        reason = (f"one row of {row_bytes} bytes does not fit a round of the workspace "
                  f"(workspace_bytes={comm.workspace_bytes}, {comm.world_size} ranks)")
    if reason is not None:
        config.log_once(("all_reduce_rms_norm general", reason),
                        f"jax_ar: all_reduce_rms_norm runs all_reduce + a separate norm: {reason}")
        return unfused(lambda v: reduce_leaves([v], axes, "sum", algorithm, comm)[0])

    vma = _compat.check_vma_enabled()
    varies = lambda a: vma and bool(set(axes) & _compat.varying_axes(jax.typeof(a)))
    call = _Call(axes=axes, algorithm=algorithm, comm_id=comm.comm_id,
                 world_size=comm.world_size, eps=eps, quantize=quantize, vma=vma,
                 residual_varies=varies(residual), gamma_varies=varies(gamma))
    if vma:
        x = as_varying(x, axes)
    shape = x.shape
    rows = (-1, shape[-1])
    out, residual_out = _fused(call, x.reshape(rows), residual.reshape(rows), gamma, scale)
    return out.reshape(shape), residual_out.reshape(shape)
