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
# goes through gloo over localhost TCP. Fitted to `python -m jax_ar bench`
# (float32 sum, 1K-1M, plus -b 2M -e 8M) at 2 and 4 ranks on the project's
# 2-core VM, 10 runs each, 2026-12-01 (docs/benchmarks.md): (latency us,
# us/MB) per round at 2 and at 4 ranks. The slopes come from the large
# sizes; the latencies put the one-shot/two-shot crossover where the median
# ratio of the two within a run changes side (between 4K and 8K at 2 ranks,
# at 32K-64K at 4), and psum's line is fitted from 1M to 8M, where it wins
# once two-shot needs several rounds of the 8 MiB workspace. That machine
# was shared (load average 6-8 on 2 cores): spinning ranks lose their core
# more often than gloo's blocking ones, so an idle machine favours jax_ar's
# kernels more. Other world sizes follow the straight line through the two
# (a guess beyond 4).
_CPU_FIT = {
    "oneshot": ((50.0, 3480.0), (540.0, 14250.0)),
    "twoshot": ((57.0, 2340.0), (963.0, 5229.0)),
    "psum": ((1430.0, 1961.0), (6500.0, 2550.0)),
}


def _cpu_defaults(n: int) -> dict:
    t = (n - 2) / 2  # 0 at 2 ranks, 1 at 4
    return {a: CostCurve.linear(l2 + (l4 - l2) * t, b2 + (b4 - b2) * t)
            for a, ((l2, b2), (l4, b4)) in _CPU_FIT.items()}


_DEFAULTS = {"cpu": (_cpu_defaults, "CPU shared memory"),
             "gpu": (_gpu_defaults, "H100/H200 NVLink, published figures")}


def default_table(platform: str, device_kind: str, world: int) -> Table:
    make, label = _DEFAULTS.get(platform, _DEFAULTS["gpu"])
    return Table(platform, device_kind, world, make(world), f"defaults ({label})")
