"""all_reduce over several mesh axes: jax_ar inside a host, psum across hosts.

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
"""
from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from .. import _compat, config, selection
from ..comm.communicator import find_communicator
from . import _call_order
from ._axes import as_varying
from .all_reduce import empty_result, lax_reduce, reduce_leaves
from .scatter_gather import gather_rows, scatter_rows

__all__ = ["PLANS", "all_reduce_over_axes", "predict_plans_us"]

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


def all_reduce_over_axes(leaves, axes, op, algorithm) -> list:
    """all_reduce of `leaves` over every axis in `axes` (two or more)."""
    mesh = jax.sharding.get_abstract_mesh()
    inner, comm, why_not = _inner_axis(axes, mesh)
    if algorithm == "psum" or comm is None:
        if comm is None:
            config.log_once(("psum-axes", axes), f"jax_ar: all_reduce over {axes} lowers to "
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


def _inner_axis(axes, mesh):
    """(axis, communicator, None) for the axis jax_ar serves, or (None, None,
    why) when none can. Raises ValueError when no axis was set up at all."""
    found = [(a, find_communicator(a, mesh.axis_names, mesh.axis_sizes)) for a in axes]
    found = [(a, c) for a, c in found if c is not None]
    if not found:
        raise ValueError(f"jax_ar.all_reduce: no communicator for any of the axes {axes}; call "
                         "jax_ar.setup(mesh, axis) for the axis whose devices share a host "
                         "before tracing")
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


def _divide(total_sum, count):
    """avg from a sum: float32 division, rounded once (int32 gives float32, as pmean)."""
    if total_sum.dtype == jnp.int32:
        return total_sum.astype(jnp.float32) / np.float32(count)
    return (total_sum.astype(jnp.float32) / np.float32(count)).astype(total_sum.dtype)
