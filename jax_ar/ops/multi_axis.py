"""reduce_scatter and all_gather over several axes of a call, as a sequence
of single-axis steps, each on its own dimension, placed by the call's plan
(ops/plan.py: a multi_axis step's `where` says, for each axis, whether
jax.lax's local arithmetic serves it (a vmap or size-1 axis), jax_ar's
kernel (an axis whose devices share a host), or XLA's collective (across
hosts)). An all-reduce over several axes is one of all_reduce.py's
compositions.

reduce_scatter: the scattered dimension is split into one dimension per
axis (sizes in tuple order, then the block), and each step is an untiled
reduce-scatter over one axis on that axis's dimension (which it removes), so
rank (i_1, .., i_m) ends with block i_1 * S_2 * .. * S_m + .. + i_m summed
over every axis: lax's order. all_gather: each step stacks one axis's copies
in a new dimension; the stacked dimensions are put in tuple order and
merged. Local steps run first in a reduce-scatter (they shrink the data)
and last in an all-gather; steps that jax_ar serves run inside the host on
the larger data, XLA's across hosts on the smaller.
"""
from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from ._primitive import call_lax, over_vmap_axes
from .plan import JAX_AR, SINGLE, VMAP, XLA
from .scatter_gather import all_gather_leaf, reduce_scatter_leaf

__all__ = ["all_gather_over", "reduce_scatter_over"]


def _ordered(where, first):
    """(axis, place, communicator) in the order the steps run: places in
    `first` order, each in the tuple's order."""
    return [w for place in first for w in where if w[1] == place]


def reduce_scatter_over(leaf, step, dimension, tiled, what):
    """jax.lax.psum_scatter(leaf, step.axes, scatter_dimension=dimension,
    tiled=tiled) of one checked leaf (dimension >= 0), step by step."""
    names = step.axes
    sizes = [jax.lax.axis_size(a) for a in names]
    shape = leaf.shape
    split = tuple(sizes) + ((shape[dimension] // int(np.prod(sizes)),) if tiled else ())
    x = leaf.reshape(shape[:dimension] + split + shape[dimension + 1:])
    remaining = list(names)  # the axes whose dimensions x still has, in order
    for a, place, comm in _ordered(step.where, (VMAP, SINGLE, JAX_AR, XLA)):
        x = _scatter_step(x, a, dimension + remaining.index(a), place, comm, what)
        remaining.remove(a)
    return x


def _scatter_step(x, axis, d, place, comm, what):
    """Untiled reduce-scatter of x over `axis` on dimension d (removed)."""
    if place == JAX_AR:
        return reduce_scatter_leaf(x, axis, d, False, comm)
    fn = lambda v: jax.lax.psum_scatter(v, axis, scatter_dimension=d, tiled=False)  # noqa: E731
    if place == VMAP:
        return over_vmap_axes(what, "jax.lax.psum_scatter", fn, x)
    return call_lax(what, "jax.lax.psum_scatter", fn, x)


def all_gather_over(leaf, step, dimension, tiled, to, what):
    """jax.lax.all_gather(leaf, step.axes, axis=dimension, tiled=tiled,
    to=to) of one checked leaf (dimension >= 0, counted in the result),
    step by step."""
    x = leaf if tiled else jnp.expand_dims(leaf, dimension)
    stacked = []  # axes of the stacked dimensions at `dimension`, outermost first
    for a, place, comm in _ordered(step.where, (XLA, JAX_AR, SINGLE, VMAP)):
        x = _gather_step(x, a, dimension, place, comm, to, what)
        stacked.insert(0, a)
    # Stacked dimensions in the tuple's order, then merged with the gathered one.
    order = [stacked.index(a) for a in step.axes]
    m = len(order)
    perm = (list(range(dimension)) + [dimension + i for i in order] +
            list(range(dimension + m, x.ndim)))
    x = jnp.transpose(x, perm)
    merged = int(np.prod(x.shape[dimension:dimension + m + 1]))
    return x.reshape(x.shape[:dimension] + (merged,) + x.shape[dimension + m + 1:])


def _gather_step(x, axis, d, place, comm, to, what):
    """Untiled all-gather of x over `axis`: a new dimension at d."""
    if place == JAX_AR:
        return all_gather_leaf(x, axis, d, False, to, comm)
    if place == VMAP:  # vmap axes have no varying type to change
        fn = lambda v: jax.lax.all_gather(v, axis, axis=d, tiled=False)  # noqa: E731
        return over_vmap_axes(what, "jax.lax.all_gather", fn, x)
    fn = lambda v: jax.lax.all_gather(v, axis, axis=d, tiled=False, to=to)  # noqa: E731
    return call_lax(what, "jax.lax.all_gather", fn, x)
