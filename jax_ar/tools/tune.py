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

The ranks run with JAX_AR_TABLE=default (the shipped table: where
algorithm="auto" or the two-shot's LL/plain choice needs a table while it
measures), so that a missing, stale or broken table, the very thing tune
replaces, cannot stop it. Where the table goes is checked before they
start; the new table is written next to it and checked as later runs will
read it before it replaces the old one. A sweep stopped half way writes no
table: what it measured goes to <table>.partial.json.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import shlex
import sys

import numpy as np

from .. import selection
from . import sweep
from .closed_output import print_or_silence
from .folders import unwritable
from .bench_data import DTYPES
from .timing import typical_spread
from ..selection.table import (TABLE_ENV, CostCurve, Segment, Table, TableError, cache_dir,
                               load_table, table_path, table_to_json)
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
        us_per_mb = float((values[j + 1] - values[j]) / (knots[j + 1] - knots[j]) * 1e6)
        last = j == len(knots) - 2
        segments.append(_segment_from(int(knots[j]), float(values[j]), us_per_mb,
                                      None if last else int(knots[j + 1])))
    merged = [segments[0]]
    for segment in segments[1:]:  # neighbours on one line (equal knot values) merge
        prev = merged[-1]
        if (abs(segment.latency_us - prev.latency_us) <= 1e-9 * max(1.0, abs(prev.latency_us))
                and abs(segment.us_per_mb - prev.us_per_mb) <= 1e-9 * max(1.0, prev.us_per_mb)):
            merged[-1] = Segment(segment.up_to_bytes, prev.latency_us, prev.us_per_mb)
        else:
            merged.append(segment)
    return CostCurve(tuple(merged))


def _segment_from(start: int, value: float, us_per_mb: float, up_to: int | None) -> Segment:
    """The segment of slope us_per_mb through (start, value), its intercept
    taken as Segment.predict computes, so that it predicts `value` at its
    start to rounding, and never below zero there: a knot value pooled to
    0 (a noisy fit) would otherwise predict -1e-14 us and fail the table's
    own check (selection/table.py)."""
    latency = value - us_per_mb * start / 1e6
    while Segment(up_to, latency, us_per_mb).predict(start) < 0:
        latency = math.nextafter(latency, math.inf)
    return Segment(up_to, latency, us_per_mb)


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


# What tune's ranks run with: the shipped table (the table being made may
# not exist yet, or be broken) and no JAX_AR_ALGO, which would turn the
# pair's all-reduce ("composed", timed with algorithm="auto") into its pick.
RANK_ENV = {TABLE_ENV: "default", "JAX_AR_ALGO": ""}


def destination(out: str | None) -> tuple[str | None, str]:
    """(the table file to write, what named it): --out, else $JAX_AR_TABLE
    (unless "default"), else (None, ...): the cache path, which takes the
    device kind the ranks report."""
    if out:
        return out, "--out"
    env = os.environ.get(TABLE_ENV, "").strip()
    if env and env.lower() != "default":
        return env, TABLE_ENV
    return None, "the cache folder"


