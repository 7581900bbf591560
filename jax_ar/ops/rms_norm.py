"""The rms_norm primitives: fused (residual add +) RMSNorm with a CPU and a CUDA kernel.

Two primitives:

* `rms_norm_p` is what the public function binds. It carries the rules that
  act on whole arrays: abstract eval, batching, differentiation (a JVP whose
  tangent is plain jnp, so reverse mode comes from JAX's transposition) and
  the sharding rule. Its lowering is a `custom_partitioning` call: in plain
  jit on sharded arrays the leading (row) dimensions keep their sharding and
  the last (hidden) dimension is gathered; inside shard_map, where every
  axis is manual, it lowers straight to the kernel.
* `_kernel_p` is one kernel call on local data: the FFI targets
  `jax_ar_rms_norm` (x, gamma -> out) and `jax_ar_add_rms_norm` (x, residual,
  gamma -> out, residual_out), attribute eps:f32. Shapes the CUDA kernel does
  not serve (or a build without the CUDA module) lower to the same math in
  jnp instead.

gamma is float32 [H] (scale_offset already added: norm_math.scale_vector);
the residual is of x's dtype or float32 (`kernel_takes_residual`), and
residual_out has the residual's dtype. The arithmetic is norm_math.py's.
"""
from __future__ import annotations

import functools

import numpy as np

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.sharding import NamedSharding, PartitionSpec as P

from .. import _compat, _native, config
from ..config import Reason
from .norm_math import norm_tangent, reference

__all__ = ["SUPPORTED_DTYPES", "fused_refuses", "kernel_takes_residual", "module_serves",
           "pair_refuses", "rms_norm_p", "rms_norm_refuses"]

SUPPORTED_DTYPES = tuple(np.dtype(t) for t in (jnp.float32, jnp.bfloat16, jnp.float16))
_F32 = np.dtype(np.float32)
_NORM_TODO = "docs/rms_norm.md lists the rows and dtypes the kernels take"


# Operands: (x, gamma) or (x, residual, gamma) -- the FFI targets' order.
# Results: [out] or [out, residual_out]. Param: eps (float).
rms_norm_p = Primitive("jax_ar_rms_norm")
rms_norm_p.multiple_results = True
_kernel_p = Primitive("jax_ar_rms_norm_kernel")
_kernel_p.multiple_results = True


def _abstract_eval(*avals, eps):
    del eps
    # Elementwise over rows: the results vary over every axis an operand does.
    varying = frozenset().union(*(_compat.varying_axes(a) for a in avals))
    out = _compat.with_varying_axes(avals[0].update(weak_type=False), varying)
    if len(avals) == 2:
        return [out]
    residual_out = _compat.with_varying_axes(avals[1].update(weak_type=False), varying)
    return [out, residual_out]


rms_norm_p.def_abstract_eval(_abstract_eval)
_kernel_p.def_abstract_eval(_abstract_eval)


@functools.lru_cache(maxsize=None)
def _jitted_bind(eps):
    return jax.jit(functools.partial(rms_norm_p.bind, eps=eps))


rms_norm_p.def_impl(lambda *args, eps: _jitted_bind(eps)(*args))


def _reference_from_operands(*args, eps):
    x, gamma = args[0], args[-1]
    return reference(x, gamma, eps, args[1] if len(args) == 3 else None)


# ----------------------------------------------------------------------------
# Kernel lowering, per platform.

def _target(num_operands) -> str:
    return "jax_ar_add_rms_norm" if num_operands == 3 else "jax_ar_rms_norm"


def _kernel_lowering(platform):
    def rule(ctx, *args, eps):
        target = _target(len(args))
        residual = ctx.avals_in[1] if len(args) == 3 else None
        reason = rms_norm_refuses(platform, ctx.avals_in[0], residual)
        if reason is not None:
            config.report("jax_ar.rms_norm", None, f"XLA's own ops on {platform}",
                          Reason(reason, _NORM_TODO))
            return mlir.lower_fun(_reference_from_operands, multiple_results=True)(
                ctx, *args, eps=eps)
        return jax.ffi.ffi_lowering(target)(ctx, *args, eps=np.float32(eps))
    return rule


mlir.register_lowering(_kernel_p, mlir.lower_fun(_reference_from_operands, multiple_results=True))
mlir.register_lowering(_kernel_p, _kernel_lowering("cpu"), platform="cpu")
mlir.register_lowering(_kernel_p, _kernel_lowering("gpu"), platform="cuda")


# ----------------------------------------------------------------------------
# What the kernels take: asked by the plans (ops/plan.py) and by the lowering.

