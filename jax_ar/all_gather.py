"""jax_ar.all_gather: the primitive, its rules, and the public function.

The primitive works on a canonical layout: every rank's operand becomes row
`rank` of a [world, ...] result. The public function moves that row
dimension to `axis` (and merges it into the next one when tiled), so every
form of jax.lax.all_gather reaches the same kernel.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
import jax.numpy as jnp

from . import _call_order, _compat, config
from .all_reduce import SUPPORTED_DTYPES, _as_varying, _check_axes, _communicator_for

__all__ = ["all_gather"]

# All-gather only moves bytes, so it takes more dtypes than the reductions.
GATHER_DTYPES = SUPPORTED_DTYPES + tuple(np.dtype(t) for t in (
    np.int8, np.uint8, np.bool_, np.int16, np.uint16, np.uint32, np.int64, np.uint64,
    np.float64, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2))

# The `to` values of jax.lax.all_gather that jax_ar serves.
TO_VALUES = ("varying", "invarying")

# Params: axis_name (one mesh axis), comm_id, world_size, vma (whether the
# enclosing shard_map tracks varying axes), invariant (the result no longer
# varies over the axis, as jax.lax.all_gather(..., to="invarying")).
all_gather_p = Primitive("jax_ar_all_gather")


def _abstract_eval(aval, *, axis_name, world_size, invariant, **_):
    out = aval.update(shape=(world_size,) + aval.shape)
    if invariant:
        return _compat.with_varying_axes(out, _compat.varying_axes(aval) - {axis_name})
    return out  # jax.lax.all_gather's default: varying in, varying out


all_gather_p.def_abstract_eval(_abstract_eval)


def _impl(*args, **params):
    raise ValueError("jax_ar.all_gather must be called inside jax.shard_map")


all_gather_p.def_impl(_impl)


def _lowering(ctx, x, *, axis_name, comm_id, world_size, vma, invariant):
    return _call_order.ffi_call_in_order(  # CPU: keeps calls in program order
        ctx, "jax_ar_all_gather", [x], comm_id=np.int64(comm_id))


# Not cacheable: each call must be lowered in place to be chained (_call_order.py).
mlir.register_lowering(all_gather_p, _lowering, cacheable=False)


def _transpose(ct, x, *, axis_name, comm_id, world_size, vma, invariant):
    del x
    ct = ad.instantiate_zeros(ct)
    if invariant:
        # Every rank holds the same cotangent; rank j's input fed row j only
        # (the rule of jax.lax.all_gather_invariant).
        return (ct[jax.lax.axis_index(axis_name)],)
    # Rank r's row j went to every rank: it receives the sum of their
    # cotangents' row j, i.e. a reduce-scatter.
    from .reduce_scatter import reduce_scatter_p

    if vma:
        ct = _as_varying(ct, (axis_name,))
    return (reduce_scatter_p.bind(ct, axis_name=axis_name, op="sum", comm_id=comm_id,
                                  world_size=world_size, vma=vma),)


ad.primitive_transposes[all_gather_p] = _transpose


def _jvp(primals, tangents, **params):
    (x,), (t,) = primals, tangents  # linear: the tangent goes the same way
    return all_gather_p.bind(x, **params), all_gather_p.bind(ad.instantiate_zeros(t), **params)


ad.primitive_jvps[all_gather_p] = _jvp


def _batch(args, dims, **params):
    # The new row dimension goes in front, so the batch dimension moves by one.
    (x,), (d,) = args, dims
    return all_gather_p.bind(x, **params), d + 1


batching.primitive_batchers[all_gather_p] = _batch


def gather_rows(x, axis_name, comm, invariant):
    """[world, ...]: row j is rank j's `x`. x must already vary over the
    axis when check_vma is on."""
    vma = _compat.check_vma_enabled()
    if x.size == 0:  # nothing to exchange: an empty array of the result's type
        if not (invariant and vma):
            return jnp.broadcast_to(x[None], (comm.world_size,) + x.shape)
        out = jnp.zeros((comm.world_size,) + x.shape, x.dtype)
        varying = tuple(sorted(_compat.varying_axes(jax.typeof(x)) - {axis_name}))
        return _compat.pcast_to_varying(out, varying) if varying else out
    return all_gather_p.bind(x, axis_name=axis_name, comm_id=comm.comm_id,
                             world_size=comm.world_size, vma=vma, invariant=invariant and vma)


def all_gather(x, axis_name, axis=0, tiled=False, to="varying"):
    """Like jax.lax.all_gather inside jax.shard_map: every rank's `x`, in rank
    order along mesh axis `axis_name`, stacked in a new dimension `axis`
    (tiled: concatenated along existing dimension `axis`). The result varies
    over the axis like jax.lax.all_gather's; to="invarying" makes it
    invariant (jax.lax.all_gather(..., to="invarying")). x: array or pytree."""
    axes = _check_axes(axis_name, "jax_ar.all_gather")
    if len(axes) > 1:
        raise NotImplementedError(
            "jax_ar.all_gather over several mesh axes is not supported; use "
            "jax.lax.all_gather, or jax_ar.all_gather over the intra-host axis")
    name = axes[0]
    if not isinstance(tiled, (bool, np.bool_)):
        raise TypeError(f"jax_ar.all_gather: tiled must be a bool, got {tiled!r}")
    if to not in TO_VALUES:
        raise ValueError(f"jax_ar.all_gather: to must be one of {TO_VALUES}, got {to!r}")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"jax_ar.all_gather: axis must be an int, got {axis!r}")
    comm = _communicator_for(axes, "jax_ar.all_gather")
    size = jax.sharding.get_abstract_mesh().shape[name]
    vma = _compat.check_vma_enabled()

    def one(leaf):
        dtype = getattr(leaf, "dtype", None)
        if dtype is None or np.dtype(dtype) not in GATHER_DTYPES:
            raise TypeError(f"jax_ar.all_gather: unsupported dtype {dtype} (supported: "
                            f"{', '.join(str(d) for d in GATHER_DTYPES)})")
        ndim = np.ndim(leaf)
        out_ndim = ndim if tiled else ndim + 1
        if not -out_ndim <= axis < out_ndim:
            raise ValueError(f"jax_ar.all_gather: axis {axis} is out of range for an operand "
                             f"of shape {np.shape(leaf)} with tiled={tiled}")
        d = int(axis) % out_ndim
        if not comm.serves_calls:
            config.log_once(("psum", comm.comm_id, "all_gather"),
                            f"jax_ar: all_gather over {name!r} lowers to jax.lax.all_gather: "
                            f"{comm.fallback_reason or 'closed'}")
            return jax.lax.all_gather(leaf, name, axis=d, tiled=tiled, to=to)
        if vma:
            leaf = _as_varying(leaf, (name,))
        rows = gather_rows(leaf, name, comm, invariant=to == "invarying")
        out = jnp.moveaxis(rows, 0, d)
        if tiled:  # [.., world, n_d, ..] -> [.., world * n_d, ..]
            out = out.reshape(out.shape[:d] + (size * out.shape[d + 1],) + out.shape[d + 2:])
        return out

    return jax.tree_util.tree_map(one, x)
