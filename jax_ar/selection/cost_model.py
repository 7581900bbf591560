"""Which kernel serves an all-reduce: a cost model evaluated at trace time.

In the spirit of NCCL's getAlgoInfo: for each candidate kernel (oneshot,
twoshot, on CUDA twoshot_ll, and psum) the predicted time is latency +
bytes x inverse bandwidth, read from the table of this (platform, device
kind, world size); the cheapest wins, ties going to the earlier candidate.
algorithm="twoshot" is the two-shot family: on CUDA the table chooses
between its LL and plain kernels the same way. A message larger than what
one round of the workspace carries (Communicator.capacity_bytes) is
predicted as that many rounds. The inputs are static shapes, the
communicator's configuration and the table, so every rank decides the same;
ops/plan.py asks and records the kernel in the call's plan.

An all-reduce over several mesh axes is composed (ops/plan.py): jax_ar
inside the host and XLA's collective across hosts (allreduce_psum), or a
reduce-scatter, the cross-host step on 1/n of the data and an all-gather
(scatter_psum_gather); `choose_composition` predicts both.

all_reduce_rms_norm with algorithm="auto" chooses the same way among its
paths (`choose_norm_path`): the fused kernel with either protocol, or the
pair jax_ar.all_reduce + jax_ar.rms_norm ("composed"), each predicted by its
own curve for a whole call.

The table is the one `python -m jax_ar tune` measured (see table.py for
where it is looked up, JAX_AR_TABLE included), else the shipped defaults
(defaults.py).
"""
from __future__ import annotations

import os
import threading
from typing import Callable

from .. import config
from .._version import __version__
from .defaults import default_table
from .table import (NORM_PATHS as _NORM_PATHS, TABLE_ENV, Table, kernel_curves, load_table,
                    table_path)

__all__ = ["CANDIDATES", "COMPOSITIONS", "NORM_PATHS", "candidates_for", "choose_algorithm",
           "choose_composition", "choose_for", "choose_kernel", "choose_norm_path", "clear_cache",
           "predict_all", "predict_compositions_us", "predict_us", "table_for"]

# What algorithm= names (and `tune` measures through all_reduce); the kernels
# each runs on a platform are kernel_curves(platform).
CANDIDATES = ("oneshot", "twoshot", "psum")
NORM_PATHS = _NORM_PATHS
COMPOSITIONS = ("allreduce_psum", "scatter_psum_gather")
# The kernels behind each explicit algorithm (those the platform has).
_FAMILIES = {"oneshot": ("oneshot",), "twoshot": ("twoshot_ll", "twoshot"), "psum": ("psum",)}

# --- Which table ------------------------------------------------------------
_lock = threading.Lock()
_tables: dict = {}


def table_for(platform: str, device_kind: str | None, world: int, *,
              named_file: bool = True) -> Table:
    """The table serving this key (loaded once per process and key).
    Raises TableError for a bad file; a bad file is never skipped.
    named_file=False passes over a file that JAX_AR_TABLE names (it holds
    one world size, the communicator's) for the cache's or shipped table."""
    override = os.environ.get(TABLE_ENV, "").strip()
    if not named_file and override.lower() != "default":
        override = ""
    key = (platform, device_kind, world, override)
    with _lock:
        if key in _tables:
            return _tables[key]
    kind = device_kind or platform
    if override.lower() == "default":
        table = default_table(platform, kind, world)
    elif override:
        table = load_table(override, platform, kind, world, __version__)
    else:
        path = table_path(platform, kind, world)
        if os.path.exists(path):
            table = load_table(path, platform, kind, world, __version__)
        else:
            table = default_table(platform, kind, world)
    table = table.completed_by(default_table(platform, kind, world))  # an older schema's file
    with _lock:
        _tables[key] = table
    return table


def clear_cache() -> None:
    """Forgets loaded tables (after `tune` wrote one, or in tests)."""
    with _lock:
        _tables.clear()