def kernel_takes_residual(x_dtype, residual_dtype) -> str | None:
    """Why the norm kernels (both backends, both norms) do not take a
    residual of this dtype beside x, or None: they read it in x's dtype or
    in float32 (a float32 residual stream beside 16-bit activations)."""
    x_dtype, residual_dtype = np.dtype(x_dtype), np.dtype(residual_dtype)
    if residual_dtype in (x_dtype, _F32):
        return None
    return (f"the kernels read the residual in x's dtype or float32, not {residual_dtype} "
            f"beside {x_dtype}")


def _cuda_serves(aval) -> str | None:
    """Why the CUDA kernel cannot serve rows like `aval`'s, or None."""
    # The kernel loads 16-byte vectors and keeps a row in registers: the
    # CUDA module says how many vectors a row may have.
    limits = _native.limits("gpu")
    itemsize = np.dtype(aval.dtype).itemsize
    hidden = aval.shape[-1]
    vector = limits["vector_bytes"] // itemsize
    longest = limits["rms_norm_max_row_vectors"]
    if hidden % vector:
        return f"hidden size {hidden} is not a multiple of {vector} for {aval.dtype}"
    if not 0 < hidden // vector <= longest:
        return f"hidden size {hidden} is above {vector * longest} for {aval.dtype}"
    return None


def rms_norm_refuses(platform, x, residual=None) -> str | None:
    """Why rms_norm's kernel of `platform` would not serve x (and residual),
    or None: what `_kernel_lowering` decides, and what all_reduce_rms_norm's
    plan asks before it takes the pair."""
    reason = module_serves(platform, _target(2 if residual is None else 3))
    if reason is None and residual is not None:
        reason = kernel_takes_residual(x.dtype, residual.dtype)
    if reason is None and platform == "gpu":
        reason = _cuda_serves(x)
    return reason


def module_serves(platform, target) -> str | None:
    """Why the compiled module of `platform` cannot run `target`, or None."""
    try:
        targets = _native.targets(platform)
    except RuntimeError as e:
        return str(e)
    if target not in targets:
        return f"this build's {platform} module has no FFI target {target}"
    return None


def fused_refuses(x, residual, comm) -> Reason | None:
    """Why the fused kernels (the compiled module's limits and its
    workspace rounds) do not take x's rows and this residual, or None."""
    limits = _native.limits(comm.platform)
    low, high = limits["fused_min_hidden"], limits["fused_max_hidden"]
    hidden, itemsize = x.shape[-1], np.dtype(x.dtype).itemsize
    vector = limits["vector_bytes"] // itemsize
    if not low <= hidden <= high:
        return Reason(f"hidden size {hidden} is outside the fused kernel's [{low}, {high}]",
                      "pad the hidden dimension" if hidden < low else "")
    if hidden % vector:
        return Reason(f"hidden size {hidden} is not a multiple of {vector} for "
                      f"{np.dtype(x.dtype)}", "pad the hidden dimension")
    residual_refused = kernel_takes_residual(x.dtype, residual.dtype)
    if residual_refused:
        return Reason(residual_refused, "cast the residual to x's dtype or float32")
    # A float32 residual beside 16-bit x takes twice x's bytes through the workspace.
    wide = np.dtype(residual.dtype) == _F32 and np.dtype(x.dtype) != _F32
    row_bytes = hidden * itemsize
    longest = comm.capacity_bytes("max_fused_row_bytes_f32_residual" if wide
                                  else "max_fused_row_bytes")
    if row_bytes > longest:
        return Reason(f"one row of {row_bytes} bytes does not fit a round of the workspace "
                      f"(workspace_bytes={comm.workspace_bytes}, {comm.world_size} ranks)",
                      "pass a larger workspace_bytes to jax_ar.setup")
    return None


def pair_refuses(x, residual, extras, quantize, comm) -> str | None:
    """Why the pair (all_reduce, then the rms_norm kernel) cannot stand in
    for the fused kernel here, or None."""
    if quantize or extras:
        return "the pair has no FP8 output, post-norm or bias"
    if np.dtype(x.dtype) == np.float16:
        # The pair rounds the sum over ranks to x's dtype before the residual
        # is added: float16's range (65504) can overflow where the float32
        # sum the fused contract adds cannot.
        return "the pair would round the sum over ranks to float16"
    mesh = jax.sharding.get_abstract_mesh()
    if set(getattr(mesh, "manual_axes", ())) != set(mesh.axis_names):
        return "rms_norm's kernel call is partitioned where shard_map leaves axes automatic"
    return rms_norm_refuses(comm.platform, x, residual)


# ----------------------------------------------------------------------------
# Sharding: rows keep their sharding, the hidden dimension is gathered.

