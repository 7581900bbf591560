"""The shipped cost tables: what algorithm="auto" uses on a machine that
`python -m jax_ar tune` has not measured."""
from __future__ import annotations

import bisect

from .table import CostCurve, Table

__all__ = ["default_table"]

# GPU, all_reduce's kernels, per round. The one-shot and the LL two-shot
# per call, measured at 2, 4 and 8 ranks sharing one H200 under MPS
# (`benchmarks/per_call_overhead.py`, bfloat16, 300 dependent calls a
# program, median of 3; the one-shot through jax_ar.all_reduce, the LL
# two-shot through its protocol-probe stage, which costs within 1-2% of a
# call), one command from 1 KB to 4 MB with the modules of 7c5595e
# (2026-12-04, docs/results/latency_h200_mps_2026-12-04_7c5595e_tables_ladder.jsonl,
# variant "tables"). From 3 ranks both read two ranks' packets at once
# since 23d8b27 and 60e9ec3: against the curves before these (18fb78e's
# kernels, 2026-12-03) they cost 3.5-17% less at 4 and 8 ranks, and
# 1.5-9.6% less at 2 ranks, where the kernels read one rank at a time as
# they did (the runs' spread). The plain two-shot, whose kernel has not
# changed, keeps the medians of 2026-12-03's commands with 18fb78e's
# modules (docs/results/latency_h200_mps_2026-12-03_aa101bd.jsonl, variant
# "paths", 1 KB-4 MB; ..._6b99a26_auto.jsonl, 64 KB-2 MB;
# ..._b229857_r4.jsonl, 4 ranks at 512 KB-1 MB).
# The one-shot's points are whole rounds of the default 64 MiB workspace
# (it carries 2095104 / 1047552 / 523776 bytes a round at 2 / 4 / 8
# ranks), so a size past its round is a whole number of rounds, whose time
# per call stands at that size (predict_us never asks for a round larger
# than the workspace's). The two-shots' points up to 1 MB are powers of
# two (b69fdb4 cuts the LL two-shot's chunks at multiples of 512 bytes, so
# 523264 bytes cost what 524288 do, docs/latency_log.md "Latency,
# fifteenth push"); from 2 MB they are whole LL rounds (2095104 bytes).
# Ranks sharing one GPU say little of NVLink's bandwidth: their traffic
# stays in one HBM (faster than NVLink at 2 ranks, shared by all at 8).
# So the plain two-shot, the bandwidth kernel, costs at each size the more
# of what they measured and its line fitted to `python -m jax_ar bench` on
# 2 H200s joined by NVLink (one process per GPU, bfloat16, 1K-64M,
# 2026-11-29, docs/results/: ~14 us and 3.7 us/MB), grown with the world
# size as a ring's traffic, 2(n-1)/n, and by about 1 us a rank. psum
# (NCCL), which cannot run on ranks sharing a GPU, keeps that run's line:
# ~19 us and 4.0 us/MB, grown the same way. What the curves choose:
#   2 ranks  the one-shot up to 4 MB (at 4 MB, 2 rounds, the plain
#            two-shot measured 18.4 us against 24.3, but its NVLink line
#            says 29.5), the plain two-shot at 8 MB, psum from 16 MB;
#   4 ranks  the one-shot up to 128 KB, the LL two-shot at 256 KB-1 MB
#            (at 256 KB 9.16 us against the one-shot's 9.30), the plain
#            two-shot from 2 MB (where psum runs, its line alone takes 2-4
#            MB and from 16 MB);
#   8 ranks  the one-shot up to 64 KB (10.75 us against 13.34), the LL
#            two-shot at 128 KB-1 MB (at 1 MB 43.6 us against the plain
#            two-shot's 52.4; the curves before these had them tied), the
#            plain two-shot from 2 MB (psum from 1 MB where it runs).
# Other world sizes: _curve_across_worlds, below. `python -m jax_ar tune`
# refits every curve on a machine.
_GPU_ONE_SHOT_SIZES = (1024, 4096, 16384, 65536, 131072, 262144, 523264, 1047552, 2095104,
                       4190208)
