"""Runs a list of timing cases in N ranks through the launcher (bench and tune).

The ranks run bench_rank.py; this process shows rank 0's progress on
stderr while they work, and returns what rank 0 wrote.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
import threading
import uuid

from ..comm.communicator import MAX_WORKSPACE_BYTES, MIN_WORKSPACE_BYTES
from . import launch

__all__ = ["SweepError", "SweepStopped", "add_common_options", "check_environment",
           "check_table", "common_config", "default_ranks", "format_size", "mps_running",
           "parse_size", "read_partial", "resolve_platform", "run_sweep", "shared_gpu_reason",
           "size_list", "stop_reason"]

RANK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_rank.py")


# Timing defaults per platform. On CPU a sample must last long enough that
# the OS scheduler's noise averages out. On GPU a launch of 20 small calls
# lasts less than XLA's host time per launch, so bench timed the host
# (all_reduce at 16 KB, 2 ranks: 6.4 us a call at 20 calls a program, 5.6
# at 100, 4.8 at 300), and samples of 20 ms spread 4% where samples of 2
# ms spread 24% (one H100 under MPS, 2026-12-06, docs/latency_log.md
# "thirty-seventh push").
TIMING_DEFAULTS = {
    "cpu": {"iters": 10, "launches": 2, "repeats": 5, "warmup": 1, "min_sample_ms": 10.0},
    "gpu": {"iters": 300, "launches": 4, "repeats": 10, "warmup": 2, "min_sample_ms": 20.0},
}
# Unless -n is given, a GPU program moves at most this many bytes a rank in
# its calls (at least DEFAULT_LEAST_CALLS calls): 300 calls up to 14 MB, 20
# at 256 MB, where a launch of 300 would last seconds.
GPU_CHAIN_BYTES = 4 << 30
DEFAULT_LEAST_CALLS = 20
# The least value of each timing option: a sample needs a call, a launch and
# a repeat; warm-up and a least sample time may be none.
TIMING_LEAST = {"iters": 1, "launches": 1, "repeats": 1, "warmup": 0, "min_sample_ms": 0}


# Typical sample spread above which results are flagged as disturbed. On the
# project's 2-core VM a run at load average 5.5 spread 21% (issue 22) and
# runs at load 10-21 spread 12-24% (2026-12-01), with algorithms trading
# places from run to run: 25% let such runs pass unflagged.
NOISY_SPREAD = 0.15


class SweepError(RuntimeError):
    """The sweep did not finish. `exit_code`: what the command exits with
    (launch's: 124 at --timeout, 2 for a setting every rank rejected, ...);
    `partial`: the results doc of the size groups that finished before
    (run_sweep's, with "partial" set), or None when none did."""

    def __init__(self, text: str, exit_code: int = 1, partial: dict | None = None):
        super().__init__(text)
        self.exit_code = exit_code
        self.partial = partial


class SweepStopped(SweepError):
    """A signal (SIGTERM, SIGHUP, SIGINT) stopped the sweep's ranks."""

    def __init__(self, signum: int, text: str, partial: dict | None = None):
        super().__init__(text, 128 + signum, partial)
        self.signum = signum


def add_common_options(p, max_bytes_help: str) -> None:
    """Options bench and tune share: ranks, platform, sizes, timing, workspace.
    Letters mean what they mean in nccl-tests (-b -e -f -n -w); the rank
    count, which nccl-tests leaves to mpirun -n, is -N/--ranks."""
    p.add_argument("-N", "--ranks", type=int, default=None,
                   help="number of ranks, one process each (default: the number of GPUs, at "
                        "least 2; 2 on CPU)")
    p.add_argument("--platform", choices=("auto", "cpu", "gpu"), default="auto",
                   help="auto: GPUs when nvidia-smi lists any, else CPU devices")
    p.add_argument("-b", "--min-bytes", default="1K",
                   help="smallest message per rank (default 1K; K, M, G are binary)")
    p.add_argument("-e", "--max-bytes", default=None, help=max_bytes_help)
    p.add_argument("-f", "--step-factor", type=int, default=2,
                   help="multiply the size by this from one message to the next (default 2)")
    p.add_argument("-n", "--iters", type=int, default=None,
                   help="timed calls in a row, as nccl-tests' -n: calls chained in one timed "
                        "program (default on GPU 300, fewer from 16 MB so that a program "
                        "moves at most 4 GB a rank, at least 20; 10 on CPU)")
    p.add_argument("-w", "--warmup", type=int, default=None,
                   help="untimed warm-up launches before the samples, as nccl-tests' -w "
                        "(default 2 on GPU, 1 on CPU)")
    p.add_argument("--launches", type=int, default=None,
                   help="least program launches per timing sample (default 4 on GPU, 2 on CPU)")
    p.add_argument("--min-sample-ms", type=float, default=None,
                   help="more launches per sample until one lasts this long (default 20 on "
                        "GPU, 10 on CPU)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timing samples; the median is reported (default 10 on GPU, 5 on CPU)")
    p.add_argument("--workspace-bytes", type=parse_size, default=None,
                   help="jax_ar workspace per device (default: jax_ar.setup's)")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="give up after this many seconds (default 1800)")


def default_ranks(ns, platform: str, gpus: int) -> int:
    ranks = ns.ranks if ns.ranks is not None else (max(2, gpus) if platform == "gpu" else 2)
    if ranks < 2:
        raise ValueError(f"-N/--ranks must be at least 2, got {ranks}")
    return ranks


def common_config(ns, platform: str) -> dict:
    """The timing part of a sweep's config, from the options and defaults."""
    config = {}
    for name, default in TIMING_DEFAULTS[platform].items():
        value = getattr(ns, name)
        least = TIMING_LEAST[name]
        if value is not None and not (math.isfinite(value) and value >= least):
            raise ValueError(f"--{name.replace('_', '-')} must be at least {least}"
                             f"{' and finite' if isinstance(value, float) else ''}, "
                             f"got {value:g}")
        config[name] = default if value is None else value
    config["min_sample_s"] = config.pop("min_sample_ms") / 1e3
    # timing.calls_for reads them: the default chain of a large message is shorter.
    capped = platform == "gpu" and ns.iters is None
    config["chain_bytes"] = GPU_CHAIN_BYTES if capped else None
    config["chain_least"] = DEFAULT_LEAST_CALLS if capped else None
    workspace = ns.workspace_bytes
    if workspace is not None and not MIN_WORKSPACE_BYTES <= workspace <= MAX_WORKSPACE_BYTES:
        # jax_ar.setup's limits: every rank would raise at setup.
        raise ValueError(f"--workspace-bytes must be between {format_size(MIN_WORKSPACE_BYTES)} "
                         f"and {format_size(MAX_WORKSPACE_BYTES)} (jax_ar.setup's limits), "
                         f"got {workspace}")
    config["workspace_bytes"] = workspace
    launch.check_timeout(ns.timeout)
    return config


def parse_size(text: str) -> int:
    """'1K' -> 1024, '256M', '1G', '4096' (binary multiples, as nccl-tests)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)[bB]?\s*", str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 1K, 256M, 1G)")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def format_size(nbytes: int) -> str:
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


def size_list(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(f"need 1 <= min-bytes <= max-bytes, got {min_bytes} and {max_bytes}")
    if factor < 2:
        raise ValueError(f"the step factor must be at least 2, got {factor}")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


def resolve_platform(platform: str) -> tuple[str, int]:
    """("cpu" | "gpu", number of GPUs) for --platform auto|cpu|gpu, as the
    launcher resolves it; ValueError for gpu where there is none."""
    return launch.resolve_platform(platform, os.environ)


def shared_gpu_reason(platform: str, ranks: int, gpus: int) -> str | None:
    """Why psum cannot run when ranks share GPUs (None when they do not).
    Warns when they share GPUs and no CUDA MPS daemon is seen: without it
    their kernels never run at the same time and the first call times out."""
    if platform != "gpu" or ranks <= gpus:
        return None
    if not mps_running():
        print(f"jax_ar: warning: {ranks} ranks share {gpus} GPU(s) and no CUDA MPS daemon was "
              "found (CUDA_MPS_PIPE_DIRECTORY); start it with `nvidia-cuda-mps-control -d` "
              "(docs/benchmarks.md) or use --platform cpu", file=sys.stderr)
    return "n/a: ranks share a GPU (NCCL refuses)"


def mps_running() -> bool:
    """Whether a CUDA MPS control daemon seems to be up (its pipe directory
    holds the control pipe)."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    try:
        return any(name.startswith("control") for name in os.listdir(pipe))
    except OSError:
        return False


def check_environment(platform: str, world: int, table: bool = True,
                      algorithm: bool = True) -> None:
    """ValueError, one line naming the variable, for a setting every rank's
    jax_ar.setup would reject: JAX_AR_TIMEOUT_S, (`algorithm`) JAX_AR_ALGO
    and (`table`) the algorithm table the ranks would read (check_table)."""
    from .. import config as ar_config

    if algorithm:
        ar_config.algorithm_override()
    try:
        ar_config.resolve_timeout()
    except TypeError as e:
        raise ValueError(str(e)) from None
    if table:
        check_table(platform, world)


def check_table(platform: str, world: int) -> None:
    """TableError (a ValueError) for the table the ranks would load, where
    this process can tell which it is: $JAX_AR_TABLE's file (its device kind
    taken from the file on GPU, where only the ranks know theirs), or on
    CPU the tuned file in the cache. JAX_AR_TABLE=default and a cache
    without a file mean the shipped defaults: nothing to check. (A GPU's
    cached file is named after the device kind: the ranks check it.)"""
    from .._version import __version__
    from ..selection import table as tables

    override = os.environ.get(tables.TABLE_ENV, "").strip()
    if override.lower() == "default":
        return
    if override:
        path = override
    elif platform == "cpu":
        path = tables.table_path("cpu", "cpu", world)
        if not os.path.exists(path):
            return
    else:
        return
    kind = "cpu"
    if platform != "cpu":
        try:
            with open(path) as f:
                kind = json.load(f).get("device_kind")
        except (OSError, ValueError, AttributeError):
            kind = None  # load_table says what is wrong with the file
        kind = kind if isinstance(kind, str) else "?"
    tables.load_table(path, platform, kind, world, __version__)


def run_sweep(config: dict, ranks: int, platform: str, timeout_s: float,
              progress_label: str = "bench", env: dict | None = None) -> dict:
    """Runs config["cases"] in `ranks` ranks; returns rank 0's results doc.
    `env`: variables set for the ranks on top of this process's. Raises
    SweepError (SweepStopped for a signal) when they did not finish; its
    `partial` holds the size groups that did."""
    with tempfile.TemporaryDirectory(prefix="jax_ar_sweep_") as tmp:
        config = dict(config, out=os.path.join(tmp, "results.json"),
                      partial_out=os.path.join(tmp, "partial.jsonl"), run_id=uuid.uuid4().hex)
        config_path = os.path.join(tmp, "config.json")
        with open(config_path, "w") as f:
            json.dump(config, f)
        log_dir = os.path.join(tmp, "logs")
        env = dict(os.environ, **(env or {}))
        env.setdefault("JAX_AR_TIMEOUT_S", "60")
        box = {}

        def target():
            try:
                box["result"] = launch.launch(RANK_SCRIPT, [config_path], num_processes=ranks,
                                               cpu_devices=1 if platform == "cpu" else None,
                                               platform=platform, timeout_s=timeout_s,
                                               log_dir=log_dir, stream=False, env=env)
            except BaseException as e:  # surfaced below
                box["error"] = e

        # Signals reach this (main) thread; the launch in the other one
        # forwards them to the ranks and returns once they have ended.
        with launch.forwarding_signals():
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            _show_progress(thread, os.path.join(log_dir, "rank0.log"), progress_label)
            thread.join()
        if "error" in box:
            raise box["error"]
        result = box["result"]
        if result.signal is not None:
            raise SweepStopped(result.signal, f"jax_ar {progress_label}: {result.summary()}",
                               read_partial(config["partial_out"], len(config["cases"])))
        if not result.ok or not os.path.exists(config["out"]):
            errors = _rank_errors(result)
            if errors:  # a setting every rank rejected: its message, once
                raise SweepError("\n".join(f"jax_ar {progress_label}: {e}" for e in errors), 2)
            raise SweepError(_failure_text(result, progress_label, timeout_s),
                             result.exit_code if not result.ok else 1,
                             read_partial(config["partial_out"], len(config["cases"])))
        with open(config["out"]) as f:
            return json.load(f)


def stop_reason(error: SweepError, label: str) -> str:
    """Why a sweep stopped, in a few words: the first line of `error`
    without its "jax_ar LABEL: " prefix."""
    line = str(error).splitlines()[0] if str(error) else "stopped"
    prefix = f"jax_ar {label}: "
    return line[len(prefix):] if line.startswith(prefix) else line


def read_partial(path: str, planned: int) -> dict | None:
    """The results doc of the size groups the ranks finished (rank 0 appends
    them to `path` as JSON lines, after a first line with the machine and
    the table), marked partial; None when no group finished."""
    try:
        with open(path) as f:
            lines = [json.loads(line) for line in f if line.endswith("\n")]
    except (OSError, ValueError):
        return None
    if len(lines) < 2:
        return None
    head, groups = lines[0], lines[1:]
    results = [r for g in groups for r in g["results"]]
    picks = {k: v for g in groups for k, v in g["picks"].items()}
    return {"machine": head["machine"], "results": results,
            "selection": {"table": head["table"], "picks": picks}, "elapsed_s": None,
            "partial": {"cases_done": len(results), "cases_planned": planned}}


def _show_progress(thread, log_path: str, label: str) -> None:
    """Rank 0's progress: on a terminal its latest line, redrawn in place;
    otherwise (a file, a pipe) one line per case, as it starts."""
    tty = sys.stderr.isatty()
    offset, shown = 0, ""
    while True:
        alive = thread.is_alive()
        try:
            with open(log_path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
        except OSError:
            chunk = b""
        complete = chunk[:chunk.rfind(b"\n") + 1]
        offset += len(complete)
        lines = [_progress_text(label, line)
                 for line in complete.decode(errors="replace").splitlines()
                 if line.startswith("@@progress ")]
        if tty and lines and lines[-1] != shown:
            shown = lines[-1]
            sys.stderr.write(f"\r\033[K{shown}")
        elif not tty:
            sys.stderr.writelines(f"{line}\n" for line in lines)
        sys.stderr.flush()
        if not alive:
            break
        thread.join(timeout=0.2)
    if tty and shown:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


def _progress_text(label: str, line: str) -> str:
    parts = line.split()
    done, total = int(parts[1]), int(parts[2])
    what = " ".join(parts[3:])
    if what != "done" and parts[3].isdigit():
        what = f"{format_size(int(parts[3]))}B " + " ".join(parts[4:])
    return f"jax_ar {label}: [{done}/{total}] {what}"


def _rank_errors(result) -> list[str]:
    """The "@@error" lines of ranks that stopped on a setting every rank
    rejects (bench_rank: the table, JAX_AR_ALGO, ...), each message once;
    [] unless every failed rank printed one."""
    failed = [rank for rank, _ in result.failures]
    found = {rank: [line[len("@@error "):] for line in result.logs[rank].splitlines()
                    if line.startswith("@@error ")] for rank in failed}
    if not failed or not all(found.values()):
        return []
    return list(dict.fromkeys(m for messages in found.values() for m in messages))


def _failure_text(result, label: str = "bench", timeout_s: float | None = None) -> str:
    """What went wrong, and the last lines of each failed rank (none of a
    rank killed at the deadline or after another failed: they did not fail
    on their own)."""
    if result.timed_out and not result.failures:
        return (f"jax_ar {label}: stopped at --timeout {timeout_s:g} s (the sweep was not done): "
                f"{result.summary()}")
    parts = [f"jax_ar {label}: the benchmark ranks failed: {result.summary()}"]
    for rank, what in result.failures:
        lines = [l for l in result.logs[rank].splitlines() if not l.startswith("@@")]
        if lines:  # `what` as the summary says it (a rank killed while exiting: its own code)
            parts.append(f"----- rank {rank} ({what}), last lines -----\n" +
                         "\n".join(lines[-40:]))
    return "\n".join(parts)
