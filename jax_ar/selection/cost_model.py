"""Which algorithm serves an all-reduce: a cost model evaluated at trace time.

In the spirit of NCCL's getAlgoInfo: for each candidate (oneshot, twoshot,
psum) the predicted time is latency + bytes x inverse bandwidth, read from
the table of this (platform, device kind, world size); the cheapest wins,
ties going to the earlier candidate. A message larger than what one round
of the workspace carries (Communicator.capacity_bytes) is predicted as that
many rounds. The inputs are static shapes, the communicator's configuration
and the table, so every rank decides the same.

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
from .table import NORM_PATHS as _NORM_PATHS, TABLE_ENV, Table, load_table, table_path

__all__ = ["CANDIDATES", "NORM_PATHS", "choose_algorithm", "choose_for", "choose_norm_path",
           "clear_cache", "predict_all", "predict_us", "table_for"]

CANDIDATES = ("oneshot", "twoshot", "psum")
NORM_PATHS = _NORM_PATHS

# --- Which table ------------------------------------------------------------
_lock = threading.Lock()
_tables: dict = {}


def table_for(platform: str, device_kind: str | None, world: int) -> Table:
    """The table serving this key (loaded once per process and key).
    Raises TableError for a bad file; a bad file is never skipped."""
    override = os.environ.get(TABLE_ENV, "").strip()
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
                capacity_bytes: Callable[[str], int] | None = None) -> dict:
    return {a: predict_us(table, a, nbytes, capacity_bytes(a) if capacity_bytes and a != "psum"
                          else None)
            for a in CANDIDATES}


def choose_algorithm(platform: str, world: int, nbytes: int, *, device_kind: str | None = None,
                     capacity_bytes: Callable[[str], int] | None = None,
                     candidates: tuple = CANDIDATES) -> str:
    """The candidate with the lowest predicted time (ties go to the earlier
    one in CANDIDATES). `capacity_bytes(algorithm)` is what one round
    carries (Communicator.capacity_bytes); None means unlimited."""
    table = table_for(platform, device_kind, world)
    predictions = predict_all(table, nbytes, capacity_bytes)
    best = min(candidates, key=lambda a: predictions[a])
    size_class = max(0, nbytes - 1).bit_length()  # log once per power-of-two class
    config.log_once(
        ("choice", platform, device_kind, world, size_class, best, table.source),
        f"jax_ar: {nbytes} bytes over {world} {device_kind or platform} ranks -> {best} "
        f"(predicted " + ", ".join(f"{a} {t:.1f} us" for a, t in predictions.items())
        + f"; table: {table.source})")
    return best


def choose_for(comm, nbytes: int) -> str:
    """choose_algorithm for a message of `nbytes` over communicator `comm`
    (its platform, world size, device kind and workspace rounds)."""
    candidates = tuple(a for a in CANDIDATES if a != "psum" or not comm.psum_unavailable)
    return choose_algorithm(comm.platform, comm.world_size, nbytes,
                            device_kind=comm.groups[0][0].device_kind,
                            capacity_bytes=comm.capacity_bytes, candidates=candidates)


def choose_norm_path(comm, nbytes: int, candidates: tuple = _NORM_PATHS) -> str:
    """Which path of all_reduce_rms_norm (one of `candidates`, a subset of
    NORM_PATHS) the table predicts fastest for a call of `nbytes` of x over
    communicator `comm`; ties go to the earlier candidate, so the fused
    kernel wins a tie."""
    device_kind = comm.groups[0][0].device_kind
    table = table_for(comm.platform, device_kind, comm.world_size)
    predictions = {p: table.call_us(p, nbytes) for p in candidates}
    best = min(candidates, key=lambda p: predictions[p])
    size_class = max(0, nbytes - 1).bit_length()
    config.log_once(
        ("norm path", comm.platform, device_kind, comm.world_size, size_class, best,
         candidates, table.source),
        f"jax_ar: all_reduce_rms_norm of {nbytes} bytes over {comm.world_size} "
        f"{device_kind or comm.platform} ranks -> {best} (predicted "
        + ", ".join(f"{p} {t:.1f} us" for p, t in predictions.items())
        + f"; table: {table.source})")
    return best
