"""Collectives over any axes of a call: several mesh axes (jax_ar inside a
host, XLA's collectives across hosts), vmap axes and mesh axes of size 1
(jax.lax's local arithmetic), and the one-mesh-axis case they all reach.

`all_reduce_over`, `reduce_scatter_over` and `all_gather_over` take the
classified axes of one call (ops/_axes.py: Axes) and give jax.lax's result
over them, in lax's rank order over the axes tuple.

all_reduce over several mesh axes:

jax_ar.all_reduce(x, ("node", "local")) lands here. One of the axes (the
"inner" one) has a communicator that serves calls, which means each of its
groups lies within one host; the others ("outer") are left to XLA's own
collectives (NCCL between GPU hosts, gloo between CPU processes). Leaves of
one dtype travel as one flat message, through one of two plans:

  allreduce_psum        (a) jax_ar all-reduce over the inner axis, then psum
                            of the whole message over the outer axes;
  scatter_psum_gather   (b) jax_ar reduce-scatter over the inner axis, psum of
                            each rank's 1/n share over the outer axes, jax_ar
                            all-gather over the inner axis: the two halves of
                            two-shot with the cross-host step in between,
                            which sends n times less across hosts.

algorithm="auto" picks the plan with the lower predicted time
(`predict_plans_us`); "oneshot" is plan (a) with the one-shot kernel inside,
"twoshot" is plan (b), "psum" is psum over every axis. docs/multi_axis.md
says what is bitwise identical where: in short, every rank gets the same
bits (plan (b) reduces each element across hosts once and copies it), and
the two plans agree bit for bit when the cross-host step does not depend on
order (two hosts, integers, max/min).

reduce_scatter and all_gather over several axes are a sequence of
single-axis steps, each on its own dimension. reduce_scatter: the scattered
dimension is split into one dimension per axis (sizes in tuple order, then
the block), and each step is an untiled reduce-scatter over one axis on
that axis's dimension (which it removes), so rank (i_1, .., i_m) ends with
block i_1 * S_2 * .. * S_m + .. + i_m summed over every axis: lax's order.
all_gather: each step stacks one axis's copies in a new dimension; the
stacked dimensions are put in tuple order and merged. Local steps run
first in a reduce-scatter (they shrink the data) and last in an all-gather;
steps that jax_ar serves run inside the host on the larger data, XLA's
across hosts on the smaller.
"""
from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from .. import _compat, config, selection
from . import _call_order
from ._axes import (REDUCE_DTYPES, Axes, as_varying, communicator_for, lookup,
                    no_communicator_message, unknown_devices_reason)
from ._primitive import call_lax, log_lax
from .all_reduce import LAX_NAMES, empty_result, lax_reduce, reduce_leaves
from .scatter_gather import (GATHER_DTYPES, all_gather_leaf, gather_rows, reduce_scatter_leaf,
                             scatter_rows)

__all__ = ["PLANS", "all_gather_over", "all_reduce_over", "all_reduce_over_axes", "as_array",
           "predict_plans_us", "reduce_scatter_over"]

PLANS = ("allreduce_psum", "scatter_psum_gather")

# The cross-host all-reduce, until measured. GPU: published figures for one
# 400 Gb/s NIC per GPU (HGX H100/H200 nodes): about 45 GB/s bus bandwidth in
# nccl-tests across nodes and 25 us of latency. CPU processes: gloo over TCP,
# the figures selection.py uses for psum.
_ACROSS_GPU_LATENCY_US = 25.0
_ACROSS_GPU_BUS_BYTES_PER_US = 45e3


def _across_us(platform: str, device_kind, hosts: int, nbytes: int) -> float:
    if hosts <= 1:
        return 0.0
    if platform == "gpu":
        moved = 2 * (hosts - 1) / hosts * nbytes  # a ring all-reduce's traffic per rank
        return _ACROSS_GPU_LATENCY_US + moved / _ACROSS_GPU_BUS_BYTES_PER_US
    table = selection.table_for(platform, device_kind, hosts)
    return selection.predict_us(table, "psum", nbytes)