# --- Prediction and choice --------------------------------------------------
def predict_us(table: Table, algorithm: str, nbytes: int, capacity: int | None = None) -> float:
    """Predicted time of an all-reduce of `nbytes`: one round, or full rounds
    of `capacity` bytes plus one for the rest (jax_ar's kernels; psum has no
    workspace limit)."""
    if algorithm == "psum" or capacity is None or nbytes <= capacity:
        return table.round_us(algorithm, nbytes)
    full, rest = divmod(nbytes, capacity)
    return full * table.round_us(algorithm, capacity) + (table.round_us(algorithm, rest)
                                                         if rest else 0.0)


def predict_all(table: Table, nbytes: int,
                capacity_bytes: Callable[[str], int] | None = None,
                candidates: tuple | None = None) -> dict:
    """{kernel: predicted us} for `candidates` (default: every curve of the
    table's platform)."""
    candidates = candidates or kernel_curves(table.platform)
    return {a: predict_us(table, a, nbytes, capacity_bytes(a) if capacity_bytes and a != "psum"
                          else None)
            for a in candidates}


def candidates_for(platform: str, algorithm: str = "auto", psum: bool = True) -> tuple:
    """The kernels (and "psum") that `algorithm` may run on `platform`, in
    the order ties are broken: "auto" all of them (psum only where it can
    run), "twoshot" its LL and plain kernels where the platform has both."""
    kernels = kernel_curves(platform)
    if algorithm == "auto":
        return tuple(k for k in kernels if k != "psum" or psum)
    return tuple(k for k in _FAMILIES[algorithm] if k in kernels)


def choose_algorithm(platform: str, world: int, nbytes: int, *, device_kind: str | None = None,
                     capacity_bytes: Callable[[str], int] | None = None,
                     candidates: tuple | None = None) -> str:
    """The candidate with the lowest predicted time (ties go to the earlier
    one; default candidates: candidates_for(platform)), logged once per
    size class. `capacity_bytes(kernel)` is what one round carries
    (Communicator.capacity_bytes); None means unlimited."""
    candidates = candidates or candidates_for(platform)
    table = table_for(platform, device_kind, world)
    predictions = predict_all(table, nbytes, capacity_bytes, candidates)
    best = min(candidates, key=lambda a: predictions[a])
    config.log_once(
        ("choice", platform, device_kind, world, _size_class(nbytes), best, candidates,
         table.source),
        f"jax_ar: {nbytes} bytes over {world} {device_kind or platform} ranks -> {best} "
        f"(predicted " + ", ".join(f"{a} {t:.1f} us" for a, t in predictions.items())
        + f"; table: {table.source})")
    return best


def choose_kernel(comm, algorithm: str, nbytes: int) -> str:
    """The kernel (or "psum") that runs an all-reduce of `nbytes` packed
    bytes over communicator `comm` for `algorithm` ("auto", "oneshot",
    "twoshot"): the one candidate, or the table's fastest."""
    candidates = candidates_for(comm.platform, algorithm, not comm.psum_unavailable)
    if len(candidates) == 1:
        return candidates[0]
    return choose_algorithm(comm.platform, comm.world_size, nbytes,
                            device_kind=comm.groups[0][0].device_kind,
                            capacity_bytes=comm.capacity_bytes, candidates=candidates)


def choose_for(comm, nbytes: int) -> str:
    """What algorithm="auto" runs for a message of `nbytes` over `comm`."""
    return choose_kernel(comm, "auto", nbytes)


def choose_norm_path(comm, nbytes: int, candidates: tuple = _NORM_PATHS) -> str:
    """Which path of all_reduce_rms_norm (one of `candidates`, a subset of
    NORM_PATHS) the table predicts fastest for a call of `nbytes` of x over
    communicator `comm`; ties go to the earlier candidate, so the fused
    kernel wins a tie."""
    device_kind = comm.groups[0][0].device_kind
    table = table_for(comm.platform, device_kind, comm.world_size)
    predictions = {p: table.call_us(p, nbytes) for p in candidates}
    best = min(candidates, key=lambda p: predictions[p])
    config.log_once(
        ("norm path", comm.platform, device_kind, comm.world_size, _size_class(nbytes), best,
         candidates, table.source),
        f"jax_ar: all_reduce_rms_norm of {nbytes} bytes over {comm.world_size} "
        f"{device_kind or comm.platform} ranks -> {best} (predicted "
        + ", ".join(f"{p} {t:.1f} us" for p, t in predictions.items())
        + f"; table: {table.source})")
    return best


