"""jax_ar.all_reduce_rms_norm: all-reduce (+ bias, + post-norm) + residual add
+ RMSNorm (+ FP8 out) in one call, the boundary of every tensor-parallel
transformer block.

The primitive binds the FFI target `jax_ar_all_reduce_rms_norm`, whose
operands, results and attributes cuda/common/all_reduce_rms_norm_ffi.h
binds for both backends (`_abstract_eval` and `_ffi_attributes` here
follow it). Per row:

  t = float32 sum of x over ranks in rank order (+ bias)
  with post_gamma: t = t * rsqrt(mean(t * t, -1) + eps) * post_gamma
  residual_out = round(t + float32(residual)); v = float32(residual_out)
  out = round(v * rsqrt(mean(v * v, -1) + eps) * gamma), or
        float8_e4m3fn(saturate(v * rsqrt(...) * gamma / scale)).

The scale vectors arrive in float32 with scale_offset added (norm_math.
scale_vector); rows fall into G groups of T / G rows, group g using row g of
each vector (a vmap over stacked layers, `_batch`).

Like all_reduce, the results no longer vary over the reduced axis. The
call's plan (ops/plan.py: plan_norm) picks the path `run_norm` carries out:
the fused kernel; the pair (jax_ar.all_reduce of x, then jax_ar.rms_norm),
which algorithm="auto" takes where the cost table predicts it faster; or
"composed", an all-reduce of float32 x (jax_ar's, or jax.lax's where jax_ar
cannot serve: algorithm="psum", a fallback communicator, a build without
the fused target) and the rest in jnp, for shapes and dtype pairs the
kernel does not take. Gradients (custom VJP) match the unfused composition;
the FP8 output is not differentiable.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

import jax
import jax.numpy as jnp
from jax.interpreters import batching

from .. import _compat, config
from .._native import ALGORITHM_CODES
from ._axes import as_varying
from ._primitive import collective_primitive
from .all_reduce import all_reduce_p, run_all_reduce
from .norm_math import FP8_DTYPE, fused_reference, norm_tangent, quantize_fp8, widen
from .rms_norm import rms_norm_p

__all__ = ["all_reduce_rms_norm_p", "run_norm"]

TARGET = "jax_ar_all_reduce_rms_norm"

_FP8_NOT_DIFFERENTIABLE = (
    "jax_ar.all_reduce_rms_norm with quant_scale (float8_e4m3fn output) is not differentiable: "
    "differentiate the unquantized call (quant_scale=None) and quantize separately")

# The primitive. Operands: x [T, H], residual [T, H], gamma f32[G, H],
# post_gamma f32[G or 0, H], bias f32[G or 0, H], scale f32[]. Params: axes,
# algorithm ("oneshot" | "twoshot"), comm_id, world_size, eps, quantize (bool).

def _abstract_eval(x, residual, gamma, post_gamma, bias, scale, *, axes, quantize, **_):
    varying = frozenset().union(*(_compat.varying_axes(a)
                                  for a in (x, residual, gamma, post_gamma, bias, scale)))
    varying = varying - set(axes)  # all-reduced, like psum
    residual_out = _compat.with_varying_axes(residual.update(weak_type=False), varying)
    out = _compat.with_varying_axes(x.update(weak_type=False), varying)
    if quantize:
        out = out.update(dtype=FP8_DTYPE)
    return [out, residual_out]


def _ffi_attributes(*, algorithm, comm_id, eps, quantize, **_):
    return dict(comm_id=np.int64(comm_id), algorithm=np.int32(ALGORITHM_CODES[algorithm]),
                eps=np.float32(eps), quantize=np.int32(1 if quantize else 0))


all_reduce_rms_norm_p = collective_primitive(TARGET, "all_reduce_rms_norm", _abstract_eval,
                                             _ffi_attributes,
                                             axis_of=lambda params: params["axes"][0],
                                             multiple_results=True)


def _batch(args, dims, **params):
    """A batch dimension adds rows; a batch of scale vectors (stacked layers
    under vmap) adds groups: member b's rows use row b of each."""
    x, residual, gamma, post_gamma, bias, scale = args
    x_dim, residual_dim, gamma_dim, post_dim, bias_dim, scale_dim = dims
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    if scale_dim is not None:
        if params["quantize"]:
            return _batch_per_member_scale(args, dims, size, **params)
        scale = jnp.ones((), jnp.float32)  # read only when quantizing
    rows = [jnp.moveaxis(a, d, 0) if d is not None else jnp.broadcast_to(a, (size,) + a.shape)
            for a, d in zip((x, residual), (x_dim, residual_dim))]
    shape = rows[0].shape  # [B, T, H]
    flat = [r.reshape((-1, shape[-1])) for r in rows]  # rows are independent

    # Member b's T rows were G groups; now the B T rows are B G groups
    # (unless every member shares one group).
    vectors = [(v if d is None else jnp.moveaxis(v, d, 0), d)
               for v, d in ((gamma, gamma_dim), (post_gamma, post_dim), (bias, bias_dim))]
    groups = max(v.shape[-2] for v, _ in vectors)  # absent vectors have 0 rows
    regroup = groups > 1 or any(d is not None for _, d in vectors)

    def stacked(vector, dim):
        if dim is not None:  # [B, G or 0, H]
            vector = vector.reshape((-1, vector.shape[-1]))
        elif regroup and vector.shape[0]:
            vector = jnp.tile(vector, (size, 1))
        return vector

    outs = all_reduce_rms_norm_p.bind(*flat, *(stacked(v, d) for v, d in vectors), scale,
                                      **params)
    return [o.reshape(shape) for o in outs], [0, 0]