def _row_sharding(sharding, ndim):
    spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
    return NamedSharding(sharding.mesh, P(*spec[:ndim - 1], None))


def _shardings(mesh, arg_shapes):
    x = arg_shapes[0]
    if isinstance(x.sharding, NamedSharding):
        rows = _row_sharding(x.sharding, len(x.shape))
    else:  # no mesh to name axes with: compute replicated
        rows = NamedSharding(mesh, P())
    gamma = NamedSharding(rows.mesh, P())
    args = (rows,) * (len(arg_shapes) - 1) + (gamma,)
    outs = (rows,) * (2 if len(arg_shapes) == 3 else 1)
    return args, outs


def _partition(eps, mesh, arg_shapes, result_shape):
    del result_shape
    arg_shardings, out_shardings = _shardings(mesh, arg_shapes)

    def lower_fn(*args):
        return tuple(_kernel_p.bind(*args, eps=eps))

    return mesh, lower_fn, out_shardings, arg_shardings


def _infer_sharding(eps, mesh, arg_shapes, result_shape):
    del eps, result_shape
    return _shardings(mesh, arg_shapes)[1]


def _kernel_call(eps, *args):
    return tuple(_kernel_p.bind(*args, eps=eps))


def _norm_call(eps, x, gamma):
    return _kernel_call(eps, x, gamma)


def _add_norm_call(eps, x, residual, gamma):
    return _kernel_call(eps, x, residual, gamma)


_partitioned = {}
for _fn, _rule in ((_norm_call, "... h, h -> ... h"),
                   (_add_norm_call, "... h, ... h, h -> ... h, ... h")):
    _cp = custom_partitioning(_fn, static_argnums=(0,))
    _cp.def_partition(partition=_partition, infer_sharding_from_operands=_infer_sharding,
                      sharding_rule=_rule, need_replication_factors=("h",))
    _partitioned[_fn.__code__.co_argcount - 1] = _cp


def _lowering(ctx, *args, eps):
    call = _partitioned[len(args)]
    # Without a mesh (has_mesh False) _shardings computes replicated.
    with _compat.partitioning_mesh(ctx):
        return mlir.lower_fun(lambda *a: list(call(eps, *a)), multiple_results=True)(ctx, *args)


# custom_partitioning reads the device assignment while lowering: jit must
# provide it, and a cached (device-independent) lowering would not see it.
mlir.register_lowering(rms_norm_p, _lowering, cacheable=False)
_compat.requires_devices_during_lowering(rms_norm_p)


# ----------------------------------------------------------------------------
# Batching and differentiation.

def _batch(args, dims, *, eps):
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    moved = [jnp.moveaxis(a, d, 0) if d is not None else None for a, d in zip(args, dims)]
    if dims[-1] is not None:
        # A batch of gammas: rows no longer share one gamma; XLA's own ops
        # serve it, gamma broadcast over each batch member's rows.
        config.report("jax_ar.rms_norm", None, "XLA's own ops",
                      Reason("a gamma per batch member under vmap",
                             "share one gamma across the batch to use the kernel"))
        x = moved[0] if moved[0] is not None else jnp.broadcast_to(args[0], (size,) + args[0].shape)
        gamma = moved[-1].reshape((size,) + (1,) * (x.ndim - 2) + moved[-1].shape[-1:])
        residual = None
        if len(args) == 3:
            residual = moved[1] if moved[1] is not None else args[1]
        return reference(x, gamma, eps, residual), [0] * (len(args) - 1)
    # Rows are independent: the batch dimension becomes one more leading dim.
    operands = [m if m is not None else jnp.broadcast_to(a, (size,) + a.shape)
                for a, m in zip(args[:-1], moved[:-1])]
    return rms_norm_p.bind(*operands, args[-1], eps=eps), [0] * (len(args) - 1)


batching.primitive_batchers[rms_norm_p] = _batch


def _jvp(primals, tangents, *, eps):
    outs = rms_norm_p.bind(*primals, eps=eps)
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    x, gamma = primals[0], primals[-1]
    f32 = jnp.float32
    dv = tangents[0].astype(f32)
    if len(primals) == 3:
        dv = dv + tangents[1].astype(f32)
        v = outs[1].astype(f32)  # the norm reads the stored residual stream
    else:
        v = x.astype(f32)
    dout = norm_tangent(v, gamma.astype(f32), dv, tangents[-1].astype(f32), eps)
    out_tangents = [dout.astype(x.dtype)]
    if len(primals) == 3:
        out_tangents.append(dv.astype(primals[1].dtype))
    return outs, out_tangents


ad.primitive_jvps[rms_norm_p] = _jvp


