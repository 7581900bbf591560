"""Which algorithm serves an all-reduce: a cost model evaluated at trace time.

In the spirit of NCCL's getAlgoInfo: for each candidate (oneshot, twoshot,
psum) the predicted time is latency + bytes x inverse bandwidth, read from
the table of this (platform, device kind, world size); the cheapest wins,
ties going to the earlier candidate. A message larger than what one round
of the workspace carries (Communicator.capacity_bytes) is predicted as that
many rounds. The inputs are static shapes, the communicator's configuration
and the table, so every rank decides the same.

The table is the one `python -m jax_ar tune` measured (see _table.py for
where it is looked up, JAX_AR_TABLE included), else the defaults below.
"""
from __future__ import annotations

import os
import threading
from typing import Callable

from . import config
from ._table import (TABLE_ENV, CostCurve, Table, TableError, load_table,  # noqa: F401
                     table_path)
from .communicator import VERSION

__all__ = ["CANDIDATES", "TableError", "choose_algorithm", "choose_for", "clear_cache",
           "default_table", "predict_all", "predict_us", "table_for"]

CANDIDATES = ("oneshot", "twoshot", "psum")

# --- Shipped defaults -------------------------------------------------------
# GPU: H100/H200 SXM over NVLink 4, per round. Fitted to `python -m jax_ar
# bench` on 2 H200s joined by NVLink (one process per GPU, bfloat16, 1K-64M,
# 2026-11-29, docs/results/): one-shot ~9 us and 20 us/MB (LL packets carry
# 8 data bytes in 16 and every rank reads every peer's message), two-shot ~14
# us and 3.7 us/MB, psum (NCCL) ~19 us and 4.0 us/MB. Growth with the world
# size is not measured yet (no machine with more GPUs was lent): one-shot's
# traffic grows with n-1 peers, two-shot's and NCCL's ring with 2(n-1)/n, as
# published for NCCL; every fixed cost grows by about 1 us per rank (one
# more peer to signal and wait for), keeping their order at every n.
def _gpu_defaults(n: int) -> dict:
    ring = 2 * (n - 1) / n
    return {
        "oneshot": CostCurve.linear(8.0 + 0.6 * n, 20.0 * (n - 1)),
        "twoshot": CostCurve.linear(12.0 + 1.0 * n, 3.7 * ring),
        "psum": CostCurve.linear(17.0 + 1.0 * n, 4.0 * ring),
    }


# CPU devices: ranks are processes copying through POSIX shared memory; psum
# goes through gloo over localhost TCP and never wins. Set from
# `python -m jax_ar bench` runs of 2 ranks on a 2-core x86 VM
# (docs/benchmarks.md); the growth with the world size is a guess.
def _cpu_defaults(n: int) -> dict:
    return {
        "oneshot": CostCurve.linear(10.0 + 5.0 * n, 450.0 * n),
        "twoshot": CostCurve.linear(15.0 + 5.0 * n, 350.0 * n),
        "psum": CostCurve.linear(250.0 + 100.0 * n, 600.0 * n),
    }


_DEFAULTS = {"cpu": (_cpu_defaults, "CPU shared memory"),
             "gpu": (_gpu_defaults, "H100/H200 NVLink, published figures")}


def default_table(platform: str, device_kind: str, world: int) -> Table:
    make, label = _DEFAULTS.get(platform, _DEFAULTS["gpu"])
    return Table(platform, device_kind, world, make(world), f"defaults ({label})")


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
        table = load_table(override, platform, kind, world, VERSION)
    else:
        path = table_path(platform, kind, world)
        if os.path.exists(path):
            table = load_table(path, platform, kind, world, VERSION)
        else:
            table = default_table(platform, kind, world)
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
