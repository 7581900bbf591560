"""The public collectives, drop-ins for their lax counterparts inside
jax.shard_map: argument checks, then the compositions of ops/multi_axis.py.

Every call jax.lax's collective accepts is accepted: jax_ar's kernels serve
what they can (mesh axes with a communicator set up for their devices);
what they cannot serve lowers to the jax.lax collective, logged once with
the reason (docs/guarantees.md lists both); errors name the function the
user called.
"""
from __future__ import annotations

import functools

import numpy as np

import jax

from . import _compat, config
from .ops import _call_order
from .ops._axes import classify_axes, normalize_axes, trivial_index_groups
from .ops._primitive import call_lax, log_lax
from .ops.all_reduce import LAX_NAMES, LAX_REDUCTIONS
from .ops.multi_axis import all_gather_over, all_reduce_over, as_array, reduce_scatter_over

__all__ = ["all_gather", "all_reduce", "reduce_scatter"]

OPS = ("sum", "avg", "max", "min")

# The `to` values of jax.lax.all_gather; jax_ar's kernels serve the first two.
TO_VALUES = ("varying", "invarying", "reduced")


def all_reduce(x, axis_name, op="sum", algorithm="auto", *, axis_index_groups=None):
    """All-reduce `x` (an array, scalar or pytree of them) over `axis_name`
    (a mesh axis, a vmap axis, or a tuple or list of them) inside
    jax.shard_map: what jax.lax.psum / pmean / pmax / pmin give, invariant
    over the axes. op: "sum" | "avg" | "max" | "min"; algorithm: "auto" |
    "oneshot" | "twoshot" | "psum". "avg" of int32 returns float32, as
    pmean; bool sums are int32, as psum's. axis_index_groups as in jax.lax
    (lowered to the jax.lax collective)."""
    what = "jax_ar.all_reduce"
    if not isinstance(op, str) or op not in OPS:
        raise ValueError(f"{what}: op must be one of {OPS}, got {op!r}")
    if not isinstance(algorithm, str) or algorithm not in config.ALGORITHMS:
        raise ValueError(f"{what}: algorithm must be one of {config.ALGORITHMS}, "
                         f"got {algorithm!r}")
    axes = normalize_axes(axis_name, what)
    if not axes:
        return x  # jax.lax: a reduction over no axis is the identity
    kinds = classify_axes(axes, what)
    lax_name = LAX_NAMES[op]
    reason = _lax_only(kinds, axis_index_groups, what)
    if reason is not None:
        log_lax(what, axes, lax_name, reason)
        if kinds.positional or not _compat.check_vma_enabled():
            return call_lax(what, lax_name, LAX_REDUCTIONS[op], x, axes,
                            axis_index_groups=axis_index_groups)
        return jax.tree_util.tree_map(
            lambda leaf: _grouped_reduction(leaf, axes, op, axis_index_groups, what), x)
    if algorithm == "auto":
        algorithm = config.algorithm_override() or "auto"
    leaves, treedef = jax.tree_util.tree_flatten(x)
    return jax.tree_util.tree_unflatten(treedef,
                                        all_reduce_over(leaves, kinds, op, algorithm, what))


def reduce_scatter(x, axis_name, scatter_dimension=0, tiled=False, *, axis_index_groups=None):
    """Like jax.lax.psum_scatter inside jax.shard_map: the sum over
    `axis_name` (a mesh axis, a vmap axis or a tuple of them; rank order is
    lax's over the tuple), of which rank j keeps block j along
    `scatter_dimension` (negative counts from the end). Untiled, that
    dimension must equal the axes' size and is removed; tiled, it must be a
    multiple of it and shrinks by that factor. The result varies over the
    axes. x: array or pytree of arrays."""
    what = "jax_ar.reduce_scatter"
    if not isinstance(tiled, (bool, np.bool_)):
        raise TypeError(f"{what}: tiled must be a bool, got {tiled!r}")
    if isinstance(scatter_dimension, (bool, np.bool_)) or not isinstance(
            scatter_dimension, (int, np.integer)):
        raise TypeError(f"{what}: scatter_dimension must be an int, got "
                        f"{scatter_dimension!r}")
    axes = normalize_axes(axis_name, what)
    if not axes:
        return x
    kinds = classify_axes(axes, what)
    tiled = bool(tiled)
    reason = _lax_only(kinds, axis_index_groups, what)
    if reason is None:
        axis_index_groups = None  # one group of the whole axis: the same call without
    lax_call = lambda leaf, d: jax.lax.psum_scatter(
        leaf, axes, scatter_dimension=d, axis_index_groups=axis_index_groups, tiled=tiled)
    size = kinds.size if not kinds.positional else None

    def one(leaf):
        leaf = as_array(leaf, what)
        ndim = np.ndim(leaf)
        if not -ndim <= scatter_dimension < ndim:
            raise ValueError(f"{what}: scatter_dimension {scatter_dimension} is "
                             f"out of range for an operand of shape {np.shape(leaf)}")
        d = int(scatter_dimension) % ndim
        if reason is not None:
            log_lax(what, axes, "jax.lax.psum_scatter", reason)
            return call_lax(what, "jax.lax.psum_scatter", lax_call, leaf, d)
        length = np.shape(leaf)[d]
        named = f"axis {axes[0]!r}" if len(axes) == 1 else f"axes {axes!r}"
        if tiled and length % size:
            raise ValueError(f"{what}: dimension {d} of the operand (size "
                             f"{length}) must be a multiple of the size of {named} "
                             f"({size}) with tiled=True")
        if not tiled and length != size:
            raise ValueError(f"{what}: dimension {d} of the operand (size "
                             f"{length}) must equal the size of {named} ({size}); pass "
                             "tiled=True to scatter blocks of a longer dimension")
        return reduce_scatter_over(_in_turn(leaf, kinds, chain), kinds, d, tiled, what,
                                   functools.partial(lax_call, d=d))

    chain = []
    return jax.tree_util.tree_map(lambda leaf: _record(one(leaf), chain), x)