_GPU_TWO_SHOT_SIZES = (1024, 4096, 16384, 65536, 131072, 262144, 524288, 1048576, 2095104,
                       4190208)
_GPU_KERNEL_SIZES = {"oneshot": _GPU_ONE_SHOT_SIZES, "twoshot_ll": _GPU_TWO_SHOT_SIZES,
                     "twoshot": _GPU_TWO_SHOT_SIZES}
_GPU_KERNEL_US = {
    2: {"oneshot": (3.94, 3.90, 4.16, 4.40, 4.84, 5.17, 6.25, 8.02, 12.16, 24.33),
        "twoshot_ll": (4.87, 4.70, 5.00, 5.36, 5.46, 5.93, 7.59, 12.33, 22.41, 44.91),
        "twoshot": (8.60, 8.86, 9.20, 11.15, 11.43, 11.33, 11.61, 11.73, 13.11, 18.36)},
    4: {"oneshot": (4.64, 5.28, 5.44, 6.18, 7.23, 9.30, 14.06, 24.63, 43.69, 87.44),
        "twoshot_ll": (7.61, 7.15, 7.71, 8.31, 8.46, 9.16, 12.18, 20.49, 41.11, 92.02),
        "twoshot": (22.95, 22.54, 22.55, 27.20, 27.26, 27.06, 28.13, 28.30, 34.05, 46.32)},
    8: {"oneshot": (6.83, 7.33, 7.66, 10.75, 17.04, 27.92, 58.08, 115.94, 231.45, 460.89),
        "twoshot_ll": (13.12, 12.36, 12.81, 13.34, 13.75, 14.93, 22.78, 43.64, 126.46,
                       256.76),
        "twoshot": (45.87, 38.04, 38.90, 44.40, 49.81, 50.08, 55.79, 52.44, 69.34, 104.65)},
}


def _gpu_defaults(n: int) -> dict:
    ring = 2 * (n - 1) / n
    measured = {k: _curve_across_worlds(sizes, {w: t[k] for w, t in _GPU_KERNEL_US.items()}, n)
                for k, sizes in _GPU_KERNEL_SIZES.items()}
    nvlink = CostCurve.linear(12.0 + 1.0 * n, 3.7 * ring)
    return {
        "oneshot": measured["oneshot"],
        "twoshot_ll": measured["twoshot_ll"],
        "twoshot": CostCurve.through(tuple(
            (s, max(measured["twoshot"].predict(s), nvlink.predict(s)))
            for s in _GPU_TWO_SHOT_SIZES)),
        "psum": CostCurve.linear(17.0 + 1.0 * n, 4.0 * ring),
        **_gpu_norm_defaults(n),
    }