def _batch_per_member_scale(args, dims, size, *, axes, algorithm, comm_id, world_size, eps,
                            quantize):
    """A batch of FP8 scales: the kernel takes one, so each member's math
    runs as the general path (all_reduce of float32 x, then jnp), logged."""
    config.report("jax_ar.all_reduce_rms_norm", axes, "jax_ar.all_reduce + a separate norm",
                  config.Reason("a quant_scale per batch member under vmap",
                                "share one quant_scale across the batch to fuse"))

    def member(x, residual, gamma, post_gamma, bias, scale):
        (total,) = all_reduce_p.bind(widen(x), axes=axes, op="sum",
                                     algorithm=algorithm, comm_id=comm_id, world_size=world_size,
                                     vma=False)
        rows = jnp.arange(x.shape[0]) // (x.shape[0] // gamma.shape[0])
        pick = lambda v: v[rows] if v.shape[0] else None  # noqa: E731
        y, residual_out = fused_reference(total, residual, pick(gamma), eps, pick(post_gamma),
                                          pick(bias))
        return quantize_fp8(y, scale) if quantize else y.astype(x.dtype), residual_out

    outs = jax.vmap(member, in_axes=tuple(dims), axis_size=size)(*args)
    return list(outs), [0, 0]


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
    varies: tuple  # (residual, gamma, post_gamma, bias) vary over the axis (vma only)
    x_dtype: np.dtype

    def primitive_params(self):
        return dict(axes=self.axes, algorithm=self.algorithm, comm_id=self.comm_id,
                    world_size=self.world_size, eps=self.eps, quantize=self.quantize)

    def all_reduce(self, v):
        (out,) = all_reduce_p.bind(v, axes=self.axes, op="sum", algorithm=self.algorithm,
                                   comm_id=self.comm_id, world_size=self.world_size,
                                   vma=self.vma)
        return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(call, x, residual, gamma, post_gamma, bias, scale):
    return tuple(all_reduce_rms_norm_p.bind(x, residual, gamma, post_gamma, bias, scale,
                                            **call.primitive_params()))


def _fused_fwd(call, x, residual, gamma, post_gamma, bias, scale):
    if call.quantize:
        raise NotImplementedError(_FP8_NOT_DIFFERENTIABLE)
    outs = _fused(call, x, residual, gamma, post_gamma, bias, scale)
    # The post-norm's cotangent needs the sum over ranks, which the kernel
    # does not return: x is kept to form it again.
    kept_x = x if post_gamma.shape[0] else None
    return outs, (kept_x, outs[1], gamma, post_gamma, bias)


