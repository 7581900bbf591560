"""The reduce_scatter and all_gather primitives: each other's transpose, so
one family in one file.

Both work on a canonical layout. reduce_scatter's operand is [world, ...]
and rank j's result is row j reduced over the ranks, in rank order (the
same arithmetic as all_reduce: float32 accumulation for 16-bit floats, one
rounding). all_gather's result is [world, ...] with row j from rank j.
`reduce_scatter_leaf` and `all_gather_leaf` move the user's dimension to
the front and back, so every form of jax.lax.psum_scatter and
jax.lax.all_gather reaches the same kernels.

reduce_scatter params: axis_name (one mesh axis), op ("sum" | "max" |
"min"; the public function only sums, multi_axis.py uses the others),
comm_id, world_size, vma (whether the enclosing shard_map tracks varying
axes). all_gather params: axis_name, comm_id, world_size, vma, invariant
(the result no longer varies over the axis, as jax.lax.all_gather(...,
to="invarying")).
"""
from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax.interpreters import ad, batching

from .. import _compat
from .._native import OP_CODES
from ._axes import as_varying
from ._primitive import collective_primitive

__all__ = ["all_gather_leaf", "all_gather_p", "gather_rows", "reduce_scatter_leaf",
           "reduce_scatter_p", "scatter_rows"]


# ----------------------------------------------------------------------------
# reduce_scatter

def _scatter_abstract_eval(aval, *, world_size, **_):
    if aval.ndim == 0 or aval.shape[0] != world_size:
        raise ValueError(f"jax_ar_reduce_scatter: operand {aval.str_short()} must have a "
                         f"leading dimension of {world_size}")
    # Like psum_scatter: the result still varies over the axis (row j on rank j).
    return aval.update(shape=aval.shape[1:])


def _scatter_attributes(*, comm_id, op, **_):
    return dict(comm_id=np.int64(comm_id), op=np.int32(OP_CODES[op]))


reduce_scatter_p = collective_primitive("jax_ar_reduce_scatter", "reduce_scatter",
                                        _scatter_abstract_eval, _scatter_attributes,
                                        axis_of=lambda params: params["axis_name"])


def _scatter_jvp(primals, tangents, **params):
    if params["op"] != "sum":
        raise NotImplementedError(
            f"jax_ar: a reduce_scatter with op={params['op']!r} is not differentiable "
            "(neither is jax.lax.pmax/pmin)")
    (x,), (t,) = primals, tangents
    return reduce_scatter_p.bind(x, **params), reduce_scatter_p.bind(ad.instantiate_zeros(t),
                                                                     **params)


def _scatter_transpose(ct, x, *, axis_name, op, comm_id, world_size, vma):
    # Rank j's result is the sum of every rank's row j, so rank r's row j
    # receives rank j's cotangent: an all-gather (psum_scatter's rule).
    del x
    assert op == "sum", op  # the JVP refuses the other ops
    ct = ad.instantiate_zeros(ct)
    if vma:
        ct = as_varying(ct, (axis_name,))
    return (all_gather_p.bind(ct, axis_name=axis_name, comm_id=comm_id, world_size=world_size,
                              vma=vma, invariant=False),)


def _scatter_batch(args, dims, **params):
    # The rank dimension stays in front; the batch dimension goes right
    # behind it and comes out in front of the result.
    (x,), (d,) = args, dims
    return reduce_scatter_p.bind(jnp.moveaxis(x, d, 1), **params), 0


ad.primitive_jvps[reduce_scatter_p] = _scatter_jvp
ad.primitive_transposes[reduce_scatter_p] = _scatter_transpose
batching.primitive_batchers[reduce_scatter_p] = _scatter_batch


def scatter_rows(x, axis_name, op, comm):
    """Rank j gets row j of `x` ([world, ...]) reduced over the ranks of
    `comm`'s axis. x must already vary over the axis when check_vma is on."""
    if x.size == 0:  # nothing to exchange: a constant of the result's type
        empty = jnp.zeros(x.shape[1:], x.dtype)
        varying = tuple(sorted(_compat.varying_axes(jax.typeof(x))))
        return _compat.pcast_to_varying(empty, varying) if varying else empty
    return reduce_scatter_p.bind(x, axis_name=axis_name, op=op, comm_id=comm.comm_id,
                                 world_size=comm.world_size, vma=_compat.check_vma_enabled())


