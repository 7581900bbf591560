"""The public collectives, drop-ins for their lax counterparts inside
jax.shard_map: argument checks, then the primitives of ops/."""
from __future__ import annotations

import numpy as np

import jax

from . import config
from .ops._axes import REDUCE_DTYPES, check_axes, check_dtype, communicator_for
from .ops.all_reduce import reduce_leaves
from .ops.multi_axis import all_reduce_over_axes
from .ops.scatter_gather import GATHER_DTYPES, all_gather_leaf, reduce_scatter_leaf

__all__ = ["all_gather", "all_reduce", "reduce_scatter"]

OPS = ("sum", "avg", "max", "min")

# The `to` values of jax.lax.all_gather that jax_ar serves.
TO_VALUES = ("varying", "invarying")


def all_reduce(x, axis_name, op="sum", algorithm="auto"):
    """All-reduce `x` (an array or pytree of arrays) over mesh axis `axis_name`
    inside jax.shard_map. Same result as psum/pmean/pmax/pmin, invariant over
    the axis. op: "sum" | "avg" | "max" | "min"; algorithm: "auto" |
    "oneshot" | "twoshot" | "psum". "avg" of int32 returns float32, as pmean.
    """
    what = "jax_ar.all_reduce"
    if not isinstance(op, str) or op not in OPS:
        raise ValueError(f"{what}: op must be one of {OPS}, got {op!r}")
    if not isinstance(algorithm, str) or algorithm not in config.ALGORITHMS:
        raise ValueError(f"{what}: algorithm must be one of {config.ALGORITHMS}, "
                         f"got {algorithm!r}")
    axes = check_axes(axis_name, what)
    if len(set(axes)) != len(axes):
        raise ValueError(f"{what}: axis_name names an axis twice: {axis_name!r}")
    leaves, treedef = jax.tree_util.tree_flatten(x)
    for leaf in leaves:
        check_dtype(what, leaf, REDUCE_DTYPES)
    if algorithm == "auto":
        algorithm = config.algorithm_override() or "auto"
    if len(axes) > 1:  # jax_ar inside a host, psum across hosts
        out = all_reduce_over_axes(leaves, axes, op, algorithm)
    else:
        out = reduce_leaves(leaves, axes, op, algorithm, communicator_for(axes[0], what))
    return jax.tree_util.tree_unflatten(treedef, out)


def reduce_scatter(x, axis_name, scatter_dimension=0, tiled=False):
    """Like jax.lax.psum_scatter inside jax.shard_map: the sum over mesh axis
    `axis_name`, of which rank j keeps block j along `scatter_dimension`.
    Untiled, that dimension must equal the axis size and is removed; tiled,
    it must be a multiple of it and shrinks by that factor. The result
    varies over the axis. x: array or pytree of arrays."""
    what = "jax_ar.reduce_scatter"
    axes = check_axes(axis_name, what)
    if len(axes) > 1:
        raise NotImplementedError(
            "jax_ar.reduce_scatter over several mesh axes is not supported; use "
            "jax.lax.psum_scatter, or jax_ar.reduce_scatter over the intra-host axis")
    axis = axes[0]
    if not isinstance(tiled, (bool, np.bool_)):
        raise TypeError(f"{what}: tiled must be a bool, got {tiled!r}")
    if isinstance(scatter_dimension, bool) or not isinstance(scatter_dimension,
                                                             (int, np.integer)):
        raise TypeError(f"{what}: scatter_dimension must be an int, got "
                        f"{scatter_dimension!r}")
    comm = communicator_for(axis, what)
    size = jax.sharding.get_abstract_mesh().shape[axis]

    def one(leaf):
        check_dtype(what, leaf, REDUCE_DTYPES)
        ndim = np.ndim(leaf)
        if not -ndim <= scatter_dimension < ndim:
            raise ValueError(f"{what}: scatter_dimension {scatter_dimension} is "
                             f"out of range for an operand of shape {np.shape(leaf)}")
        d = int(scatter_dimension) % ndim
        length = np.shape(leaf)[d]
        if tiled and length % size:
            raise ValueError(f"{what}: dimension {d} of the operand (size "
                             f"{length}) must be a multiple of the size of axis {axis!r} "
                             f"({size}) with tiled=True")
        if not tiled and length != size:
            raise ValueError(f"{what}: dimension {d} of the operand (size "
                             f"{length}) must equal the size of axis {axis!r} ({size}); pass "
                             "tiled=True to scatter blocks of a longer dimension")
        return reduce_scatter_leaf(leaf, axis, d, bool(tiled), comm)

    return jax.tree_util.tree_map(one, x)


def all_gather(x, axis_name, axis=0, tiled=False, to="varying"):
    """Like jax.lax.all_gather inside jax.shard_map: every rank's `x`, in rank
    order along mesh axis `axis_name`, stacked in a new dimension `axis`
    (tiled: concatenated along existing dimension `axis`). The result varies
    over the axis like jax.lax.all_gather's; to="invarying" makes it
    invariant (jax.lax.all_gather(..., to="invarying")). x: array or pytree."""
    what = "jax_ar.all_gather"
    axes = check_axes(axis_name, what)
    if len(axes) > 1:
        raise NotImplementedError(
            "jax_ar.all_gather over several mesh axes is not supported; use "
            "jax.lax.all_gather, or jax_ar.all_gather over the intra-host axis")
    name = axes[0]
    if not isinstance(tiled, (bool, np.bool_)):
        raise TypeError(f"{what}: tiled must be a bool, got {tiled!r}")
    if to not in TO_VALUES:
        raise ValueError(f"{what}: to must be one of {TO_VALUES}, got {to!r}")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{what}: axis must be an int, got {axis!r}")
    comm = communicator_for(name, what)

    def one(leaf):
        check_dtype(what, leaf, GATHER_DTYPES)
        ndim = np.ndim(leaf)
        out_ndim = ndim if tiled else ndim + 1
        if not -out_ndim <= axis < out_ndim:
            raise ValueError(f"{what}: axis {axis} is out of range for an operand "
                             f"of shape {np.shape(leaf)} with tiled={tiled}")
        return all_gather_leaf(leaf, name, int(axis) % out_ndim, bool(tiled), to, comm)

    return jax.tree_util.tree_map(one, x)
