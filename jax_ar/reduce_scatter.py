"""jax_ar.reduce_scatter: the primitive, its rules, and the public function.

The primitive works on a canonical layout: its operand is [world, ...] and
rank j's result is row j reduced over the ranks, in rank order (the same
arithmetic as all_reduce: float32 accumulation for 16-bit floats, one
rounding). The public function moves `scatter_dimension` to the front and
back, so any dimension and both tiled forms reach the same kernel.
"""
from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from . import _call_order, _compat, config
from ._native import OP_CODES
from .all_reduce import SUPPORTED_DTYPES, _as_varying, _check_axes, _communicator_for

__all__ = ["reduce_scatter"]

# Params: axis_name (one mesh axis), op ("sum" | "max" | "min"; the public
# function only sums, hierarchical.py uses the others), comm_id, world_size,
# vma (whether the enclosing shard_map tracks varying axes).
reduce_scatter_p = Primitive("jax_ar_reduce_scatter")


def _abstract_eval(aval, *, world_size, **_):
    if aval.ndim == 0 or aval.shape[0] != world_size:
        raise ValueError(f"jax_ar_reduce_scatter: operand {aval.str_short()} must have a "
                         f"leading dimension of {world_size}")
    # Like psum_scatter: the result still varies over the axis (row j on rank j).
    return aval.update(shape=aval.shape[1:])


reduce_scatter_p.def_abstract_eval(_abstract_eval)


def _impl(*args, **params):
    raise ValueError("jax_ar.reduce_scatter must be called inside jax.shard_map")


reduce_scatter_p.def_impl(_impl)


def _lowering(ctx, x, *, axis_name, op, comm_id, world_size, vma):
    return _call_order.ffi_call_in_order(  # CPU: keeps calls in program order
        ctx, "jax_ar_reduce_scatter", [x], comm_id=np.int64(comm_id), op=np.int32(OP_CODES[op]))


# Not cacheable: each call must be lowered in place to be chained (_call_order.py).
mlir.register_lowering(reduce_scatter_p, _lowering, cacheable=False)


def _jvp(primals, tangents, **params):
    if params["op"] != "sum":
        raise NotImplementedError(
            f"jax_ar: a reduce_scatter with op={params['op']!r} is not differentiable "
            "(neither is jax.lax.pmax/pmin)")
    (x,), (t,) = primals, tangents
    return reduce_scatter_p.bind(x, **params), reduce_scatter_p.bind(ad.instantiate_zeros(t),
                                                                     **params)


ad.primitive_jvps[reduce_scatter_p] = _jvp


def _transpose(ct, x, *, axis_name, op, comm_id, world_size, vma):
    # Rank j's result is the sum of every rank's row j, so rank r's row j
    # receives rank j's cotangent: an all-gather (psum_scatter's rule).
    from .all_gather import all_gather_p

    del x
    assert op == "sum", op  # the JVP refuses the other ops
    ct = ad.instantiate_zeros(ct)
    if vma:
        ct = _as_varying(ct, (axis_name,))
    return (all_gather_p.bind(ct, axis_name=axis_name, comm_id=comm_id, world_size=world_size,
                              vma=vma, invariant=False),)


ad.primitive_transposes[reduce_scatter_p] = _transpose


def _batch(args, dims, **params):
    # The rank dimension stays in front; the batch dimension goes right
    # behind it and comes out in front of the result.
    (x,), (d,) = args, dims
    return reduce_scatter_p.bind(jnp.moveaxis(x, d, 1), **params), 0


batching.primitive_batchers[reduce_scatter_p] = _batch


def scatter_rows(x, axis_name, op, comm):
    """Rank j gets row j of `x` ([world, ...]) reduced over the ranks of
    `comm`'s axis. x must already vary over the axis when check_vma is on."""
    if x.size == 0:  # nothing to exchange: a constant of the result's type
        empty = jnp.zeros(x.shape[1:], x.dtype)
        varying = tuple(sorted(_compat.varying_axes(jax.typeof(x))))
        return _compat.pcast_to_varying(empty, varying) if varying else empty
    return reduce_scatter_p.bind(x, axis_name=axis_name, op=op, comm_id=comm.comm_id,
                                 world_size=comm.world_size, vma=_compat.check_vma_enabled())


def reduce_scatter(x, axis_name, scatter_dimension=0, tiled=False):
    """Like jax.lax.psum_scatter inside jax.shard_map: the sum over mesh axis
    `axis_name`, of which rank j keeps block j along `scatter_dimension`.
    Untiled, that dimension must equal the axis size and is removed; tiled,
    it must be a multiple of it and shrinks by that factor. The result
    varies over the axis. x: array or pytree of arrays."""
    axes = _check_axes(axis_name, "jax_ar.reduce_scatter")
    if len(axes) > 1:
        raise NotImplementedError(
            "jax_ar.reduce_scatter over several mesh axes is not supported; use "
            "jax.lax.psum_scatter, or jax_ar.reduce_scatter over the intra-host axis")
    axis = axes[0]
    if not isinstance(tiled, (bool, np.bool_)):
        raise TypeError(f"jax_ar.reduce_scatter: tiled must be a bool, got {tiled!r}")
    comm = _communicator_for(axes, "jax_ar.reduce_scatter")
    size = jax.sharding.get_abstract_mesh().shape[axis]
    vma = _compat.check_vma_enabled()

    def one(leaf):
        dtype = getattr(leaf, "dtype", None)
        if dtype is None or np.dtype(dtype) not in SUPPORTED_DTYPES:
            raise TypeError(f"jax_ar.reduce_scatter: unsupported dtype {dtype} (supported: "
                            f"{', '.join(str(d) for d in SUPPORTED_DTYPES)})")
        ndim = np.ndim(leaf)
        if isinstance(scatter_dimension, bool) or not isinstance(scatter_dimension,
                                                                 (int, np.integer)):
            raise TypeError(f"jax_ar.reduce_scatter: scatter_dimension must be an int, got "
                            f"{scatter_dimension!r}")
        if not -ndim <= scatter_dimension < ndim:
            raise ValueError(f"jax_ar.reduce_scatter: scatter_dimension {scatter_dimension} is "
                             f"out of range for an operand of shape {np.shape(leaf)}")
        d = int(scatter_dimension) % ndim
        length = np.shape(leaf)[d]
        if tiled and length % size:
            raise ValueError(f"jax_ar.reduce_scatter: dimension {d} of the operand (size "
                             f"{length}) must be a multiple of the size of axis {axis!r} "
                             f"({size}) with tiled=True")
        if not tiled and length != size:
            raise ValueError(f"jax_ar.reduce_scatter: dimension {d} of the operand (size "
                             f"{length}) must equal the size of axis {axis!r} ({size}); pass "
                             "tiled=True to scatter blocks of a longer dimension")
        if not comm.serves_calls:
            config.log_once(("psum", comm.comm_id, "reduce_scatter"),
                            f"jax_ar: reduce_scatter over {axis!r} lowers to "
                            f"jax.lax.psum_scatter: {comm.fallback_reason or 'closed'}")
            return jax.lax.psum_scatter(leaf, axis, scatter_dimension=d, tiled=tiled)
        if vma:
            leaf = _as_varying(leaf, (axis,))
        rows = jnp.moveaxis(leaf, d, 0)
        if tiled:
            rows = rows.reshape((size, length // size) + rows.shape[1:])
        mine = scatter_rows(rows, axis, "sum", comm)
        return jnp.moveaxis(mine, 0, d) if tiled else mine

    return jax.tree_util.tree_map(one, x)