# --- Compositions over several mesh axes ------------------------------------
# The cross-host all-reduce, until measured. GPU: published figures for one
# 400 Gb/s NIC per GPU (HGX H100/H200 nodes): about 45 GB/s bus bandwidth in
# nccl-tests across nodes and 25 us of latency. CPU processes: gloo over TCP,
# the table's psum curve.
_ACROSS_GPU_LATENCY_US = 25.0
_ACROSS_GPU_BUS_BYTES_PER_US = 45e3


def _across_us(platform: str, device_kind, hosts: int, nbytes: int) -> float:
    if hosts <= 1:
        return 0.0
    if platform == "gpu":
        moved = 2 * (hosts - 1) / hosts * nbytes  # a ring all-reduce's traffic per rank
        return _ACROSS_GPU_LATENCY_US + moved / _ACROSS_GPU_BUS_BYTES_PER_US
    # The psum curve of `hosts` ranks: JAX_AR_TABLE's file, if any, is the
    # communicator's (another world size, which would be rejected).
    return predict_us(table_for(platform, device_kind, hosts, named_file=False), "psum", nbytes)


def _half_us(table, nbytes: int, capacity) -> float:
    """A reduce-scatter or an all-gather alone: half of two-shot's traffic;
    most of its latency, since each is a launch and a full handshake."""
    latency = predict_us(table, "twoshot", 0)
    traffic = predict_us(table, "twoshot", nbytes, capacity) - latency
    return 0.75 * latency + 0.5 * traffic


def predict_compositions_us(platform: str, inner: int, outer: int, nbytes: int, *,
                            device_kind: str | None = None,
                            capacity_bytes=None) -> dict[str, float]:
    """Predicted time of each composition for `nbytes` over `inner` ranks in
    a host and `outer` hosts (the product of the outer axes' sizes);
    `capacity_bytes(kernel)` is what one round of the inner communicator's
    workspace carries (Communicator.capacity_bytes)."""
    table = table_for(platform, device_kind, inner)
    capacity = capacity_bytes or (lambda kernel: None)
    inside = min(predict_us(table, k, nbytes, capacity(k))
                 for k in candidates_for(platform, "auto", psum=False))
    share = -(-nbytes // inner)
    return {
        "allreduce_psum": inside + _across_us(platform, device_kind, outer, nbytes),
        "scatter_psum_gather": 2 * _half_us(table, nbytes, capacity("twoshot"))
                               + _across_us(platform, device_kind, outer, share),
    }


def choose_composition(comm, hosts: int, nbytes: int, axes) -> str:
    """The composition predicted faster for `nbytes` over `axes`: `comm`'s
    ranks inside each of `hosts` hosts (logged once per size class)."""
    predictions = predict_compositions_us(comm.platform, comm.world_size, hosts, nbytes,
                                          device_kind=comm.groups[0][0].device_kind,
                                          capacity_bytes=comm.capacity_bytes)
    best = min(COMPOSITIONS, key=lambda c: predictions[c])
    config.log_once(
        ("composition", comm.platform, comm.world_size, hosts, _size_class(nbytes), best),
        f"jax_ar: {nbytes} bytes over {axes} ({comm.world_size} ranks per host x {hosts}) "
        f"-> {best} (predicted " + ", ".join(f"{c} {t:.1f} us" for c, t in predictions.items())
        + ")")
    return best


def _size_class(nbytes: int) -> int:
    return max(0, nbytes - 1).bit_length()  # log once per power-of-two class