# all_reduce_rms_norm's paths on the GPU, per call, measured at 2, 4 and 8
# ranks sharing one GPU under MPS (bfloat16): from 16 to 512 KB every
# path in one command on one H100 with the modules of 55bfd29 (2026-12-05,
# docs/results/latency_h100_mps_2026-12-05_55bfd29_norm_paths.jsonl:
# `benchmarks/per_call_overhead.py`, 300 dependent calls a program, median
# of 3), since the fused two-shot over LL packets spreads a group row over
# a cluster and its phase 1 carries residual_out and the rows' inverse RMS
# (0.34-0.80x its earlier time); at 1 MB on one H200 with those modules
# and the LL two-shot up to 2 MB (fllmax, 2026-12-05,
# ..._55bfd29_fllmax_auto.jsonl, median of 3); at 2 MB on one H200 with
# the modules of 7c5595e (2026-12-04, ..._7c5595e_norm_paths.jsonl, the
# same benchmark); from 4 MB `bench --op rms_norm` with those of 8320dec
# (docs/results/bench_rms_norm_h200_mps_2026-12-03_8320dec.txt; "fused"
# there is the two-shot). "composed" is the pair jax_ar.all_reduce +
# jax_ar.rms_norm. The fused one-shot and the pair are hidden 4096's; the
# fused two-shot, whose kernel runs rows of more than 4096 16-bit elements
# differently, the slower of hidden 4096 and 8192 up to 2 MB (the curves
# know bytes, not the row length). Up to 1 MB it is the LL kernel (calls
# that fit one launch of it, rows of one or two vectors a thread); from 2
# MB the plain kernel's, whose times at hidden 8192 were 0.98-1.27x its
# hidden-4096 times at 512 KB-2 MB (..._5d5e66a_auto_check.jsonl). What
# the points choose:
#   2 ranks  fused one-shot up to 512 KB (7.67 us there against the
#            two-shot's 7.86 and 8.36), fused two-shot 1-4 MB (at 1 MB
#            10.09 against the one-shot's 10.81), pair from 8 MB;
#   4 ranks  fused one-shot up to 256 KB, fused two-shot 512 KB-4 MB (at
#            1 MB 20.07 against the pair's 25.78), pair from 8 MB;
#   8 ranks  fused one-shot up to 64 KB, the pair at 128 and 256 KB (at
#            256 KB 20.60 us against the two-shot's 20.68 and 20.92), the
#            two-shot 512 KB-4 MB (at 1 MB 38.52 against the pair's
#            52.42), pair from 8 MB.
# Between 1 and 2 MB the curves run straight while the kernels do not:
# at 1.5 MB (same file) the fused one-shot, the pair and the LL two-shot
# took 14.09 / 14.55 / 14.99 us at 2 ranks and hidden 4096 (15.77 /
# 14.61 / 15.11 at 8192), where the curves pick the two-shot.
# The fused one-shot's time grows with the ranks far faster than the
# others' (every rank reads every peer's rows as LL packets), which one
# curve plus 1 us a rank, the tables before 8c6dcc7, missed. Not
# measured, guessed: 8 ranks beyond 4 MB, the 4-rank times doubled (the
# 8/4 ratio at 2-4 MB was 1.98-2.10 for both the two-shot and the pair,
# 2026-12-03); world sizes between those measured, the line between the
# neighbours at each size; beyond 8, the 8-rank times scaled by n / 8
# (_curve_across_worlds, which also holds a curve up where a measured
# point falls below the one before it: a curve never falls). Sizes are
# bytes of x per rank. `python -m jax_ar tune` refits them on a machine.
_GPU_NORM_SIZES = (16384, 65536, 131072, 262144, 524288, 1048576, 2097152,
                   4194304, 8388608, 16777216, 33554432)
_GPU_NORM_US = {
    2: {"fused_oneshot": (4.92, 5.03, 5.65, 6.16, 7.67, 10.81, 23.25),
        "fused_twoshot": (6.70, 7.15, 7.30, 7.51, 8.36, 10.09, 16.99,
                          33.9, 73.2, 132.7, 245.1),
        "composed": (6.93, 7.34, 7.91, 8.46, 9.68, 11.85, 22.16, 35.6, 57.5, 119.0, 213.7)},
    4: {"fused_oneshot": (6.59, 7.11, 8.06, 11.96, 18.50, 41.98, 71.44),
        "fused_twoshot": (10.29, 11.97, 12.38, 13.03, 15.09, 20.07, 43.46,
                          72.9, 158.7, 282.5, 528.4),
        "composed": (8.91, 9.94, 11.23, 13.03, 17.71, 25.78, 47.62, 79.1, 138.1, 271.0, 496.9)},
    8: {"fused_oneshot": (8.66, 13.39, 21.63, 34.80, 88.99, 142.58, 272.60),
        "fused_twoshot": (15.10, 17.67, 18.99, 20.92, 29.18, 38.52, 86.31,
                          144.2, 2 * 158.7, 2 * 282.5, 2 * 528.4),
        "composed": (11.65, 16.41, 17.51, 20.60, 30.63, 52.42, 100.24,
                     159.6, 2 * 138.1, 2 * 271.0, 2 * 496.9)},
}


