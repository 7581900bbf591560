"""python -m jax_ar bench: an nccl-tests style sweep of jax_ar.all_reduce vs psum.

Starts N ranks through the launcher (GPUs when nvidia-smi lists any, else
CPU devices), times every algorithm at every size with timing.py's method,
checks every result against a host reference (#wrong must be 0), writes
bench.json and bench.png to --out-dir, and prints a table. A sweep that
stops half way (a signal, --timeout, a rank that died) still writes what
it finished, marked partial.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys

from .._norms import _check_eps as check_eps
from . import sweep
from .closed_output import print_or_silence
from .folders import unwritable
from .auto_marks import auto_rows, label_of
from .bench_data import DTYPES
from .timing import typical_spread

__all__ = ["main"]

ALL_REDUCE_ALGORITHMS = ("oneshot", "twoshot", "psum", "auto", "xla_oneshot")
# --op rms_norm: the fused kernel forced (its protocol as the table picks),
# the pair jax_ar.all_reduce + jax_ar.rms_norm, psum + XLA's norm (the
# baseline), and what algorithm="auto" runs (bench_rank._rms_norm_step).
RMS_NORM_VARIANTS = ("fused", "all_reduce+rms_norm", "psum+norm", "auto")
# What runs on NCCL, which refuses ranks that share a GPU (also
# benchmarks/interleaved.py's candidates).
NCCL_ALGORITHMS = ("psum", "xla_oneshot", "psum+norm")
# A path no variant asks for, which a row names where the library took it
# instead (bench_rank._norm_path): below the fused kernel's smallest hidden
# size, "fused" runs jax_ar.all_reduce and then XLA's norm.
OTHER_NORM_PATHS = {"all_reduce+norm": "jax_ar.all_reduce, then XLA's norm"}
OPS = ("sum", "avg", "max", "min")

MAX_BYTES = {"cpu": "1M", "gpu": "256M"}  # CPU: the default run takes well under a minute


def build_parser(prog="python -m jax_ar bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description="Sweep message sizes and time jax_ar.all_reduce's algorithms "
        "against psum (nccl-tests style). Runs on GPUs when nvidia-smi lists any, else on "
        "CPU devices.")
    sweep.add_common_options(p, "largest message per rank (default 256M on GPU, 1M on CPU)")
    p.add_argument("-d", "--dtype", default="float32",
                   help=f"comma-separated, or 'all': {', '.join(DTYPES)} (default float32)")
    p.add_argument("-o", "--op", default="sum",
                   help="comma-separated sum,avg,max,min or 'all'; or rms_norm to time "
                        "all_reduce_rms_norm's paths (-a from "
                        f"{', '.join(RMS_NORM_VARIANTS)}): fused (the fused kernel, forced), "
                        "all_reduce+rms_norm (jax_ar.all_reduce then jax_ar.rms_norm), "
                        "psum+norm (the baseline) and auto (what algorithm='auto' runs)")
    p.add_argument("-c", "--check", type=int, choices=(0, 1), default=1,
                   help="1: compare every result with a host reference, bit for bit "
                        "(#wrong); 0: do not (default 1)")
    p.add_argument("-G", "--cuda-graph", type=int, default=0, metavar="N",
                   help="accepted for nccl-tests' sake and ignored: XLA itself captures "
                        "jax_ar's calls in CUDA graphs (command buffers) and replays them")
    p.add_argument("-a", "--algorithms", default=None,
                   help=f"comma-separated from {', '.join(ALL_REDUCE_ALGORITHMS)} "
                        "(default oneshot,twoshot,psum; with --op rms_norm from "
                        f"{', '.join(RMS_NORM_VARIANTS)}); auto is what algorithm='auto' "
                        "picks; xla_oneshot is psum compiled with XLA's one-shot kernel (GPU)")
    p.add_argument("--xla-oneshot", action="store_true",
                   help="also time xla_oneshot (GPU only)")
    p.add_argument("--hidden", type=int, default=4096,
                   help="hidden size of rms_norm messages (default 4096)")
    p.add_argument("--eps", type=float, default=1e-6, help="rms_norm epsilon (default 1e-6)")
    p.add_argument("--out-dir", default=None,
                   help="where bench.json and bench.png go (default: a new folder "
                        "bench_results/<date>-<time>/ per run)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the benchmark data (default 0; every seed gives exact results)")
    return p


def new_out_dir(root: str = "bench_results") -> str:
    """root/<date>-<time>/ (a suffix where that exists): a run never
    overwrites an earlier one's files."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path, n = os.path.join(root, stamp), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(root, f"{stamp}-{n}")
    return path


