"""The shipped cost tables: what algorithm="auto" uses on a machine that
`python -m jax_ar tune` has not measured."""
from __future__ import annotations

from .table import CostCurve, Table

__all__ = ["default_table"]

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
