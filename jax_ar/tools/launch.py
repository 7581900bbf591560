"""python -m jax_ar launch -n N script.py: N local processes joined by jax.distributed.

Each rank runs `script.py` as __main__ after jax.distributed.initialize()
(see bootstrap.py), so the script needs no launcher-specific code. Output of
every rank is streamed with a "[rank i]" prefix and, with --log-dir, kept in
one file per rank. The launcher exits non-zero if any rank fails, naming it,
and kills every rank still running at the deadline.

When a rank fails, the others get a short grace period (see
default_grace_s) to report their own errors, then the launcher dumps the
stacks of those still running and kills them. A rank that raised counts as
failed at once, even though jax.distributed's shutdown may hold its process
until every peer exits.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from ..config import DEFAULT_TIMEOUT_S

__all__ = ["LaunchResult", "launch", "main"]


class LaunchResult:
    def __init__(self, returncodes, logs, timed_out, failures=(), stopped=()):
        self.returncodes = returncodes  # per rank; None if killed at the deadline
        self.logs = logs  # per rank: everything it printed
        self.timed_out = timed_out
        # (rank, what happened), in the order the launcher saw the failures;
        # the first is the rank that brought the job down.
        self.failures = list(failures)
        self.stopped = list(stopped)  # ranks the launcher killed after another failed

    @property
    def ok(self) -> bool:
        return not self.timed_out and not self.failures and \
            all(rc == 0 for rc in self.returncodes)

    @property
    def first_failed_rank(self) -> int | None:
        return self.failures[0][0] if self.failures else None

    def summary(self) -> str:
        if self.ok:
            return f"all {len(self.returncodes)} ranks succeeded"
        parts = [f"rank {rank} failed ({what})" for rank, what in self.failures]
        if len(parts) > 1:
            parts[0] += ", the first to fail"
        if self.stopped:
            parts.append(f"rank{'s' if len(self.stopped) > 1 else ''} "
                         f"{', '.join(map(str, self.stopped))} still running after that, killed")
        if self.timed_out:
            late = [i for i, rc in enumerate(self.returncodes) if rc is None]
            parts.append(f"rank{'s' if len(late) > 1 else ''} {', '.join(map(str, late))} "
                         "killed at the deadline")
        return "; ".join(parts) or "failed"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def launch(script, args=(), num_processes=2, cpu_devices=None, platform="auto",
           timeout_s=600.0, log_dir=None, stream=True, env=None, grace_s=None) -> LaunchResult:
    """Runs `script` in `num_processes` ranks; returns when all have ended.

    Once a rank fails (raises, or exits non-zero, or dies), the others get
    `grace_s` seconds to end by themselves; then those still running are
    killed (after a dump of their Python stacks to their log)."""
    if num_processes < 1:
        raise ValueError("num_processes must be at least 1")
    port = free_port()
    base_env = dict(os.environ if env is None else env)
    if platform == "auto":
        platform = "gpu" if gpu_count() > 0 and base_env.get("JAX_PLATFORMS", "") != "cpu" \
            else "cpu"
    gpus = gpu_count() if platform == "gpu" else 0
    if platform == "gpu" and gpus == 0:
        raise RuntimeError("--platform gpu but no GPU is visible (nvidia-smi -L lists none)")
    if grace_s is None:
        grace_s = default_grace_s(platform, base_env)
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    status_dir = tempfile.mkdtemp(prefix="jax_ar_launch_")

    procs, logs, readers = [], [[] for _ in range(num_processes)], []
    print_lock = threading.Lock()
    try:
        for rank in range(num_processes):
            rank_env = dict(base_env)
            rank_env.update({
                "JAX_AR_COORDINATOR": f"127.0.0.1:{port}",
                "JAX_AR_NUM_PROCESSES": str(num_processes),
                "JAX_AR_PROCESS_ID": str(rank),
                "JAX_AR_LAUNCH_STATUS_DIR": status_dir,
                "PYTHONUNBUFFERED": "1",
            })
            if platform == "cpu":
                rank_env["JAX_PLATFORMS"] = "cpu"
                if cpu_devices:
                    rank_env["JAX_AR_CPU_DEVICES"] = str(cpu_devices)
            else:
                # More ranks than GPUs: ranks share GPUs (needs CUDA MPS running).
                rank_env["JAX_AR_LOCAL_DEVICE_IDS"] = str(rank % gpus)
                if num_processes > gpus:
                    rank_env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
            cmd = [sys.executable, "-m", "jax_ar.tools.bootstrap", script, *args]
            proc = subprocess.Popen(cmd, env=rank_env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, errors="replace",
                                    start_new_session=True)
            procs.append(proc)
            log_file = open(os.path.join(log_dir, f"rank{rank}.log"), "w") if log_dir else None
            reader = threading.Thread(target=_pump, args=(proc, rank, logs[rank], log_file,
                                                          stream, print_lock), daemon=True)
            reader.start()
            readers.append(reader)
        watch = _supervise(procs, logs, status_dir, timeout_s, grace_s, print_lock, stream)
    finally:
        _kill_all(procs)
        shutil.rmtree(status_dir, ignore_errors=True)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    for r in readers:
        r.join(timeout=10)
    returncodes = []
    for i, p in enumerate(procs):
        rc = p.returncode
        killed_at_deadline = watch.timed_out and rc is not None and rc < 0 and \
            i not in watch.order
        returncodes.append(None if killed_at_deadline else rc)
    failures = [(r, _describe_failure(r, returncodes[r], watch)) for r in watch.order]
    return LaunchResult(returncodes, ["".join(lines) for lines in logs], watch.timed_out,
                        failures, watch.stopped)


def default_grace_s(platform: str, env) -> float:
    """How long ranks may run on after one failed. On CPU devices a rank
    waiting in jax_ar stops within milliseconds of a peer's failure or death
    (and within a poll of the key-value store during setup), so a few
    seconds let every rank print its own error. CUDA kernels notice a dead
    process only at their deadline, so GPU ranks get that deadline too."""
    if platform == "cpu":
        return 5.0
    try:
        deadline = float(env.get("JAX_AR_TIMEOUT_S", "") or DEFAULT_TIMEOUT_S)
    except ValueError:
        deadline = DEFAULT_TIMEOUT_S
    return deadline + 5.0


class _Watch:
    """What the launcher saw while the ranks ran."""

    def __init__(self):
        self.order = []  # failed ranks, in the order their failure was seen
        self.reported = {}  # rank -> the error it reported ("Type: message")
        self.stopped = []  # ranks killed because they still ran after a failure
        self.ended_by_launcher = False  # the launcher killed what was left
        self.timed_out = False


def _supervise(procs, logs, status_dir, timeout_s, grace_s, print_lock, stream) -> _Watch:
    """Waits for the ranks, stopping them as described in launch()."""
    watch = _Watch()
    deadline = time.monotonic() + timeout_s
    first_failure_at = settled_at = None
    while True:
        _collect_failures(procs, status_dir, watch)
        if all(p.poll() is not None for p in procs):
            _collect_failures(procs, status_dir, watch)
            return watch
        now = time.monotonic()
        if watch.order and first_failure_at is None:
            first_failure_at = now
        if now > deadline:
            watch.timed_out = watch.ended_by_launcher = True
            _kill_all(procs)
            return watch
        if first_failure_at is not None and not any(
                p.poll() is None and r not in watch.order for r, p in enumerate(procs)):
            # Every rank has ended or reported its failure; those still alive
            # wait in jax.distributed's shutdown for peers that are gone.
            settled_at = settled_at if settled_at is not None else now
            if now > settled_at + 1.0:
                watch.ended_by_launcher = True
                _kill_all(procs)
                return watch
        if first_failure_at is not None and now > first_failure_at + grace_s:
            watch.stopped = [r for r, p in enumerate(procs)
                             if p.poll() is None and r not in watch.order]
            for rank in watch.stopped:
                _note(logs, rank, f"jax_ar launch: rank {rank} is still running {grace_s:.1f} s "
                      f"after rank {watch.order[0]} failed; dumping its stack, then killing it",
                      print_lock, stream)
                _signal(procs[rank], signal.SIGUSR1)
            if watch.stopped:
                time.sleep(1.0)  # time for the stack dumps
            watch.ended_by_launcher = True
            _kill_all(procs)
            return watch
        time.sleep(0.05)


def _collect_failures(procs, status_dir, watch):
    for rank, proc in enumerate(procs):
        if rank in watch.order:
            continue
        path = os.path.join(status_dir, f"rank{rank}.failed")
        if os.path.exists(path):
            try:
                with open(path) as f:
                    watch.reported[rank] = f.read().strip()
            except OSError:
                watch.reported[rank] = "an error"
            watch.order.append(rank)
        elif proc.poll() not in (None, 0):
            watch.order.append(rank)


def _describe_failure(rank, rc, watch) -> str:
    """'raised ValueError: ..., exit code 1', 'exit code 3', 'killed by SIGKILL'."""
    parts = []
    reported = watch.reported.get(rank, "")
    if reported and not reported.startswith("SystemExit"):
        parts.append(f"raised {reported}")
    if rc is not None and rc > 0:
        parts.append(f"exit code {rc}")
    elif rc is not None and rc < 0:
        if rank in watch.reported and watch.ended_by_launcher:
            parts.append("stopped while exiting")
        else:
            try:
                parts.append(f"killed by {signal.Signals(-rc).name}")
            except ValueError:
                parts.append(f"killed by signal {-rc}")
    return ", ".join(parts) or "failed"


def _note(logs, rank, line, lock, stream):
    logs[rank].append(line + "\n")
    if stream:
        with lock:
            sys.stdout.write(f"[rank {rank}] {line}\n")
            sys.stdout.flush()


def _signal(proc, signum):
    try:
        proc.send_signal(signum)
    except (ProcessLookupError, OSError):
        pass


def _pump(proc, rank, sink, log_file, stream, lock):
    for line in proc.stdout:
        sink.append(line)
        if log_file:
            log_file.write(line)
            log_file.flush()
        if stream:
            with lock:
                sys.stdout.write(f"[rank {rank}] {line}")
                sys.stdout.flush()
    if log_file:
        log_file.close()


def _kill_all(procs):
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                p.kill()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jax_ar launch",
        description="Run SCRIPT in N local processes joined by jax.distributed.")
    parser.add_argument("-n", "--num-processes", type=int, default=2)
    parser.add_argument("--cpu-devices", type=int, default=None,
                        help="CPU devices per process (CPU platform)")
    parser.add_argument("--platform", choices=("auto", "cpu", "gpu"), default="auto",
                        help="auto: GPUs when nvidia-smi lists any, else CPU")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="kill every rank after this many seconds (default 600)")
    parser.add_argument("--grace", type=float, default=None,
                        help="seconds the other ranks may run on after one fails before they "
                             "are killed (default: 5 on CPU, JAX_AR_TIMEOUT_S + 5 on GPU)")
    parser.add_argument("--log-dir", default=None, help="write rank<i>.log files here")
    parser.add_argument("--quiet", action="store_true", help="do not stream rank output")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    if not os.path.exists(ns.script):
        parser.error(f"no such script: {ns.script}")
    result = launch(ns.script, ns.args, ns.num_processes, ns.cpu_devices, ns.platform,
                    ns.timeout, ns.log_dir, stream=not ns.quiet, grace_s=ns.grace)
    print(f"jax_ar launch: {result.summary()}", file=sys.stderr)
    if result.ok:
        return 0
    if result.timed_out:
        return 124
    first = result.first_failed_rank
    rc = result.returncodes[first] if first is not None else None
    return rc if rc is not None and rc > 0 else 1
