"""The shipped cost tables: what algorithm="auto" uses on a machine that
`python -m jax_ar tune` has not measured."""
from __future__ import annotations

from .table import CostCurve, Segment, Table

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
# twoshot_ll, the two-shot over LL packets: no fence and no flag round per
# block, but 16 bytes moved per 8 of data. Not measured apart yet (the CUDA
# handler used to choose it by size alone), so its shipped curve reproduces
# that rule: two-shot's line a hair (_LL_EDGE_US) cheaper up to
# _TWO_SHOT_LL_MAX_BYTES per call, then twice as steep as two-shot's
# (the packets' cost per byte) and above it. `tune` fits it from the calls
# that ran it.
_TWO_SHOT_LL_MAX_BYTES = 1 << 20
_LL_EDGE_US = 0.01


def _two_shot_ll(latency: float, us_per_mb: float) -> CostCurve:
    edge_us = us_per_mb * _TWO_SHOT_LL_MAX_BYTES / 1e6
    return CostCurve((Segment(_TWO_SHOT_LL_MAX_BYTES, latency - _LL_EDGE_US, us_per_mb),
                      Segment(None, latency + _LL_EDGE_US - edge_us, 2 * us_per_mb)))


def _gpu_defaults(n: int) -> dict:
    ring = 2 * (n - 1) / n
    two_shot_latency, two_shot_slope = 12.0 + 1.0 * n, 3.7 * ring
    return {
        "oneshot": CostCurve.linear(8.0 + 0.6 * n, 20.0 * (n - 1)),
        "twoshot_ll": _two_shot_ll(two_shot_latency, two_shot_slope),
        "twoshot": CostCurve.linear(two_shot_latency, two_shot_slope),
        "psum": CostCurve.linear(17.0 + 1.0 * n, 4.0 * ring),
        **_gpu_norm_defaults(n),
    }


# all_reduce_rms_norm's paths on the GPU, per call, through the figures of
# docs/rms_norm.md (2 ranks sharing one H200 under MPS, bfloat16, hidden 4096
# and 8192, 1-2048 tokens, 2026-12-01; docs/results/
# rms_norm_fused_h200_mps2_bf16_2026-12-01.json): "composed" is the measured
# jax_ar.all_reduce + jax_ar.rms_norm; "fused_twoshot" the fused call from
# 1 MB, where the table of that day sent it two-shot; "fused_oneshot" the
# fused call up to 256 KB (one-shot there). Not measured, guessed so that
# the order stays the all-reduce's: two-shot below 1 MB (11 us at the
# smallest, above one-shot) and one-shot from 1 MB (16 us there, above
# two-shot, 8 us/MB beyond). The choice these reproduce: fused up to
# 4 MB (1.1-1.3x faster than the pair), the pair at 8 and 16 MB (0.89-0.90x),
# fused again at 32 MB (1.07x; noise, or a real trend: not looked into).
# Other world sizes were not measured: the same curves plus 1 us per rank
# beyond two on every path, so the choice stays that of two ranks. The lead
# refits these from the next GPU run (`python -m jax_ar tune`).
_GPU_FUSED_ONESHOT = ((8192, 8.0), (262144, 9.7), (1048576, 16.0))
_GPU_FUSED_TWOSHOT = ((8192, 11.0), (1048576, 13.46), (2097152, 17.24), (4194304, 28.77),
                      (8388608, 60.95), (16777216, 130.32), (33554432, 203.06))
_GPU_COMPOSED = ((131072, 9.5), (262144, 10.48), (1048576, 17.37), (2097152, 19.94),
                 (4194304, 29.19), (8388608, 54.51), (16777216, 117.04), (33554432, 216.88))


def _gpu_norm_defaults(n: int) -> dict:
    extra = 1.0 * (n - 2)
    return {
        "fused_oneshot": CostCurve.through(_GPU_FUSED_ONESHOT, extra),
        "fused_twoshot": CostCurve.through(_GPU_FUSED_TWOSHOT, extra),
        "composed": CostCurve.through(_GPU_COMPOSED, extra),
    }