def _curve_across_worlds(sizes, times_by_world: dict, n: int) -> CostCurve:
    """The curve through the times at n ranks (times_by_world: the times at
    `sizes` measured at some world sizes), made non-decreasing: on the line
    through the times of the measured world sizes around n at each size
    (below the smallest, the line of the two smallest); beyond the largest,
    its times scaled by n / largest."""
    worlds = sorted(times_by_world)
    last = worlds[-1]
    if n >= last:
        at_n = [t * n / last for t in times_by_world[last]]
    else:
        j = max(1, bisect.bisect_left(worlds, n))
        lo, hi = worlds[j - 1], worlds[j]
        at_n = [a + (b - a) * (n - lo) / (hi - lo)
                for a, b in zip(times_by_world[lo], times_by_world[hi])]
    times, top = [], 0.0
    for t in at_n:
        top = max(top, t, 1.0)
        times.append(top)
    return CostCurve.through(tuple(zip(sizes, times)))


def _gpu_norm_defaults(n: int) -> dict:
    return {path: _curve_across_worlds(_GPU_NORM_SIZES,
                                       {w: t[path] for w, t in _GPU_NORM_US.items()}, n)
            for path in ("fused_oneshot", "fused_twoshot", "composed")}


# CPU devices: ranks are processes copying through POSIX shared memory; psum
# goes through gloo over localhost TCP. Per round, at 2 and at 4 ranks,
# through the medians of `benchmarks/interleaved.py` (bench's programs:
# float32 sum, chains of 10 calls; the three algorithms of a size timed in
# turn, alternating their order; 8 rounds from 1K to 1M, 3-4 from 2M to 16M)
# on the project's 2-core VM with nothing else running (load average about
# 2: the ranks' own), 2026-12-01 (issue 22). docs/benchmarks.md has the
# table. By the median: at 2 ranks one-shot and two-shot tie at 1K, two-shot
# is fastest from 2K to 2M (1.2-1.6x over one-shot) and psum from 4M
# (1.02-1.11x); at 4 ranks one-shot up to 2K, two-shot from 4K to 4M
# (1.2-2.8x), psum at 8M (1.11x). On a machine loaded by other work (load
# average 6-21, the fits before this one) every time was 10-25x longer and
# one-shot won up to 32K: spinning ranks then lose their core; tune such a
# machine. Other world sizes: above _cpu_defaults.
# The points: one round each up to 1M (at 4 ranks one-shot's 1M takes two),
# then the cost of a full round of the two-shot workspace share (2,080,768
# bytes of the default 8 MiB at 2 and 4 ranks), chosen between what the
# 2M-8M calls of several rounds measured per round (two-shot: 2.9-3.5 ms at
# 2 ranks, 5.3-6.9 ms at 4) so that the rounds' sums rank two-shot and psum
# as measured. psum has no rounds: its points are the calls from 1M up, flat
# below 1M, where it is 2-360x slower than the kernels and its gloo round
# trips are bimodal (350-2900 us at 2 ranks); 16M at 4 ranks extends 4M-8M.
_CPU_KERNEL_SIZES = tuple(1024 << k for k in range(11)) + (2080768,)
_CPU_KERNEL_US = {
    2: {"oneshot": (6.5, 8.4, 11.7, 17.9, 29.6, 54.9, 101.2, 192.2, 348.9, 769.8, 1595.0, 3700.0),
        "twoshot": (6.7, 7.9, 9.8, 13.8, 22.1, 35.4, 64.9, 119.2, 251.3, 527.1, 1094.3, 3300.0)},
    4: {"oneshot": (54.3, 57.2, 80.4, 119.3, 178.6, 317.4, 613.0, 1177.4, 2198.0, 4362.8, 8249.3,
                    16000.0),
        "twoshot": (75.2, 77.3, 66.3, 85.2, 102.5, 151.9, 233.4, 512.9, 782.4, 1713.1, 3061.9,
                    6400.0)},
}
_CPU_PSUM_SIZES = tuple(1 << k for k in range(20, 25))  # 1M .. 16M
_CPU_PSUM_US = {2: (2064.0, 3518.0, 6376.0, 9647.0, 21245.0),
                4: (6884.0, 8115.0, 13583.0, 24927.0, 47615.0)}


