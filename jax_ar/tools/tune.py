"""python -m jax_ar tune: measure this machine and write its algorithm table.

Times oneshot, twoshot and psum (float32 sum) across sizes with the same
ranks and method as `bench`, fits one cost curve per kernel (as the rows
that ran it: on CUDA "twoshot" runs twoshot_ll or the plain two-shot) and writes
the table as JSON to --out, else $JAX_AR_TABLE, else the cache directory
(selection.table.table_path: keyed by platform, device kind and world size), where
later runs find it. The curve of jax_ar's kernels describes one workspace
round, so it is fitted on sizes up to what one round carries (that size is
measured too, as the ranks' communicator reports it); selection predicts
larger messages as several rounds.

It also times all_reduce_rms_norm's paths (bfloat16, hidden NORM_HIDDEN,
whole calls, rounds included): the fused kernel forced to each protocol and
the pair jax_ar.all_reduce + jax_ar.rms_norm, fitted to the curves
fused_oneshot, fused_twoshot and composed that algorithm="auto" chooses by.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import shlex
import sys

import numpy as np

from .. import selection
from . import sweep
from .bench_data import DTYPES
from .timing import typical_spread
from ..selection.table import (TABLE_ENV, CostCurve, Segment, Table, load_table, table_path,
                     table_to_json)
from .._version import __version__

__all__ = ["fit_curve", "main"]

MAX_BYTES = {"cpu": "4M", "gpu": "256M"}
MAX_KNOTS = 4  # interior knots at most: more would fit noise
NORM_HIDDEN = 4096  # the norm paths are measured at this hidden size (bfloat16)
NORM_DTYPE = "bfloat16"
NORM_ITEMSIZE = DTYPES[NORM_DTYPE].itemsize
# Each norm path's curve, from the bench variant that times it (bench_rank).
NORM_VARIANTS = {"fused_oneshot": "fused_oneshot", "fused_twoshot": "fused_twoshot",
                 "composed": "all_reduce+rms_norm"}
MIN_KNOT_GAP = 3  # measured sizes from one knot to the next: one outlier is no knot


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m jax_ar tune",
        description="Measure oneshot, twoshot and psum on this machine, fit the cost model and "
                    "write the algorithm table that algorithm='auto' uses.")
    sweep.add_common_options(p, "largest message per rank (default 256M on GPU, 4M on CPU)")
    p.add_argument("--out", default=None,
                   help=f"table file to write (default: ${TABLE_ENV}, else the cache directory)")
    return p


def fit_curve(points) -> CostCurve:
    """A monotone, continuous piecewise-linear fit of measured (bytes, us).

    Knots sit at measured sizes; the values at the knots are least-squares
    fits in relative error (small and large messages count alike). Among
    0 to MAX_KNOTS interior knots, the placement with the best Bayesian
    information criterion wins, knots at least MIN_KNOT_GAP sizes apart: a
    knot must reduce the error more than noise would, so measurement noise
    (one slow sample on a busy machine) is not mistaken for structure. Knot values are then made non-decreasing (pool adjacent
    violators), which keeps predictions monotone in size. The curve is flat
    below the smallest size and its last line extends beyond the largest.
    """
    by_size = {}
    for b, t in points:  # a size measured twice counts once, averaged
        by_size.setdefault(int(b), []).append(float(t))
    points = sorted((b, sum(ts) / len(ts)) for b, ts in by_size.items())
    if not points:
        raise ValueError("no measurements to fit")
    sizes = np.array([b for b, _ in points], np.float64)
    times = np.array([t for _, t in points], np.float64)
    if len(points) == 1:
        return CostCurve((Segment(None, float(times[0]), 0.0),))
    best = None
    interior = range(1, len(points) - 1)
    for count in range(0, min(MAX_KNOTS, len(points) - 2) + 1):
        for chosen in itertools.combinations(interior, count):
            index = [0, *chosen, len(points) - 1]
            if count and any(b - a < MIN_KNOT_GAP for a, b in zip(index, index[1:])):
                continue
            knots = sizes[index]
            values, error = _spline_fit(knots, sizes, times)
            # Bayesian information criterion: a knot must pay for itself.
            score = len(points) * np.log(max(error, 1e-6) ** 2) + len(knots) * np.log(len(points))
            if best is None or score < best[2]:
                best = (knots, values, score)
    knots, values, _ = best
    values = _non_decreasing(values)
    segments = [Segment(int(knots[0]), float(values[0]), 0.0)]
    for j in range(len(knots) - 1):
        slope = (values[j + 1] - values[j]) / (knots[j + 1] - knots[j])
        last = j == len(knots) - 2
        segments.append(Segment(None if last else int(knots[j + 1]),
                                float(values[j] - slope * knots[j]), float(slope * 1e6)))
    merged = [segments[0]]
    for segment in segments[1:]:  # neighbours on one line (equal knot values) merge
        prev = merged[-1]
        if (abs(segment.latency_us - prev.latency_us) <= 1e-9 * max(1.0, abs(prev.latency_us))
                and abs(segment.us_per_mb - prev.us_per_mb) <= 1e-9 * max(1.0, prev.us_per_mb)):
            merged[-1] = Segment(segment.up_to_bytes, prev.latency_us, prev.us_per_mb)
        else:
            merged.append(segment)
    return CostCurve(tuple(merged))


def _spline_fit(knots, sizes, times):
    """(knot values, RMS relative error) of the linear spline through `knots`
    fitted to (sizes, times); beyond the ends the end lines extend."""
    basis = np.zeros((len(sizes), len(knots)))
    for i, s in enumerate(sizes):
        j = min(max(int(np.searchsorted(knots, s, side="right")) - 1, 0), len(knots) - 2)
        w = (s - knots[j]) / (knots[j + 1] - knots[j])
        basis[i, j], basis[i, j + 1] = 1.0 - w, w
    weight = 1.0 / times
    values, *_ = np.linalg.lstsq(basis * weight[:, None], times * weight, rcond=None)
    error = float(np.sqrt(np.mean(((basis @ values) - times) ** 2 * weight ** 2)))
    return values, error


def _non_decreasing(values):
    blocks = []  # [mean, weight]: pool adjacent violators
    for v in values:
        blocks.append([float(v), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2 = blocks.pop()
            blocks[-1] = [(blocks[-1][0] * blocks[-1][1] + v2 * w2) / (blocks[-1][1] + w2),
                          blocks[-1][1] + w2]
    return [max(mean, 0.0) for mean, weight in blocks for _ in range(weight)]


def _summary(table: Table, capacity: dict, measured: dict) -> str:
    lines = [f"# algorithm table for {table.world_size} x {table.device_kind} ({table.platform})"]
    for name, curve in table.curves.items():
        lines.append(f"#   {name}:")
        lower = 0
        for s in curve.segments:
            upper = s.up_to_bytes
            span = (f"{sweep.format_size(lower)}B..{sweep.format_size(upper)}B" if upper
                    else f"above {sweep.format_size(lower)}B")
            ends = (f"{s.predict(lower):.1f} -> {s.predict(upper):.1f} us" if upper
                    else f"{s.predict(lower):.1f} us + {s.us_per_mb:.2f} us/MB")
            lines.append(f"#     {span:>18}  {ends}")
            lower = upper or lower
    lines.append("#")
    lines.append(_norm_summary(table, measured))
    lines.append("#")
    kernels = selection.candidates_for(table.platform)
    lines.append(f"# {'size':>10} " + " ".join(f"{a + ' us':>22}" for a in kernels)
                 + f" {'pick':>10}")
    lines.append(f"# {'':>10} " + " ".join(f"{'measured / predicted':>22}" for _ in kernels))
    for size in sorted({b for a in kernels for b, _ in measured.get(a, [])}):
        predicted = selection.predict_all(table, size, capacity.get)
        cells = []
        for a in kernels:
            got = dict(measured.get(a, [])).get(size)
            cells.append(f"{(f'{got:.1f}' if got else '-'):>10} / {predicted[a]:<9.1f}")
        pick = min(kernels, key=lambda a: predicted[a])
        lines.append(f"  {size:>10} " + " ".join(cells) + f" {pick:>10}")
    return "\n".join(lines)


def _norm_summary(table: Table, measured: dict) -> str:
    """all_reduce_rms_norm's paths per size: measured / predicted, and the pick."""
    paths = selection.NORM_PATHS
    title = f"# all_reduce_rms_norm ({NORM_DTYPE}, hidden {NORM_HIDDEN}), whole calls"
    sizes = sorted({b for p in paths for b, _ in measured.get(p, [])})
    if not sizes:  # no message held a row (or no row ran): a table would be empty
        return (f"{title}: none measured (a call takes at least one row of "
                f"{sweep.format_size(NORM_HIDDEN * NORM_ITEMSIZE)}B)")
    lines = [title,
             f"# {'size':>10} " + " ".join(f"{p + ' us':>24}" for p in paths) + f" {'pick':>14}"]
    for size in sizes:
        cells = []
        for p in paths:
            got = dict(measured.get(p, [])).get(size)
            cells.append(f"{(f'{got:.1f}' if got else '-'):>12} / {table.call_us(p, size):<9.1f}")
        pick = min(paths, key=lambda p: table.call_us(p, size))
        lines.append(f"  {size:>10} " + " ".join(cells) + f" {pick:>14}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        platform, gpus = sweep.resolve_platform(ns.platform)
        ranks = sweep.default_ranks(ns, platform, gpus)
        sizes = sweep.size_list(sweep.parse_size(ns.min_bytes),
                                 sweep.parse_size(ns.max_bytes or MAX_BYTES[platform]),
                                 ns.step_factor)
        config = sweep.common_config(ns, platform)
        shared = sweep.shared_gpu_reason(platform, ranks, gpus)
        unavailable = {"psum": shared} if shared else {}
    except (ValueError, sweep.SweepError) as e:
        parser.error(str(e))
    cases = []
    for algorithm in selection.CANDIDATES:
        cases += [{"dtype": "float32", "op": "sum", "count": b // 4, "bytes": b // 4 * 4,
                   "algorithm": algorithm} for b in sizes if b >= 4]
        if algorithm != "psum":  # the one-round limit itself: the fit's last point
            cases.append({"dtype": "float32", "op": "sum", "count": 0, "bytes": 0,
                          "algorithm": algorithm, "at_capacity": algorithm})
    for path, variant in NORM_VARIANTS.items():
        for b in sizes:
            tokens = b // (NORM_HIDDEN * NORM_ITEMSIZE)
            if tokens >= 1:
                cases.append({"dtype": NORM_DTYPE, "op": "rms_norm", "hidden": NORM_HIDDEN,
                              "tokens": tokens, "count": tokens * NORM_HIDDEN,
                              "bytes": tokens * NORM_HIDDEN * NORM_ITEMSIZE,
                              "algorithm": variant})
    config.update(cases=cases, unavailable=unavailable, eps=1e-6, seed=0)
    print(f"jax_ar tune: {len(cases)} measurements on {ranks} {platform.upper()} ranks ...",
          file=sys.stderr, flush=True)
    try:
        raw = sweep.run_sweep(config, ranks, platform, ns.timeout, progress_label="tune")
    except sweep.SweepStopped as e:
        print(str(e), file=sys.stderr)
        return e.exit_code
    except sweep.SweepError as e:
        print(str(e), file=sys.stderr)
        return 1
    machine, results = raw["machine"], raw["results"]
    spread = typical_spread(results)
    if spread > sweep.NOISY_SPREAD:
        print(f"jax_ar tune: warning: timing samples spread {spread:.0%} around their median "
              "(typical case); the machine is busy, so the table may follow noise. Re-run "
              "when it is idle.", file=sys.stderr)
    wrong = sum(r["wrong"] for r in results)
    if wrong:
        print(f"jax_ar tune: {wrong} elements differ from the host reference; no table written",
              file=sys.stderr)
        return 1
    if not machine["serves_calls"]:
        print(f"jax_ar tune: jax_ar falls back to psum on this machine "
              f"({machine['fallback_reason']}); nothing to tune", file=sys.stderr)
        return 1

    world, kind = machine["world_size"], machine["device_kind"]
    capacity = machine["capacity_bytes"]
    defaults_table = selection.default_table(platform, kind, world)
    measured, curves, notes = {}, {}, {}
    for algorithm in selection.candidates_for(platform):  # each kernel, as the rows that ran it
        points = [(r["bytes"], r["time_us"]) for r in results
                  if (r.get("kernel") or r["algorithm"]) == algorithm and r["op"] != "rms_norm"
                  and r["status"] == "ok"]
        measured[algorithm] = points
        usable = [p for p in points if algorithm == "psum" or p[0] <= capacity[algorithm]]
        if len(usable) >= 2:
            curves[algorithm] = fit_curve(usable)
        else:
            why = next((r["status"] for r in results if (r.get("kernel") or r["algorithm"])
                        == algorithm and r["status"] != "ok"), "too few sizes measured")
            curves[algorithm] = defaults_table.curves[algorithm]
            notes[algorithm] = f"not measured ({why}); shipped default kept"
    for name, variant in NORM_VARIANTS.items():  # whole calls: no rounds to cut at
        points = [(r["bytes"], r["time_us"]) for r in results
                  if r["algorithm"] == variant and r["op"] == "rms_norm" and r["status"] == "ok"]
        measured[name] = points
        if len(points) >= 2:
            curves[name] = fit_curve(points)
        else:
            why = next((r["status"] for r in results if r["algorithm"] == variant
                        and r["op"] == "rms_norm" and r["status"] != "ok"),
                       "too few sizes measured")
            curves[name] = defaults_table.curves[name]
            notes[name] = f"not measured ({why}); shipped default kept"
    path = ns.out or (os.environ.get(TABLE_ENV, "").strip() if
                      os.environ.get(TABLE_ENV, "").strip().lower() not in ("", "default")
                      else None) or table_path(platform, kind, world)
    table = Table(platform, kind, world, curves, path)
    doc = table_to_json(table, __version__, {
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python -m jax_ar tune " + " ".join(shlex.quote(a) for a in (argv or [])),
        "machine": machine,
        "method": {k: config[k] for k in ("iters", "launches", "min_sample_s", "repeats",
                                           "warmup")},
        "notes": notes,
        "measurements": {a: [[b, round(t, 3)] for b, t in pts] for a, pts in measured.items()},
    })
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)
    load_table(path, platform, kind, world, __version__)  # what later runs will read
    print(_summary(table, capacity, measured))
    for algorithm, note in notes.items():
        print(f"# {algorithm}: {note}")
    print(f"# wrote {path}")
    return 0