# CPU devices: ranks are processes copying through POSIX shared memory; psum
# goes through gloo over localhost TCP. (latency us, us/MB) per round at 2
# and at 4 ranks; other world sizes follow the straight line through the
# two (a guess beyond 4). All on the project's 2-core VM, shared with other
# engineers' test runs (load average 6-21 on its 2 cores).
# 2 ranks, refitted 2026-12-01 (issue 22) to an interleaved timing of bench's
# programs (jax_ar/tools/bench_rank.py: float32 sum, chains of 10; the three
# algorithms of one size timed in turn, alternating their order, 16 rounds
# from 1K to 1M and 6 from 2M to 64M over 2 runs; load average 12-15). By the
# median time at each size: one-shot fastest up to 32K (1.02-2.0x over the
# next; a tie at 32K), two-shot from 64K to 1M (1.01-1.7x), psum from 2M
# (1.3-2.0x; two-shot needs several rounds of the 8 MiB workspace there, 2 MB
# each). One-shot's slope is its 256K-1M one (one round); two-shot's, 3500
# us/MB, is above its one-round 2650 so that its rounds cost what it measured
# from 2M (3.4-5.0 ms/MB); psum's line goes through 2M-64M; the latencies put
# one-shot/two-shot at about 48K. Five sequential bench runs of the same day
# (load 10-21) disagreed at 8K-32K (two-shot 1.1-1.4x ahead) and had psum
# ahead from 128K: at such loads rankings move from run to run, which is why
# the interleaved timing decided. The issue reported a run in which two-shot
# was 1.13-1.38x ahead of psum from 4M: on a quieter machine jax_ar's spinning
# ranks lose their core less often, so psum may take over later there; tune
# such a machine.
# 4 ranks: the fit of 2026-12-01 before that (10 runs of the bench, load
# average 6-8, docs/benchmarks.md): one-shot up to 32K, two-shot, psum from
# 2M.
_CPU_FIT = {
    "oneshot": ((100.0, 3957.0), (540.0, 14250.0)),
    "twoshot": ((122.0, 3500.0), (963.0, 5229.0)),
    "psum": ((1000.0, 2950.0), (6500.0, 2550.0)),
}


def _cpu_defaults(n: int) -> dict:
    t = (n - 2) / 2  # 0 at 2 ranks, 1 at 4
    curves = {a: CostCurve.linear(l2 + (l4 - l2) * t, b2 + (b4 - b2) * t)
              for a, ((l2, b2), (l4, b4)) in _CPU_FIT.items()}
    return {**curves, **_cpu_norm_defaults(n)}


# all_reduce_rms_norm's paths on CPU devices, per call, refitted 2026-12-01
# (issue 22): `benchmarks/interleaved.py --mode rms_norm` on 2 ranks of the
# 2-core VM (load average about 12), float32 and bfloat16, hidden
# min(4096, elements), 16 rounds from 1K to 128K and 6 from 256K to 4M over
# 2 runs, with the all-reduce defaults above (the pair's all-reduce is
# "auto"). Each point is the geometric mean of the two dtypes' median
# times, made non-decreasing. The pair jax_ar.all_reduce + jax_ar.rms_norm
# ("composed") was the fastest path, or within 4% of it, at every size in
# both dtypes (bfloat16 at 2K: 13%), except 64K, where fused two-shot is 2%
# ahead (a tie); the fused kernel carries float32 copies of x through shared
# memory and allocates them per call. (The earlier fit, tune's curves of one
# run, sent 1K-64K to fused two-shot, 1.5-3.9x slower than the pair.) Other
# world sizes: the same curves scaled by n / 2 (the ranks share two cores),
# so the choice, and the paths CI exercises, stay those of two ranks.
_CPU_FUSED_ONESHOT = ((1024, 170), (8192, 253), (16384, 481), (32768, 735), (65536, 1307),
                      (131072, 3763), (262144, 5075), (524288, 11072), (1048576, 22308),
                      (2097152, 54454), (4194304, 95463))
_CPU_FUSED_TWOSHOT = ((1024, 210), (8192, 296), (16384, 470), (32768, 673), (65536, 1042),
                      (131072, 3479), (262144, 5050), (524288, 9481), (1048576, 20467),
                      (2097152, 46661), (4194304, 86330))
_CPU_COMPOSED = ((1024, 124), (8192, 216), (16384, 414), (32768, 596), (65536, 1066),
                 (131072, 2949), (262144, 4015), (524288, 7882), (1048576, 18867),
                 (2097152, 45131), (4194304, 80249))


def _cpu_norm_defaults(n: int) -> dict:
    scaled = lambda points: tuple((b, t * n / 2) for b, t in points)  # noqa: E731
    return {
        "fused_oneshot": CostCurve.through(scaled(_CPU_FUSED_ONESHOT)),
        "fused_twoshot": CostCurve.through(scaled(_CPU_FUSED_TWOSHOT)),
        "composed": CostCurve.through(scaled(_CPU_COMPOSED)),
    }


_DEFAULTS = {"cpu": (_cpu_defaults, "CPU shared memory"),
             "gpu": (_gpu_defaults, "H100/H200 NVLink, published figures")}


def default_table(platform: str, device_kind: str, world: int) -> Table:
    make, label = _DEFAULTS.get(platform, _DEFAULTS["gpu"])
    return Table(platform, device_kind, world, make(world), f"defaults ({label})")