def _fused_bwd(call, saved, cotangents):
    x, residual_out, gamma, post_gamma, bias = saved
    f32 = jnp.float32
    g_out, g_residual_out = (c.astype(f32) for c in cotangents)
    v = residual_out.astype(f32)
    eps = call.eps
    # One row per vector here (a batch of them is vmap's business).
    row = lambda m: m[0] if m.shape[0] else None  # noqa: E731
    gamma32, post32, bias32 = row(gamma), row(post_gamma), row(bias)

    # The norm's transpose: the VJP of norm_tangent's linear map.
    _, vjp = jax.vjp(lambda dv, dg: norm_tangent(v, gamma32, dv, dg, eps),
                     jnp.zeros_like(v), jnp.zeros(gamma32.shape, f32))
    g_v, g_gamma = vjp(g_out)
    g_y = g_v + g_residual_out  # cotangent of the (post-normed) sum, and of the residual
    g_t, g_post = g_y, None
    if post32 is not None:
        # The float32 sum the kernel formed, formed again (one more
        # all-reduce, on the way back only).
        t = call.all_reduce(x.astype(f32))
        if bias32 is not None:
            t = t + bias32
        _, vjp = jax.vjp(lambda dt, dp: norm_tangent(t, post32, dt, dp, eps),
                         jnp.zeros_like(t), jnp.zeros(post32.shape, f32))
        g_t, g_post = vjp(g_y)
    g_bias = jnp.sum(g_t, axis=0) if bias32 is not None else None

    g_t = g_t.astype(call.x_dtype)  # cotangent of all_reduce(x)
    if call.vma:
        # all_reduce's transpose (as psum's): each rank's x gets the cotangent
        # of the invariant sum, marked varying.
        g_x = as_varying(g_t, call.axes)
    else:
        (g_x,) = all_reduce_p.bind(g_t, axes=call.axes, op="sum", algorithm=call.algorithm,
                                   comm_id=call.comm_id, world_size=call.world_size, vma=False)

    def like(g, primal):  # a cotangent shaped as its (1 or 0 row) primal
        if g is None:
            return jnp.zeros(primal.shape, primal.dtype)
        return g.reshape(primal.shape).astype(primal.dtype)

    grads = [g_y.astype(residual_out.dtype), like(g_gamma, gamma), like(g_post, post_gamma),
             like(g_bias, bias)]
    grads = [as_varying(g, call.axes) if varies else g for g, varies in zip(grads, call.varies)]
    return (g_x, *grads, None)


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

def _unfused(x, residual, gamma, post_gamma, bias, scale, *, reduce, eps, quantize):
    """The same math from separate ops: reduce(float32 x), then the rest in
    jnp (norm_math.fused_reference)."""
    y, residual_out = fused_reference(reduce(widen(x)), residual, gamma, eps,
                                      post_gamma, bias)
    out = quantize_fp8(y, scale) if quantize else y.astype(x.dtype)
    return out, residual_out


def _pair(x, residual, gamma, *, reduce, eps):
    """The pair algorithm="auto" may pick: jax_ar.all_reduce of x in x's
    dtype, then jax_ar.rms_norm with the residual (the sum is rounded to x's
    dtype before the residual is added, as the two calls do)."""
    out, residual_out = rms_norm_p.bind(reduce(x), residual, gamma, eps=eps)
    return out, residual_out


# ----------------------------------------------------------------------------
# Which path serves a call.

def composed(x, residual, gamma, post_gamma, bias, scale, reduce, eps, quantize):
    """jax_ar.all_reduce_rms_norm of checked operands as separate ops:
    reduce(float32 x) (an all-reduce over the call's axes) (+ bias), then
    the norms in jnp."""
    fn = functools.partial(_unfused, reduce=reduce, eps=eps, quantize=quantize)
    return _not_differentiable(fn, x, residual, gamma, post_gamma, bias, scale) if quantize \
        else fn(x, residual, gamma, post_gamma, bias, scale)


def run_norm(plan, x, residual, gamma, post_gamma, bias, scale, eps, quantize):
    """jax_ar.all_reduce_rms_norm of checked operands (gamma, post_gamma and
    bias float32 [H], the latter two optional) as `plan` (ops/plan.py:
    plan_norm) says: the fused kernel, the pair, or composed."""
    if plan.path != "fused":
        def reduce(v):
            return v if plan.reduce is None else run_all_reduce(plan.reduce, [v])[0]
        if plan.path == "pair":
            return _pair(x, residual, gamma, reduce=reduce, eps=eps)
        return composed(x, residual, gamma, post_gamma, bias, scale, reduce, eps, quantize)
    comm, axes = plan.comm, (plan.comm.axis_name,)
    vma = _compat.check_vma_enabled()
    varies = lambda a: vma and bool(set(axes) & _compat.varying_axes(jax.typeof(a)))  # noqa: E731
    hidden = x.shape[-1]
    absent = jnp.zeros((0, hidden), jnp.float32)
    matrices = [absent if v is None else v.reshape(1, hidden) for v in (gamma, post_gamma, bias)]
    call = _Call(axes=axes, algorithm=plan.kernel, comm_id=comm.comm_id,
                 world_size=comm.world_size, eps=eps, quantize=quantize, vma=vma,
                 varies=(varies(residual),) + tuple(varies(m) for m in matrices),
                 x_dtype=np.dtype(x.dtype))
    if vma:
        x = as_varying(x, axes)
    shape = x.shape
    rows = (-1, hidden)
    out, residual_out = _fused(call, x.reshape(rows), residual.reshape(rows), *matrices, scale)
    return out.reshape(shape), residual_out.reshape(shape)
