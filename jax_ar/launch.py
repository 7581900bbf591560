"""python -m jax_ar launch -n N script.py: N local processes joined by jax.distributed.

Each rank runs `script.py` as __main__ after jax.distributed.initialize()
(see _bootstrap.py), so the script needs no launcher-specific code. Output of
every rank is streamed with a "[rank i]" prefix and, with --log-dir, kept in
one file per rank. The launcher exits non-zero if any rank fails, naming it,
and kills every rank still running at the deadline.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

__all__ = ["LaunchResult", "launch", "main"]


class LaunchResult:
    def __init__(self, returncodes, logs, timed_out):
        self.returncodes = returncodes  # per rank; None if killed at the deadline
        self.logs = logs  # per rank: everything it printed
        self.timed_out = timed_out

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(rc == 0 for rc in self.returncodes)

    def failed_ranks(self) -> list[int]:
        return [i for i, rc in enumerate(self.returncodes) if rc != 0]

    def summary(self) -> str:
        if self.ok:
            return f"all {len(self.returncodes)} ranks succeeded"
        parts = []
        for i, rc in enumerate(self.returncodes):
            if rc is None:
                parts.append(f"rank {i} killed at the deadline")
            elif rc != 0:
                parts.append(f"rank {i} failed (exit code {rc})")
        return "; ".join(parts)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def launch(script, args=(), num_processes=2, cpu_devices=None, platform="auto",
           timeout_s=600.0, log_dir=None, stream=True, env=None, grace_s=None) -> LaunchResult:
    """Runs `script` in `num_processes` ranks; returns when all have ended."""
    if num_processes < 1:
        raise ValueError("num_processes must be at least 1")
    port = free_port()
    base_env = dict(os.environ if env is None else env)
    if platform == "auto":
        platform = "gpu" if _gpu_count() > 0 and base_env.get("JAX_PLATFORMS", "") != "cpu" \
            else "cpu"
    gpus = _gpu_count() if platform == "gpu" else 0
    if platform == "gpu" and gpus == 0:
        raise RuntimeError("--platform gpu but no GPU is visible (nvidia-smi -L lists none)")
    # A rank that fails takes the others with it after a grace period long
    # enough for their own error reports (their deadlines) to come out.
    if grace_s is None:
        grace_s = float(base_env.get("JAX_AR_TIMEOUT_S", "20")) + 15.0
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)

    procs, logs, readers = [], [[] for _ in range(num_processes)], []
    print_lock = threading.Lock()
    for rank in range(num_processes):
        rank_env = dict(base_env)
        rank_env.update({
            "JAX_AR_COORDINATOR": f"127.0.0.1:{port}",
            "JAX_AR_NUM_PROCESSES": str(num_processes),
            "JAX_AR_PROCESS_ID": str(rank),
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
        cmd = [sys.executable, "-m", "jax_ar._bootstrap", script, *args]
        proc = subprocess.Popen(cmd, env=rank_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)
        procs.append(proc)
        log_file = open(os.path.join(log_dir, f"rank{rank}.log"), "w") if log_dir else None
        reader = threading.Thread(target=_pump, args=(proc, rank, logs[rank], log_file, stream,
                                                      print_lock), daemon=True)
        reader.start()
        readers.append(reader)

    deadline = time.monotonic() + timeout_s
    first_failure_at = None
    timed_out = False
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if first_failure_at is None and any(p.poll() not in (None, 0) for p in procs):
            first_failure_at = now
        if now > deadline or (first_failure_at is not None and now > first_failure_at + grace_s):
            timed_out = now > deadline
            _kill_all(procs)
            break
        time.sleep(0.05)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _kill_all([p])
    for r in readers:
        r.join(timeout=10)
    returncodes = []
    for p in procs:
        rc = p.returncode
        returncodes.append(None if rc is not None and rc < 0 and timed_out else rc)
    return LaunchResult(returncodes, ["".join(lines) for lines in logs], timed_out)


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
    parser.add_argument("--log-dir", default=None, help="write rank<i>.log files here")
    parser.add_argument("--quiet", action="store_true", help="do not stream rank output")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    if not os.path.exists(ns.script):
        parser.error(f"no such script: {ns.script}")
    result = launch(ns.script, ns.args, ns.num_processes, ns.cpu_devices, ns.platform,
                    ns.timeout, ns.log_dir, stream=not ns.quiet)
    print(f"jax_ar launch: {result.summary()}", file=sys.stderr)
    if result.ok:
        return 0
    if result.timed_out:
        return 124
    return next((rc for rc in result.returncodes if rc not in (0, None)), 1)