def reduce_scatter_leaf(leaf, axis, dimension, tiled, comm):
    """jax.lax.psum_scatter(leaf, axis, scatter_dimension=dimension,
    tiled=tiled) through jax_ar's kernel (arguments checked, the plan made:
    `comm` serves)."""
    if _compat.check_vma_enabled():
        leaf = as_varying(leaf, (axis,))
    rows = jnp.moveaxis(leaf, dimension, 0)
    if tiled:
        size = comm.world_size
        rows = rows.reshape((size, rows.shape[0] // size) + rows.shape[1:])
    mine = scatter_rows(rows, axis, "sum", comm)
    return jnp.moveaxis(mine, 0, dimension) if tiled else mine


# ----------------------------------------------------------------------------
# all_gather

def _gather_abstract_eval(aval, *, axis_name, world_size, invariant, **_):
    out = aval.update(shape=(world_size,) + aval.shape)
    if invariant:
        return _compat.with_varying_axes(out, _compat.varying_axes(aval) - {axis_name})
    return out  # jax.lax.all_gather's default: varying in, varying out


def _gather_attributes(*, comm_id, **_):
    return dict(comm_id=np.int64(comm_id))


all_gather_p = collective_primitive("jax_ar_all_gather", "all_gather", _gather_abstract_eval,
                                    _gather_attributes, axis_of=lambda params: params["axis_name"])


def _gather_transpose(ct, x, *, axis_name, comm_id, world_size, vma, invariant):
    del x
    ct = ad.instantiate_zeros(ct)
    if invariant:
        # Every rank holds the same cotangent; rank j's input fed row j only
        # (the rule of jax.lax.all_gather_invariant).
        return (ct[jax.lax.axis_index(axis_name)],)
    # Rank r's row j went to every rank: it receives the sum of their
    # cotangents' row j, i.e. a reduce-scatter.
    if vma:
        ct = as_varying(ct, (axis_name,))
    return (reduce_scatter_p.bind(ct, axis_name=axis_name, op="sum", comm_id=comm_id,
                                  world_size=world_size, vma=vma),)


def _gather_jvp(primals, tangents, **params):
    (x,), (t,) = primals, tangents  # linear: the tangent goes the same way
    return all_gather_p.bind(x, **params), all_gather_p.bind(ad.instantiate_zeros(t), **params)


def _gather_batch(args, dims, **params):
    # The new row dimension goes in front, so the batch dimension moves by one.
    (x,), (d,) = args, dims
    return all_gather_p.bind(x, **params), d + 1


ad.primitive_transposes[all_gather_p] = _gather_transpose
ad.primitive_jvps[all_gather_p] = _gather_jvp
batching.primitive_batchers[all_gather_p] = _gather_batch


def gather_rows(x, axis_name, comm, invariant):
    """[world, ...]: row j is rank j's `x`. x must already vary over the
    axis when check_vma is on."""
    vma = _compat.check_vma_enabled()
    if x.size == 0:
        # Nothing to exchange: a constant of the result's type. Not computed
        # from x, so that no zero-size parameter stays alive in the program:
        # XLA:GPU's compiler crashed on such programs (docs/gpu.md).
        out = jnp.zeros((comm.world_size,) + x.shape, x.dtype)
        varying = _compat.varying_axes(jax.typeof(x))
        if invariant and vma:
            varying = varying - {axis_name}
        varying = tuple(sorted(varying))
        return _compat.pcast_to_varying(out, varying) if varying else out
    return all_gather_p.bind(x, axis_name=axis_name, comm_id=comm.comm_id,
                             world_size=comm.world_size, vma=vma, invariant=invariant and vma)


def all_gather_leaf(leaf, axis, dimension, tiled, to, comm):
    """jax.lax.all_gather(leaf, axis, axis=dimension, tiled=tiled, to=to)
    through jax_ar's kernel (arguments checked, the plan made: `comm`
    serves)."""
    if _compat.check_vma_enabled():
        leaf = as_varying(leaf, (axis,))
    rows = gather_rows(leaf, axis, comm, invariant=to == "invarying")
    out = jnp.moveaxis(rows, 0, dimension)
    if tiled:  # [.., world, n_d, ..] -> [.., world * n_d, ..]
        d = dimension
        out = out.reshape(out.shape[:d] + (comm.world_size * out.shape[d + 1],) + out.shape[d + 2:])
    return out