# Other world sizes on CPU devices (_curve_across_worlds): up to 4 ranks on
# the line through the 2- and 4-rank times at each size; beyond, the 4-rank
# times scaled by n / 4 (the ranks share two cores, so each waits for the
# others about n times as long; a guess that keeps the 4-rank choice).
def _cpu_defaults(n: int) -> dict:
    curves = {a: _curve_across_worlds(_CPU_KERNEL_SIZES,
                                      {w: t[a] for w, t in _CPU_KERNEL_US.items()}, n)
              for a in ("oneshot", "twoshot")}
    curves["psum"] = _curve_across_worlds(_CPU_PSUM_SIZES, _CPU_PSUM_US, n)
    return {**curves, **_cpu_norm_defaults(n)}


# all_reduce_rms_norm's paths on CPU devices, per call: the medians of
# `benchmarks/interleaved.py --mode rms_norm` (float32, bench's default;
# hidden min(4096, elements); 8 rounds at 2 ranks, 5 at 4 up to 1M, 3-4 at
# 2M-4M) on the same quiet VM the same day, with the all-reduce defaults
# above (the pair's all-reduce is "auto"). The pair jax_ar.all_reduce +
# jax_ar.rms_norm ("composed") was the fastest of jax_ar's paths at every
# size from 1K to 2M at both world sizes (fused two-shot within 1-2% at
# 512K-1M at 4 ranks); at 4M, 2 ranks, fused two-shot was 3% ahead (the
# curves pick it there). From 2M psum + jnp norm (not one of auto's
# paths) was 1.0-1.7x faster than all of them. The fused CPU handler
# carries float32 copies of x through shared memory. bfloat16
# (measured too, docs/benchmarks.md) costs the CPU kernels more per byte:
# there fused two-shot was 3-12% ahead of the pair at 16K-128K, and from
# 256K psum + jnp norm, which no path of jax_ar's beats on CPU. Other world
# sizes: above _cpu_defaults.
_CPU_NORM_SIZES = tuple(1024 << k for k in range(13))  # 1K .. 4M
_CPU_NORM_US = {
    2: {"fused_oneshot": (28.9, 34.1, 42.2, 52.8, 110.0, 250.0, 248.7, 765.5, 857.9, 1984.0,
                          3281.8, 6724.0, 14864.2),
        "fused_twoshot": (35.5, 33.0, 41.3, 49.5, 98.8, 222.8, 203.3, 710.7, 747.4, 1710.5,
                          2889.7, 5892.5, 12602.8),
        "composed": (8.4, 9.9, 18.9, 23.6, 82.1, 197.5, 181.3, 672.2, 699.0, 1317.2, 2837.4,
                     5374.6, 13013.0)},
    4: {"fused_oneshot": (81.3, 154.7, 136.7, 213.3, 355.5, 600.1, 893.1, 1711.4, 3538.1, 6494.4,
                          12318.5, 26905.5, 53876.2),
        "fused_twoshot": (90.6, 145.7, 130.4, 175.7, 241.6, 317.7, 535.7, 954.0, 1989.5, 3464.3,
                          6758.7, 13910.3, 30290.2),
        "composed": (71.4, 101.2, 85.2, 128.2, 225.7, 267.1, 521.4, 884.4, 1970.5, 3443.1,
                     6578.3, 13055.0, 27051.6)},
}


def _cpu_norm_defaults(n: int) -> dict:
    return {path: _curve_across_worlds(_CPU_NORM_SIZES,
                                       {w: t[path] for w, t in _CPU_NORM_US.items()}, n)
            for path in ("fused_oneshot", "fused_twoshot", "composed")}


_DEFAULTS = {"cpu": (_cpu_defaults, "CPU shared memory"),
             "gpu": (_gpu_defaults, "H200 under MPS, two-shot and psum held to 2-GPU NVLink "
                                    "lines")}


def default_table(platform: str, device_kind: str, world: int) -> Table:
    make, label = _DEFAULTS.get(platform, _DEFAULTS["gpu"])
    return Table(platform, device_kind, world, make(world), f"defaults ({label})")