def _half_us(table, nbytes: int, capacity) -> float:
    """A reduce-scatter or an all-gather alone: half of two-shot's traffic;
    most of its latency, since each is a launch and a full handshake."""
    latency = selection.predict_us(table, "twoshot", 0)
    traffic = selection.predict_us(table, "twoshot", nbytes, capacity) - latency
    return 0.75 * latency + 0.5 * traffic


def predict_plans_us(platform: str, inner: int, outer: int, nbytes: int, *,
                     device_kind: str | None = None, capacity_bytes=None) -> dict[str, float]:
    """Predicted time of each plan for `nbytes` over `inner` ranks in a host
    and `outer` hosts (the product of the outer axes' sizes);
    `capacity_bytes(algorithm)` is what one round of the inner
    communicator's workspace carries (Communicator.capacity_bytes)."""
    table = selection.table_for(platform, device_kind, inner)
    capacity = capacity_bytes or (lambda algorithm: None)
    inside = min(selection.predict_us(table, a, nbytes, capacity(a))
                 for a in ("oneshot", "twoshot"))
    share = -(-nbytes // inner)
    return {
        "allreduce_psum": inside + _across_us(platform, device_kind, outer, nbytes),
        "scatter_psum_gather": 2 * _half_us(table, nbytes, capacity("twoshot"))
                               + _across_us(platform, device_kind, outer, share),
    }


def all_reduce_over_axes(leaves, axes, op, algorithm, what="jax_ar.all_reduce") -> list:
    """all_reduce of `leaves` (arrays of REDUCE_DTYPES) over every axis in
    `axes` (two or more mesh axes of more than one device each)."""
    mesh = jax.sharding.get_abstract_mesh()
    inner, comm, why_not = _inner_axis(axes, what)
    if algorithm == "psum" or comm is None:
        if comm is None:
            config.log_once(("psum-axes", axes), f"jax_ar: {what} over {axes} lowers to "
                                                 f"psum: {why_not}")
        return [lax_reduce(leaf, axes, op) for leaf in leaves]
    outer = tuple(a for a in axes if a != inner)
    hosts = int(np.prod([mesh.shape[a] for a in outer]))
    total = int(np.prod([mesh.shape[a] for a in axes]))

    if algorithm == "oneshot":
        plan, inner_algorithm = "allreduce_psum", "oneshot"
    elif algorithm == "twoshot":
        plan, inner_algorithm = "scatter_psum_gather", None
    else:
        nbytes = sum(v.size * v.dtype.itemsize for v in leaves)
        predictions = predict_plans_us(comm.platform, comm.world_size, hosts, nbytes,
                                       device_kind=comm.groups[0][0].device_kind,
                                       capacity_bytes=comm.capacity_bytes)
        plan = min(PLANS, key=lambda p: predictions[p])
        inner_algorithm = "auto"
        config.log_once(
            ("plan", comm.platform, comm.world_size, hosts, max(0, nbytes - 1).bit_length(), plan),
            f"jax_ar: {nbytes} bytes over {axes} ({comm.world_size} ranks per host x {hosts}) "
            f"-> {plan} (predicted " + ", ".join(f"{p} {t:.1f} us" for p, t in
                                                   predictions.items()) + ")")

    # Averages are sums divided once at the end, so both plans round alike.
    kernel_op = "sum" if op == "avg" else op
    if _compat.check_vma_enabled():
        leaves = [as_varying(v, axes) for v in leaves]
    out = [None] * len(leaves)
    link = None
    for members, flat in _join_by_dtype(leaves, out, (inner,) + outer, kernel_op):
        if link is not None:
            # One step at a time: XLA:CPU would otherwise interleave jax_ar's
            # calls and psums of different groups differently on each host.
            (flat,) = _call_order.after([flat], link)
        if plan == "allreduce_psum":
            (inside,) = reduce_leaves([flat], (inner,), kernel_op, inner_algorithm, comm)
            reduced = lax_reduce(inside, outer, kernel_op)
        else:
            reduced = _scatter_psum_gather(flat, inner, outer, kernel_op, comm)
        link = reduced
        start = 0
        for i in members:
            out[i] = reduced[start:start + leaves[i].size].reshape(leaves[i].shape)
            start += leaves[i].size
    if op == "avg":
        out = [_divide(v, total) for v in out]
    return out


def _join_by_dtype(leaves, out, axes, op):
    """[(indices, flat concatenation)] per dtype, in order of first
    appearance. Empty leaves get their (empty) result in `out` right away."""
    by_dtype: dict = {}
    for i, leaf in enumerate(leaves):
        if leaf.size == 0:  # nothing to exchange
            out[i] = empty_result(leaf, axes, op)
        else:
            by_dtype.setdefault(np.dtype(leaf.dtype), []).append(i)
    return [(members, jnp.concatenate([leaves[i].reshape(-1) for i in members]))
            for members in by_dtype.values()]


def _inner_axis(axes, what):
    """(axis, communicator, None) for the axis jax_ar serves, or (None, None,
    why) when none can. Raises ValueError when no axis was set up at all."""
    lookups = [lookup(a) for a in axes]
    if any(f.groups is None for f in lookups):
        return None, None, unknown_devices_reason(axes)
    found = [(f.axis, f.comm) for f in lookups if f.comm is not None]
    if not found:
        raise ValueError(_no_communicator_for_any(what, lookups))
    serving = [(a, c) for a, c in found if c.serves_calls]
    if not serving:
        reasons = "; ".join(f"{a!r}: {c.fallback_reason or 'closed'}" for a, c in found)
        return None, None, reasons
    # The largest group keeps the most traffic inside the host; on a tie the
    # later axis wins (meshes put the intra-host axis last).
    axis, comm = max(reversed(serving), key=lambda ac: ac[1].world_size)
    comm.check()  # JaxArError now for a communicator that has failed
    return axis, comm, None


def _scatter_psum_gather(flat, inner, outer, op, comm):
    """Plan (b) on a 1-D array: padded so that each rank's share is a whole
    number of 16-byte blocks."""
    n = comm.world_size
    block = max(1, 16 // flat.dtype.itemsize)
    share = -(-flat.size // (n * block)) * block
    rows = jnp.pad(flat, (0, n * share - flat.size)).reshape(n, share)
    mine = scatter_rows(rows, inner, op, comm)
    mine = lax_reduce(mine, outer, op)
    whole = gather_rows(mine, inner, comm, invariant=_compat.check_vma_enabled())
    return whole.reshape(-1)[:flat.size]


def _constant_reduction(leaf, axes: Axes, op, what):
    """psum / pmean of a value that is not traced. jax.lax multiplies Python
    and numpy constants by the axis size, but exchanges bools and concrete
    jax arrays as if they were data; every rank holds the same value, so
    jax_ar gives lax's values and types without the exchange (which ranks
    sharing a GPU could not run: NCCL refuses them)."""
    if not (isinstance(leaf, jax.Array) or np.asarray(leaf).dtype == np.bool_):
        return call_lax(what, LAX_NAMES[op], lax_reduce, leaf, axes.names, op)
    x = jnp.asarray(leaf)
    if x.dtype == np.bool_:
        x = x.astype(jnp.int32)  # as jax.lax.psum
    size = jax.lax.psum(1, axes.names)  # a Python int: lax's constant rule
    total = x * size
    return total if op == "sum" else total / size  # int32 averages are float32, as pmean's


def _divide(total_sum, count):
    """avg from a sum: float32 division, rounded once (int32 gives float32, as pmean)."""
    if total_sum.dtype == jnp.int32:
        return total_sum.astype(jnp.float32) / np.float32(count)
    return (total_sum.astype(jnp.float32) / np.float32(count)).astype(total_sum.dtype)


def _no_communicator_for_any(what, lookups) -> str:
    axes = tuple(f.axis for f in lookups)
    detail = "; ".join(no_communicator_message(what, f.axis, f.groups) for f in lookups)
    return (f"{what}: no communicator for any of the axes {axes}; call jax_ar.setup(mesh, axis) "
            f"for the axis whose devices share a host before tracing ({detail})")


# ----------------------------------------------------------------------------
# Any axes: the entry points of the public collectives.

def all_reduce_over(leaves, axes: Axes, op, algorithm, what) -> list:
    """jax.lax's psum / pmean / pmax / pmin of each of `leaves` over `axes`
    (no positional axes): jax_ar over the mesh axes, jax.lax's local
    arithmetic over the others. Leaves that are not traced values reduce as
    jax.lax reduces constants (x times the axis size: nothing moves); bool
    sums are int32 sums (as in jax.lax); dtypes jax_ar's kernels do not
    take go to jax.lax (logged once)."""
    lax_name = LAX_NAMES[op]
    out = [None] * len(leaves)
    todo = {}
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, jax.core.Tracer):
            _check_array_like(leaf, what)
            if op in ("sum", "avg"):
                out[i] = _constant_reduction(leaf, axes, op, what)
                continue
            leaf = jnp.asarray(leaf)
        if leaf.dtype == np.bool_ and op in ("sum", "avg"):
            leaf = leaf.astype(jnp.int32)  # as jax.lax.psum
        if op in ("max", "min") and jnp.issubdtype(leaf.dtype, jnp.complexfloating):
            raise TypeError(f"{what}: op={op!r} of {leaf.dtype}: complex numbers have no order "
                            f"(jax.lax.p{op} traces it, then XLA fails to compile it)")
        if np.dtype(leaf.dtype) not in REDUCE_DTYPES:
            log_lax(what, axes.names, lax_name, f"jax_ar's kernels do not reduce {leaf.dtype}")
            out[i] = call_lax(what, lax_name, lax_reduce, leaf, axes.names, op)
            continue
        todo[i] = leaf
    if todo:
        for i, r in zip(todo, _reduce_arrays(list(todo.values()), axes, op, algorithm, what)):
            out[i] = r
    return out


def _reduce_arrays(values, axes: Axes, op, algorithm, what) -> list:
    lax_name = LAX_NAMES[op]
    if not axes.mesh:  # nothing leaves the device: jax.lax's own arithmetic
        if axes.single:
            values = call_lax(what, lax_name, _lax_each, values, axes.single, op)
        if axes.vmap:
            values = over_vmap_axes(what, lax_name, _lax_each, values, axes.vmap, op)
        return values
    # An average over vmap axes too is a sum over all, divided once at the
    # end; size-1 axes change no value, so their op stays as it is.
    inner_op = "sum" if op == "avg" else op
    mesh_op = inner_op if axes.vmap else op
    if axes.vmap:
        values = over_vmap_axes(what, lax_name, _lax_each, values, axes.vmap, inner_op)
    if axes.single:
        values = call_lax(what, lax_name, _lax_each, values, axes.single, inner_op)
    if len(axes.mesh) > 1:
        values = all_reduce_over_axes(values, axes.mesh, mesh_op, algorithm, what)
    else:
        comm = communicator_for(axes.mesh[0], what)
        if comm is None:
            values = _lax_each(values, axes.mesh, mesh_op)
        else:
            values = reduce_leaves(values, axes.mesh, mesh_op, algorithm, comm)
    if op == "avg" and axes.vmap:
        values = [_divide(v, axes.size) for v in values]
    return values


def over_vmap_axes(what, lax_name, fn, values, *args):
    """fn(values, *args): jax.lax collectives over vmap axes only, which
    vmap turns into local arithmetic. They run without the varying-axes
    checks (jax.lax's own check_vma path rejects vmap axis names, and
    without it jax.lax's results lose their varying mesh axes): each result
    is given back the mesh axes its input varies over, which local
    arithmetic does not change."""
    varying = [_compat.varying_axes(jax.typeof(v)) for v in jax.tree_util.tree_leaves(values)]
    with _compat.without_vma_checks():
        out = call_lax(what, lax_name, fn, values, *args)
    leaves, treedef = jax.tree_util.tree_flatten(out)
    restored = []
    for leaf, axes in zip(leaves, varying):
        missing = tuple(sorted(axes - _compat.varying_axes(jax.typeof(leaf)), key=str))
        restored.append(_compat.pcast_to_varying(leaf, missing) if missing else leaf)
    return jax.tree_util.tree_unflatten(treedef, restored)


def _lax_each(values, axes, op):
    return [lax_reduce(v, axes, op) for v in values]


def _check_array_like(leaf, what):
    if not isinstance(leaf, (jax.Array, np.ndarray, np.generic, bool, int, float, complex)):
        raise TypeError(f"{what}: a leaf of type {type(leaf).__name__} is not an array "
                        "(unsupported dtype); pass arrays or Python / numpy scalars")


def as_array(leaf, what):
    """A leaf as a jax array (Python and numpy scalars and arrays too)."""
    if isinstance(leaf, jax.core.Tracer):
        return leaf
    _check_array_like(leaf, what)
    return jnp.asarray(leaf)


# Where each step of a reduce_scatter / all_gather over several axes runs.
_LOCAL_VMAP, _LOCAL_SINGLE, _JAX_AR, _XLA = "vmap", "single", "jax_ar", "xla"


def _plan_steps(axes: Axes, what):
    """{axis: (where, communicator or None)} for every axis of the call, or
    None when the devices are unknown while tracing (all of it goes to
    jax.lax then). ValueError when no mesh axis has a communicator."""
    steps = {a: (_LOCAL_VMAP, None) for a in axes.vmap}
    steps.update({a: (_LOCAL_SINGLE, None) for a in axes.single})
    if axes.mesh:
        lookups = [lookup(a) for a in axes.mesh]
        if any(f.groups is None for f in lookups):
            return None
        if all(f.comm is None for f in lookups):
            if len(lookups) == 1:
                raise ValueError(no_communicator_message(what, lookups[0].axis, lookups[0].groups))
            raise ValueError(_no_communicator_for_any(what, lookups))
        for f in lookups:  # axes without one are XLA's (across hosts)
            steps[f.axis] = (_JAX_AR, f.comm) if f.comm is not None else (_XLA, None)
    return steps


def _ordered(steps, first):
    """The axes in the order their steps run: kinds in `first` order, each
    in the tuple's order."""
    return [a for kind in first for a, (where, _) in steps.items() if where == kind]


def reduce_scatter_over(leaf, axes: Axes, dimension, tiled, what, lax_call):
    """jax.lax.psum_scatter(leaf, axes.names, scatter_dimension=dimension,
    tiled=tiled) of one checked leaf (dimension >= 0); `lax_call(leaf)`
    is that lax call itself, for when no communicator can serve."""
    if leaf.dtype == np.bool_:  # jax.lax traces it, then fails to lower it
        raise TypeError(f"{what}: cannot sum bool (neither can jax.lax.psum_scatter, whose "
                        "lowering rejects it); cast the operand to int32 first")
    if np.dtype(leaf.dtype) not in REDUCE_DTYPES:
        log_lax(what, axes.names, "jax.lax.psum_scatter",
                f"jax_ar's kernels do not reduce {leaf.dtype}")
        return call_lax(what, "jax.lax.psum_scatter", lax_call, leaf)
    if len(axes.names) == 1 and axes.mesh:
        comm = communicator_for(axes.mesh[0], what)
        if comm is None:
            return call_lax(what, "jax.lax.psum_scatter", lax_call, leaf)
        return reduce_scatter_leaf(leaf, axes.mesh[0], dimension, tiled, comm)
    steps = _plan_steps(axes, what)
    if steps is None:
        log_lax(what, axes.names, "jax.lax.psum_scatter", unknown_devices_reason(axes.mesh))
        return call_lax(what, "jax.lax.psum_scatter", lax_call, leaf)
    sizes = [jax.lax.axis_size(a) for a in axes.names]
    shape = leaf.shape
    split = tuple(sizes) + ((shape[dimension] // int(np.prod(sizes)),) if tiled else ())
    x = leaf.reshape(shape[:dimension] + split + shape[dimension + 1:])
    remaining = list(axes.names)  # the axes whose dimensions x still has, in order
    for a in _ordered(steps, (_LOCAL_VMAP, _LOCAL_SINGLE, _JAX_AR, _XLA)):
        where, comm = steps[a]
        d = dimension + remaining.index(a)
        x = _scatter_step(x, a, d, where, comm, what)
        remaining.remove(a)
    return x


def _scatter_step(x, axis, d, where, comm, what):
    """Untiled reduce-scatter of x over `axis` on dimension d (removed)."""
    if where == _JAX_AR:
        return reduce_scatter_leaf(x, axis, d, False, comm)
    fn = lambda v: jax.lax.psum_scatter(v, axis, scatter_dimension=d, tiled=False)
    if where == _LOCAL_VMAP:
        return over_vmap_axes(what, "jax.lax.psum_scatter", fn, x)
    return call_lax(what, "jax.lax.psum_scatter", fn, x)


def all_gather_over(leaf, axes: Axes, dimension, tiled, to, what, lax_call):
    """jax.lax.all_gather(leaf, axes.names, axis=dimension, tiled=tiled,
    to=to) of one checked leaf (dimension >= 0, counted in the result);
    `lax_call(leaf)` is that lax call itself."""
    if np.dtype(leaf.dtype) not in GATHER_DTYPES:
        log_lax(what, axes.names, "jax.lax.all_gather",
                f"jax_ar's kernels do not carry {leaf.dtype}")
        return call_lax(what, "jax.lax.all_gather", lax_call, leaf)
    if len(axes.names) == 1 and axes.mesh:
        comm = communicator_for(axes.mesh[0], what)
        if comm is None:
            return call_lax(what, "jax.lax.all_gather", lax_call, leaf)
        return all_gather_leaf(leaf, axes.mesh[0], dimension, tiled, to, comm)
    steps = _plan_steps(axes, what)
    if steps is None:
        log_lax(what, axes.names, "jax.lax.all_gather", unknown_devices_reason(axes.mesh))
        return call_lax(what, "jax.lax.all_gather", lax_call, leaf)
    x = leaf if tiled else jnp.expand_dims(leaf, dimension)
    stacked = []  # axes of the stacked dimensions at `dimension`, outermost first
    for a in _ordered(steps, (_XLA, _JAX_AR, _LOCAL_SINGLE, _LOCAL_VMAP)):
        where, comm = steps[a]
        x = _gather_step(x, a, dimension, where, comm, to, what)
        stacked.insert(0, a)
    # Stacked dimensions in the tuple's order, then merged with the gathered one.
    order = [stacked.index(a) for a in axes.names]
    m = len(order)
    perm = (list(range(dimension)) + [dimension + i for i in order] +
            list(range(dimension + m, x.ndim)))
    x = jnp.transpose(x, perm)
    merged = int(np.prod(x.shape[dimension:dimension + m + 1]))
    return x.reshape(x.shape[:dimension] + (merged,) + x.shape[dimension + m + 1:])


def _gather_step(x, axis, d, where, comm, to, what):
    """Untiled all-gather of x over `axis`: a new dimension at d."""
    if where == _JAX_AR:
        return all_gather_leaf(x, axis, d, False, to, comm)
    if where == _LOCAL_VMAP:  # vmap axes have no varying type to change
        fn = lambda v: jax.lax.all_gather(v, axis, axis=d, tiled=False)
        return over_vmap_axes(what, "jax.lax.all_gather", fn, x)
    fn = lambda v: jax.lax.all_gather(v, axis, axis=d, tiled=False, to=to)
    return call_lax(what, "jax.lax.all_gather", fn, x)