def prepare_out_dir(path: str) -> bool:
    """Creates --out-dir (and its parents) and makes sure a file can be
    written there, before any rank starts; ValueError saying why not.
    Returns whether the folder is new (an unused new one is removed)."""
    new = not os.path.exists(path)
    if not new and not os.path.isdir(path):
        raise ValueError(f"--out-dir {path}: exists and is not a folder")
    failed = unwritable(path)
    if failed:
        e = failed[1]
        raise ValueError(f"--out-dir {path}: cannot write there ({e.strerror or e})")
    return new


def _split(text: str, allowed, what: str) -> list[str]:
    items = list(allowed) if text == "all" else [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError(f"--{what}: give one or more of {', '.join(allowed)}")
    bad = [t for t in items if t not in allowed]
    if bad:
        raise ValueError(f"--{what}: {', '.join(bad)} not in {', '.join(allowed)}")
    return items


def plan(ns, platform: str, gpus: int) -> dict:
    """Checks the options; returns the sweep's config (cases included)."""
    ranks = sweep.default_ranks(ns, platform, gpus)
    min_bytes = sweep.parse_size(ns.min_bytes)
    max_bytes = sweep.parse_size(ns.max_bytes or MAX_BYTES[platform])
    sizes = sweep.size_list(min_bytes, max_bytes, ns.step_factor)
    dtypes = _split(ns.dtype, DTYPES, "dtype")
    rms_norm = ns.op == "rms_norm"
    if rms_norm:
        ops = ["rms_norm"]
        if ns.algorithms is not None:  # -a '' is an error, not the default
            algorithms = _split(ns.algorithms, RMS_NORM_VARIANTS, "algorithms")
        else:
            algorithms = list(RMS_NORM_VARIANTS)
        bad = [d for d in dtypes if d == "int32"]
        if bad:
            raise ValueError("--op rms_norm needs floating-point dtypes")
        if ns.hidden < 1:
            raise ValueError(f"--hidden must be at least 1, got {ns.hidden}")
        check_eps("--eps", ns.eps)  # what all_reduce_rms_norm would raise in every rank
    else:
        ops = _split(ns.op, OPS, "op")
        algorithms = _split("oneshot,twoshot,psum" if ns.algorithms is None else ns.algorithms,
                            ALL_REDUCE_ALGORITHMS, "algorithms")
        if ns.xla_oneshot and "xla_oneshot" not in algorithms:
            algorithms.append("xla_oneshot")
    unavailable = {}
    shared = sweep.shared_gpu_reason(platform, ranks, gpus)
    if shared:
        unavailable.update({name: shared for name in NCCL_ALGORITHMS})
    if platform != "gpu":
        unavailable["xla_oneshot"] = "n/a: XLA's one-shot kernel is GPU only"

    cases = []
    for dtype in dtypes:
        itemsize = DTYPES[dtype].itemsize
        for op in ops:
            for size in sizes:
                count = size // itemsize
                if count == 0:
                    continue
                case = {"dtype": dtype, "op": op, "count": count, "bytes": count * itemsize}
                if rms_norm:
                    hidden = min(ns.hidden, count)
                    tokens = count // hidden
                    case.update(hidden=hidden, tokens=tokens, count=tokens * hidden,
                                bytes=tokens * hidden * itemsize)
                for algorithm in algorithms:
                    cases.append(dict(case, algorithm=algorithm))
    if not cases:
        raise ValueError("no message size holds a single element of the chosen dtypes")
    if ns.seed < 0:  # numpy's generators take none
        raise ValueError(f"--seed must be at least 0, got {ns.seed}")
    return dict(sweep.common_config(ns, platform), ranks=ranks, cases=cases,
                unavailable=unavailable, eps=ns.eps, seed=ns.seed, check=bool(ns.check))


def add_speedups(results: list[dict]) -> None:
    """speedup_vs_psum = psum's time / this time, per (dtype, op, size); the
    baseline is psum+norm in rms_norm mode."""
    baseline = {}
    for r in results:
        if r["algorithm"] in ("psum", "psum+norm") and r["time_us"]:
            baseline[(r["dtype"], r["op"], r["bytes"])] = r["time_us"]
    for r in results:
        base = baseline.get((r["dtype"], r["op"], r["bytes"]))
        r["speedup_vs_psum"] = base / r["time_us"] if base and r["time_us"] else None


def add_bandwidths(results: list[dict], world: int) -> None:
    """nccl-tests' definitions: algbw = bytes / time; busbw = algbw * 2(n-1)/n."""
    for r in results:
        if r["time_us"]:
            r["algbw_gbps"] = r["bytes"] / (r["time_us"] * 1e3)
            r["busbw_gbps"] = r["algbw_gbps"] * 2 * (world - 1) / world
        else:
            r["algbw_gbps"] = r["busbw_gbps"] = None


def describe_machine(machine: dict, ranks: int, gpus: int) -> str:
    if machine["platform"] == "gpu":
        if ranks > gpus:
            where = (f"{ranks} ranks sharing {gpus} {machine['device_kind']} under CUDA MPS "
                     "(per-call overhead and correctness only; says nothing about NVLink)")
        else:
            where = f"{ranks} ranks on {ranks} x {machine['device_kind']}"
    else:
        where = (f"{ranks} ranks as processes with 1 CPU device each on {machine['cpu']} "
                 f"({machine['cpu_count']} cores)")
    return (f"{where}, host {machine['host']}; jax {machine['jax']}, jax_ar {machine['jax_ar']}, "
            f"workspace {sweep.format_size(machine['workspace_bytes'])}B")


def _shorter(method: dict) -> str:
    """Where the default chain is shorter: large messages (sweep.GPU_CHAIN_BYTES)."""
    if not method.get("chain_bytes"):
        return ""
    return (f"where they would move more than {sweep.format_size(method['chain_bytes'])}B a rank, "
            f"at least {method['chain_least']}, and ")


def format_table(doc: dict) -> str:
    machine, results, method = doc["machine"], doc["results"], doc["method"]
    marked = auto_rows(doc)
    # The algorithm column fits its widest label with the mark.
    width = max([len("algorithm")] + [len(label_of(r)) + 1 for r in results])
    lines = [
        f"# jax_ar bench {doc['date']}",
        f"# machine: {describe_machine(machine, doc['ranks'], doc['gpus'])}",
        f"# method: {method['iters']} calls chained per program (fewer {_shorter(method)}where "
        f"exact data need it: 'chain' in the JSON), >= {method['launches']} launches and >= "
        f"{method['min_sample_s'] * 1e3:g} ms per sample, median of {method['repeats']} samples "
        f"after {method['warmup']} warm-up launches; time = slowest rank's median",
        f"# busbw = algbw * 2(n-1)/n; vs_psum = psum time / time; * = what algorithm='auto' "
        f"runs (table: {doc['selection']['table']})",
        "#",
        f"# {'size':>10} {'count':>10} {'type':>9} {'op':>8} {'algorithm':>{width}} "
        f"{'time_us':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>7} {'vs_psum':>8}",
    ]
    lines[-2:-2] = _other_path_notes(results)  # before the blank line above the header
    partial = doc.get("partial")
    if partial:
        lines[2:2] = [f"# PARTIAL: {partial['reason']}; these are the {partial['cases_done']} "
                      f"of {partial['cases_planned']} cases it finished"]
    previous = None
    for i, r in enumerate(results):
        group = (r["dtype"], r["op"], r["bytes"])
        if previous is not None and group[:2] != previous[:2]:
            lines.append("#")
        previous = group
        name = label_of(r) + ("*" if i in marked else "")
        head = (f"  {r['bytes']:>10} {r['count']:>10} {r['dtype']:>9} {r['op']:>8} "
                f"{name:>{width}}")
        if r["status"] != "ok":
            lines.append(f"{head} {r['status']}")
            continue
        speedup = f"{r['speedup_vs_psum']:.2f}x" if r["speedup_vs_psum"] else "-"
        wrong = "-" if r["wrong"] is None else r["wrong"]
        lines.append(f"{head} {r['time_us']:>10.1f} {r['algbw_gbps']:>8.3f} "
                     f"{r['busbw_gbps']:>8.3f} {wrong:>7} {speedup:>8}")
    timed = sum(1 for r in results if r["status"] == "ok")
    failed = sum(1 for r in results if r["status"].startswith("failed"))
    checked = [r["wrong"] for r in results if r["status"] == "ok" and r["wrong"] is not None]
    lines.append(f"# {timed} cases timed, {len(results) - timed - failed} not available, " +
                 (f"{failed} failed, " if failed else "") +
                 (f"{sum(checked)} wrong elements in total" if checked or not timed else
                  "results not checked (-c 0)"))
    spread = typical_spread(results)
    load = machine.get("load_average")
    lines.append((f"# samples spread {spread:.0%} around their medians (typical case)"
                  if spread is not None else
                  "# samples spread not estimated (it takes --repeats 3 or more)")
                 + (f"; load average {load[0]:g} at the {'start' if partial else 'end'} on "
                    f"{machine['cpu_count']} cores" if load else ""))
    if spread is not None and spread > sweep.NOISY_SPREAD:
        lines.append(f"# WARNING: noisy timings (spread above {sweep.NOISY_SPREAD:.0%}): the "
                     "machine is busy; compare with care")
    return "\n".join(lines)


def _other_path_notes(results: list[dict]) -> list[str]:
    """A line for each rms_norm variant whose rows ran another path (they
    are named after what ran, the variant stays in the JSON's algorithm)."""
    notes = []
    for asked, ran in dict.fromkeys((r["algorithm"], r["kernel"]) for r in results
                                    if r["op"] == "rms_norm" and r.get("kernel")):
        what = f" ({OTHER_NORM_PATHS[ran]})" if ran in OTHER_NORM_PATHS else ""
        notes.append(f"# {ran}{what}: rows of {asked}, which the library runs that way for "
                     "these messages")
    return notes


def main(argv=None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        platform, gpus = sweep.resolve_platform(ns.platform)
        config = plan(ns, platform, gpus)
        # What every rank's jax_ar.setup would reject: one line, before they start.
        sweep.check_environment(platform, config["ranks"])
        out_dir = ns.out_dir or new_out_dir()
        new_dir = prepare_out_dir(out_dir)
    except (ValueError, sweep.SweepError) as e:
        parser.error(str(e))
    ranks = config.pop("ranks")
    if ns.cuda_graph:
        print(f"jax_ar bench: note: -G {ns.cuda_graph} is ignored: XLA captures jax_ar's calls "
              "in CUDA graphs (command buffers) by itself", file=sys.stderr)
    print(f"jax_ar bench: {len(config['cases'])} cases on {ranks} {platform.upper()} ranks ...",
          file=sys.stderr, flush=True)
    try:
        raw = sweep.run_sweep(config, ranks, platform, ns.timeout)
    except sweep.SweepError as e:
        print(str(e), file=sys.stderr, flush=True)
        if e.partial is None:
            if new_dir:
                _remove_if_empty(out_dir)
            return e.exit_code
        e.partial["partial"]["reason"] = sweep.stop_reason(e, "bench")
        doc = _bench_doc(e.partial, config, ranks, gpus, argv)
        _write_and_print(doc, out_dir, ns.no_plot)
        return e.exit_code
    doc = _bench_doc(raw, config, ranks, gpus, argv)
    if not _write_and_print(doc, out_dir, ns.no_plot):
        return 1
    results = doc["results"]
    wrong = sum(r["wrong"] or 0 for r in results)
    if wrong:
        print(f"jax_ar bench: FAILED: {wrong} elements differ from the host reference",
              file=sys.stderr)
        return 1
    failed = sum(1 for r in results if r["status"].startswith("failed"))
    if failed:
        print(f"jax_ar bench: FAILED: {failed} case{'s' if failed > 1 else ''} could not run "
              "(the table says why)", file=sys.stderr)
        return 1
    if not any(r["status"] == "ok" for r in results):
        print("jax_ar bench: FAILED: no case could run here (see the table)", file=sys.stderr)
        return 1
    return 0


def _bench_doc(raw: dict, config: dict, ranks: int, gpus: int, argv) -> dict:
    """bench.json's document from the ranks' results (all, or a partial run's)."""
    results, machine = raw["results"], raw["machine"]
    add_bandwidths(results, machine["world_size"])
    add_speedups(results)
    doc = {
        "schema": "jax_ar.bench",
        "schema_version": 1,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python -m jax_ar bench " + " ".join(shlex.quote(a) for a in (argv or [])),
        "ranks": ranks,
        "gpus": gpus,
        "machine": machine,
        "method": {k: config[k] for k in ("iters", "chain_bytes", "chain_least", "launches",
                                           "min_sample_s", "repeats",
                                           "warmup")},
        "selection": raw["selection"],  # what algorithm="auto" picks at each size
        "elapsed_s": raw["elapsed_s"],
        "results": results,
    }
    if raw.get("partial"):
        doc["partial"] = raw["partial"]  # {reason, cases_done, cases_planned}
    return doc


def _write_and_print(doc: dict, out_dir: str, no_plot: bool) -> bool:
    """Writes bench.json (and bench.png), then prints the table: the files
    come first, so that a closed stdout (`| head`) loses nothing. False
    when bench.json could not be written (the table is printed anyway)."""
    json_path = os.path.join(out_dir, "bench.json")
    tmp = f"{json_path}.tmp{os.getpid()}"
    written, error = [], None
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, json_path)
        written.append(json_path)
    except OSError as e:
        error = f"jax_ar bench: cannot write {json_path} ({e.strerror or e})"
        _discard(tmp)
    if written and not no_plot:
        from . import plot

        png_path = os.path.join(out_dir, "bench.png")
        try:
            plot.plot(doc, png_path)
            written.append(png_path)
        except ImportError:
            print("jax_ar bench: matplotlib is not installed; no plot "
                  "(pip install matplotlib, or jax_ar[bench])", file=sys.stderr)
        except OSError as e:
            print(f"jax_ar bench: cannot write {png_path} ({e.strerror or e})", file=sys.stderr)
    print_or_silence(format_table(doc) + (f"\n# wrote {', '.join(written)}" if written else ""))
    if error:
        print(error, file=sys.stderr)
    return not error


def _remove_if_empty(folder: str) -> None:
    try:
        os.rmdir(folder)
    except OSError:
        pass


def _discard(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