def check_destination(path: str | None, what: str) -> None:
    """ValueError, before any rank starts, where the table could not be
    written: `path` is a folder, or its folder cannot be created or written
    (None: the cache folder)."""
    if path is not None and os.path.isdir(path):
        raise ValueError(f"{what} {path} is a folder; give the table file's path")
    folder = os.path.dirname(os.path.abspath(path)) if path is not None else cache_dir()
    failed = unwritable(folder)
    if failed:
        e = failed[1]
        name = f"{what} {path}" if path is not None else f"the cache folder {folder}"
        raise ValueError(f"{name}: cannot write there ({e.strerror or e})"
                         + ("" if path is not None else "; give --out"))


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
        fitted = sum(1 for b in sizes if b >= 4)  # as bench: a size holds an element
        if fitted < 2:
            raise ValueError("tune fits curves to 2 or more message sizes of at least 4 bytes "
                             f"(one float32 element); the sizes from -b to -e hold {fitted}")
        # The ranks read no table (JAX_AR_TABLE=default) and take no
        # JAX_AR_ALGO (RANK_ENV): the rest of what their setup would reject.
        sweep.check_environment(platform, ranks, table=False, algorithm=False)
        path, named_by = destination(ns.out)
        check_destination(path, named_by)
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
    for path_name, variant in NORM_VARIANTS.items():
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
    override = os.environ.get("JAX_AR_ALGO", "").strip()
    if override and override.lower() != "auto":
        print(f"jax_ar tune: JAX_AR_ALGO={override} is ignored: tune times each algorithm "
              "itself, and the pair with the shipped table's picks", file=sys.stderr, flush=True)
    info = {"command": "python -m jax_ar tune " + " ".join(shlex.quote(a) for a in (argv or [])),
            "method": {k: config[k] for k in ("iters", "chain_bytes", "chain_least", "launches",
                                               "min_sample_s", "repeats", "warmup")}}
    try:
        raw = sweep.run_sweep(config, ranks, platform, ns.timeout, progress_label="tune",
                              env=RANK_ENV)
    except sweep.SweepError as e:
        print(str(e), file=sys.stderr, flush=True)
        if e.partial is not None:
            _save_partial(e.partial, path, sweep.stop_reason(e, "tune"), info)
        return e.exit_code
    machine, results = raw["machine"], raw["results"]
    spread = typical_spread(results)
    if spread is None:
        print("jax_ar tune: note: the timing noise is not estimated with --repeats below 3",
              file=sys.stderr)
    elif spread > sweep.NOISY_SPREAD:
        print(f"jax_ar tune: warning: timing samples spread {spread:.0%} around their median "
              "(typical case); the machine is busy, so the table may follow noise. Re-run "
              "when it is idle.", file=sys.stderr)
    wrong = sum(r["wrong"] or 0 for r in results)
    if wrong:
        print(f"jax_ar tune: {wrong} elements differ from the host reference; no table written",
              file=sys.stderr)
        return 1
    if not machine["serves_calls"]:
        print(f"jax_ar tune: jax_ar falls back to psum on this machine "
              f"({machine['fallback_reason']}); nothing to tune", file=sys.stderr)
        return 1
    failed = [r for r in results if r["status"].startswith("failed")]
    if failed:
        print(f"jax_ar tune: warning: {len(failed)} measurement{'s' if len(failed) > 1 else ''} "
              f"could not run (the first: {failed[0]['algorithm']} at {failed[0]['bytes']} "
              f"bytes, {failed[0]['status']}); the curves use the others", file=sys.stderr)

    world, kind = machine["world_size"], machine["device_kind"]
    capacity = machine["capacity_bytes"]
    defaults_table = selection.default_table(platform, kind, world)
    measured = _measured(results, platform)
    curves, notes = {}, {}
    for algorithm in selection.candidates_for(platform):  # each kernel, as the rows that ran it
        points = measured[algorithm]
        usable = [p for p in points if algorithm == "psum" or p[0] <= capacity[algorithm]]
        if len(usable) >= 2:
            curves[algorithm] = fit_curve(usable)
        else:
            why = next((r["status"] for r in results if (r.get("kernel") or r["algorithm"])
                        == algorithm and r["status"] != "ok"), "too few sizes measured")
            curves[algorithm] = defaults_table.curves[algorithm]
            notes[algorithm] = f"not measured ({why}); shipped default kept"
    for name, variant in NORM_VARIANTS.items():  # whole calls: no rounds to cut at
        points = measured[name]
        if len(points) >= 2:
            curves[name] = fit_curve(points)
        else:
            why = next((r["status"] for r in results if r["algorithm"] == variant
                        and r["op"] == "rms_norm" and r["status"] != "ok"),
                       "too few sizes measured")
            curves[name] = defaults_table.curves[name]
            notes[name] = f"not measured ({why}); shipped default kept"
    path = path or table_path(platform, kind, world)
    table = Table(platform, kind, world, curves, path)
    doc = table_to_json(table, __version__, {
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": info["command"],
        "machine": machine,
        "method": info["method"],
        "notes": notes,
        "measurements": _rounded(measured),
    })
    error = _install(doc, path, platform, kind, world)
    lines = [_summary(table, capacity, measured)]
    lines += [f"# {algorithm}: {note}" for algorithm, note in notes.items()]
    if not error:
        lines.append(f"# wrote {path}")
    print_or_silence("\n".join(lines))
    if error:
        print(error, file=sys.stderr)
        return 1
    return 0


def _measured(results: list[dict], platform: str) -> dict:
    """{kernel or norm path: [(bytes, us), ...]} of the rows that ran it."""
    measured = {}
    for algorithm in selection.candidates_for(platform):
        measured[algorithm] = [(r["bytes"], r["time_us"]) for r in results
                               if (r.get("kernel") or r["algorithm"]) == algorithm
                               and r["op"] != "rms_norm" and r["status"] == "ok"]
    for name, variant in NORM_VARIANTS.items():
        measured[name] = [(r["bytes"], r["time_us"]) for r in results
                          if r["algorithm"] == variant and r["op"] == "rms_norm"
                          and r["status"] == "ok"]
    return measured


def _rounded(measured: dict) -> dict:
    """The measurements as the table file keeps them: [[bytes, us], ...]."""
    return {a: [[b, round(t, 3)] for b, t in pts] for a, pts in measured.items()}


def _install(doc: dict, path: str, platform: str, kind: str, world: int) -> str | None:
    """Writes the table next to `path`, reads it back as later runs will,
    then puts it in place; the old table stays where any step fails (the
    error, one line, is returned) and no temporary file is left."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        load_table(tmp, platform, kind, world, __version__)
        os.replace(tmp, path)
    except TableError as e:
        why = str(e).split("; run `python -m jax_ar tune`")[0]
        return f"jax_ar tune: the new table fails its check ({why}); {path} left as it was"
    except OSError as e:
        return f"jax_ar tune: cannot write {path} ({e.strerror or e}); it was left as it was"
    finally:
        if os.path.lexists(tmp):
            try:
                os.remove(tmp)
            except OSError:
                pass
    return None


def _save_partial(raw: dict, path: str | None, reason: str, info: dict) -> None:
    """What a stopped sweep measured, in <table>.partial.json: not a table
    (its schema says so; a table fitted to part of the sizes, the kernels
    measured last on shipped defaults, would mislead), but nothing is lost."""
    machine = raw["machine"]
    path = path or table_path(machine["platform"], machine["device_kind"],
                              machine["world_size"])
    stem = path[:-len(".json")] if path.endswith(".json") else path
    partial_path = f"{stem}.partial.json"
    doc = {"schema": "jax_ar.tune_partial", "schema_version": 1,
           "partial": dict(raw["partial"], reason=reason),
           "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
           "command": info["command"], "machine": machine, "method": info["method"],
           "measurements": _rounded(_measured(raw["results"], machine["platform"])),
           "results": raw["results"]}
    try:
        with open(partial_path, "w") as f:
            json.dump(doc, f, indent=1)
    except OSError as e:
        print(f"jax_ar tune: cannot write {partial_path} ({e.strerror or e})", file=sys.stderr)
        return
    print(f"jax_ar tune: no table written; what was measured ({raw['partial']['cases_done']} of "
          f"{raw['partial']['cases_planned']} cases) is in {partial_path}", file=sys.stderr)