def all_gather(x, axis_name, axis=0, tiled=False, to="varying", *, axis_index_groups=None):
    """Like jax.lax.all_gather inside jax.shard_map: every rank's `x`, in rank
    order along `axis_name` (a mesh axis, a vmap axis or a tuple of them;
    lax's order over the tuple), stacked in a new dimension `axis` (tiled:
    concatenated along existing dimension `axis`; negative counts from the
    end). The result varies over the axes like jax.lax.all_gather's;
    to="invarying" makes it invariant (jax.lax.all_gather(...,
    to="invarying")). x: array, scalar or pytree of them."""
    what = "jax_ar.all_gather"
    if not isinstance(tiled, (bool, np.bool_)):
        raise TypeError(f"{what}: tiled must be a bool, got {tiled!r}")
    if not isinstance(to, str) or to not in TO_VALUES:
        raise ValueError(f"{what}: to must be one of {TO_VALUES}, got {to!r}")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{what}: axis must be an int, got {axis!r}")
    names = normalize_axes(axis_name, what)
    if not names:
        return x
    kinds = classify_axes(names, what)
    tiled = bool(tiled)
    reason = _lax_only(kinds, axis_index_groups, what)
    if reason is None:
        axis_index_groups = None
    lax_call = lambda leaf, d: jax.lax.all_gather(
        leaf, names, axis_index_groups=axis_index_groups, axis=d, tiled=tiled, to=to)
    if reason is None and to == "reduced":
        reason = 'to="reduced" (jax_ar serves "varying" and "invarying")'

    def one(leaf):
        leaf = as_array(leaf, what)
        ndim = np.ndim(leaf)
        out_ndim = ndim if tiled else ndim + 1
        if not -out_ndim <= axis < out_ndim:
            raise ValueError(f"{what}: axis {axis} is out of range for an operand "
                             f"of shape {np.shape(leaf)} with tiled={tiled}")
        d = int(axis) % out_ndim
        if reason is not None:
            log_lax(what, names, "jax.lax.all_gather", reason)
            return call_lax(what, "jax.lax.all_gather", lax_call, leaf, d)
        return all_gather_over(_in_turn(leaf, kinds, chain), kinds, d, tiled, to, what,
                               functools.partial(lax_call, d=d))

    chain = []
    return jax.tree_util.tree_map(lambda leaf: _record(one(leaf), chain), x)


def _grouped_reduction(leaf, axes, op, axis_index_groups, what):
    """jax.lax's reduction within `axis_index_groups` under check_vma, which
    jax.lax.psum refuses there (NotImplementedError): the collective runs
    without the varying-axes checks, and its result is typed as varying
    over the input's axes and `axes` (each group has its own result)."""
    lax_name = LAX_NAMES[op]
    varying = _compat.varying_axes(jax.typeof(leaf)) if hasattr(leaf, "dtype") else frozenset()
    with _compat.without_vma_checks():
        out = call_lax(what, lax_name, LAX_REDUCTIONS[op], leaf, axes,
                       axis_index_groups=axis_index_groups)
    missing = tuple(a for a in (*sorted(varying, key=str), *axes)
                    if a not in _compat.varying_axes(jax.typeof(out)))
    return _compat.pcast_to_varying(out, missing) if missing else out


def _in_turn(leaf, kinds, chain):
    """`leaf`, computed after the previous leaf's result when the call
    spans several mesh axes: its steps mix jax_ar's calls with XLA's
    collectives, which XLA:CPU would otherwise interleave differently on
    each host (as multi_axis.py orders all_reduce's groups)."""
    # (Devices unknown while tracing: every step is XLA's, nothing to order.)
    if len(kinds.mesh) > 1 and chain and _compat.shard_map_mesh() is not None:
        (leaf,) = _call_order.after([leaf], chain[-1])
    return leaf


def _record(result, chain):
    chain.append(result)
    return result


def _lax_only(kinds, axis_index_groups, what) -> str | None:
    """Why a call can only be jax.lax's (forms jax_ar's kernels do not take),
    or None."""
    if kinds.positional:
        return f"positional axes {kinds.positional}"
    if not trivial_index_groups(axis_index_groups, kinds.names, what):
        return "axis_index_groups (groups within the axis)"
    return None
