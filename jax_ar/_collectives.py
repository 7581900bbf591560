"""The public collectives, drop-ins for their lax counterparts inside
jax.shard_map: argument checks, then the call's plan (ops/plan.py), carried
out by the primitive families of ops/.

Every call jax.lax's collective accepts is accepted: jax_ar's kernels serve
what they can (mesh axes with a communicator set up for their devices);
what they cannot serve lowers to the jax.lax collective, and the plan says
why (docs/guarantees.md lists both); errors name the function the user
called.
"""
from __future__ import annotations

import numpy as np

import jax

from . import _compat, config
from .ops import _call_order
from .ops._axes import classify_axes, normalize_axes, trivial_index_groups
from .ops._primitive import call_lax
from .ops.all_reduce import run_all_reduce
from .ops.multi_axis import all_gather_over, reduce_scatter_over
from .ops.plan import KERNEL, LAX, as_array, plan_all_reduce, plan_leaf
from .ops.scatter_gather import all_gather_leaf, reduce_scatter_leaf

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
    if algorithm == "auto":
        algorithm = config.algorithm_override() or "auto"
    leaves, treedef = jax.tree_util.tree_flatten(x)
    plan = plan_all_reduce(what, kinds, leaves, op, algorithm, axis_index_groups)
    return jax.tree_util.tree_unflatten(treedef, run_all_reduce(plan, leaves))


def reduce_scatter(x, axis_name, scatter_dimension=0, tiled=False, *, axis_index_groups=None):
    """Like jax.lax.psum_scatter inside jax.shard_map: the sum over
    `axis_name` (a mesh axis, a vmap axis or a tuple of them; rank order is
    lax's over the tuple), of which rank j keeps block j along
    `scatter_dimension` (negative counts from the end). Untiled, that
    dimension must equal the axes' size and is removed; tiled, it must be a
    multiple of it and shrinks by that factor. The result varies over the
    axes. x: array or pytree of arrays."""
    what = "jax_ar.reduce_scatter"
    tiled = _check_tiled(what, tiled)
    if isinstance(scatter_dimension, (bool, np.bool_)) or not isinstance(
            scatter_dimension, (int, np.integer)):
        raise TypeError(f"{what}: scatter_dimension must be an int, got "
                        f"{scatter_dimension!r}")
    axes = normalize_axes(axis_name, what)
    if not axes:
        return x
    kinds = classify_axes(axes, what)
    lax_form, groups = _lax_form(kinds, axis_index_groups, what)

    def one(leaf):
        leaf = as_array(leaf, what)
        ndim = np.ndim(leaf)
        if not -ndim <= scatter_dimension < ndim:
            raise ValueError(f"{what}: scatter_dimension {scatter_dimension} is "
                             f"out of range for an operand of shape {np.shape(leaf)}")
        d = int(scatter_dimension) % ndim
        if not lax_form:  # jax.lax checks the forms only it takes
            _check_scattered(what, np.shape(leaf)[d], d, axes, kinds.size, tiled)
        step = plan_leaf(what, kinds, leaf, axis_index_groups, gather=False)
        if step.kind == LAX:
            return call_lax(what, "jax.lax.psum_scatter", jax.lax.psum_scatter, leaf, axes,
                            scatter_dimension=d, axis_index_groups=groups, tiled=tiled)
        if step.kind == KERNEL:
            return reduce_scatter_leaf(leaf, axes[0], d, tiled, step.comm)
        return reduce_scatter_over(_in_turn(leaf, kinds, chain), step, d, tiled, what)

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
    tiled = _check_tiled(what, tiled)
    if not isinstance(to, str) or to not in TO_VALUES:
        raise ValueError(f"{what}: to must be one of {TO_VALUES}, got {to!r}")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{what}: axis must be an int, got {axis!r}")
    names = normalize_axes(axis_name, what)
    if not names:
        return x
    kinds = classify_axes(names, what)
    groups = _lax_form(kinds, axis_index_groups, what)[1]

    def one(leaf):
        leaf = as_array(leaf, what)
        ndim = np.ndim(leaf)
        out_ndim = ndim if tiled else ndim + 1
        if not -out_ndim <= axis < out_ndim:
            raise ValueError(f"{what}: axis {axis} is out of range for an operand "
                             f"of shape {np.shape(leaf)} with tiled={tiled}")
        d = int(axis) % out_ndim
        if to == "invarying":
            _check_gathered_varies(leaf, kinds, what)
        step = plan_leaf(what, kinds, leaf, axis_index_groups, gather=True, to=to)
        if step.kind == LAX:
            return call_lax(what, "jax.lax.all_gather", jax.lax.all_gather, leaf, names,
                            axis_index_groups=groups, axis=d, tiled=tiled, to=to)
        if step.kind == KERNEL:
            return all_gather_leaf(leaf, names[0], d, tiled, to, step.comm)
        return all_gather_over(_in_turn(leaf, kinds, chain), step, d, tiled, to, what)

    chain = []
    return jax.tree_util.tree_map(lambda leaf: _record(one(leaf), chain), x)


def _check_gathered_varies(leaf, kinds, what) -> None:
    """Where jax.lax.all_gather(..., to="invarying") refuses an operand that
    does not vary over the manual axes it gathers (jax >= 0.12.1, check_vma
    on), jax_ar refuses it too, with lax's exception type."""
    if not (_compat.LAX_GATHER_INVARIANT_NEEDS_VARYING and _compat.check_vma_enabled()):
        return
    varying = _compat.varying_axes(jax.typeof(leaf))
    same = [a for a in (*kinds.mesh, *kinds.single) if a not in varying]
    if same:
        raise ValueError(f"{what}(..., to='invarying'): the operand is the same on every rank "
                         f"of {tuple(same)}, where it must vary (jax.lax.all_gather refuses "
                         f"such an operand from jax 0.12.1 under check_vma)")


def _check_tiled(what, tiled) -> bool:
    """tiled as a bool: True, False or the ints 1 and 0, which jax.lax takes
    too (it only tests the value); anything else is a TypeError."""
    if isinstance(tiled, (bool, np.bool_)) or (isinstance(tiled, (int, np.integer))
                                                and tiled in (0, 1)):
        return bool(tiled)
    raise TypeError(f"{what}: tiled must be a bool, got {tiled!r}")


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


def _lax_form(kinds, axis_index_groups, what):
    """(whether the call is a form only jax.lax takes, the groups jax.lax
    gets): positional axes and groups within the axis are; one group of the
    whole axis is the same call without groups."""
    if kinds.positional:
        return True, axis_index_groups
    if trivial_index_groups(axis_index_groups, kinds.names, what):
        return False, None
    return True, axis_index_groups


def _check_scattered(what, length, d, axes, size, tiled):
    named = f"axis {axes[0]!r}" if len(axes) == 1 else f"axes {axes!r}"
    if tiled and length % size:
        raise ValueError(f"{what}: dimension {d} of the operand (size {length}) must be a "
                         f"multiple of the size of {named} ({size}) with tiled=True")
    if not tiled and length != size:
        raise ValueError(f"{what}: dimension {d} of the operand (size {length}) must equal "
                         f"the size of {named} ({size}); pass tiled=True to scatter blocks "
                         "of a longer dimension")
