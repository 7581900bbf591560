"""python -m jax_ar launch -n N script.py: N local processes joined by jax.distributed.

Each rank runs `script.py` (or, with -m, a module) as __main__ after
jax.distributed.initialize() (see bootstrap.py), so the script needs no
launcher-specific code. Output of every rank is streamed with a "[rank i]"
prefix (without the collectives' connection chatter and the shutdown noise
listed in NOISE) and, with --log-dir, kept as printed in one file per rank.
The launcher exits non-zero if any rank fails, naming it, and kills every
rank still running at the deadline.

When a rank fails, the others get a short grace period (see
default_grace_s) to report their own errors, then the launcher dumps the
stacks of those still running and kills them. A rank that raised counts as
failed at once, even though jax.distributed's shutdown may hold its process
until every peer exits. The first failure is the one that happened first:
a rank's exit is timed when it happens, a raised error when the rank caught
it, so a rank killed from outside is named before the peer whose call then
failed, however late the launcher looks (and however late, on a busy
machine, it hears of the kill: see KILL_SLACK_S).

SIGTERM, SIGHUP and SIGINT (Ctrl-C) that reach the launcher are forwarded
to every rank (each runs in a session of its own, so a terminal's signals
reach only the launcher); ranks still running STOP_GRACE_S later are
killed, and the launcher exits 128 + the signal number with one line
naming the signal. The ranks also die with the launcher if it is killed
outright (bootstrap.py asks the kernel for that).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from ..config import DEFAULT_TIMEOUT_S

__all__ = ["LaunchResult", "STOP_GRACE_S", "STOP_SIGNALS", "forwarding_signals", "launch",
           "main"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
STOP_GRACE_S = 3.0  # how long ranks may take to end after a forwarded signal
POLL_S = 0.05  # how often the launcher looks at the ranks
KILL_SLACK_S = 0.5  # see _collect_failures

# Lines no user needs: gloo's report of each connection it made (psum on CPU),
# and what gRPC and absl print when a process of jax.distributed goes away
# while its peers still poll it (these come after the ranks' own errors or
# results; the launcher's summary says how each rank ended).
NOISE = re.compile(
    r"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks"
    r"|WatchTasksAsync|PollForError|Terminating process because the JAX distributed service"
    r"|^\*\*\* Check failure stack trace: \*\*\*"
    r"|^\s+@\s+0x[0-9a-f]+\s")


class LaunchResult:
    def __init__(self, returncodes, logs, timed_out, failures=(), stopped=(), signal_=None,
                 killed_after_signal=()):
        self.returncodes = returncodes  # per rank; None if killed at the deadline
        self.logs = logs  # per rank: what it printed (less NOISE)
        self.timed_out = timed_out
        # (rank, what happened), in the order the failures happened; the first
        # is the rank that brought the job down.
        self.failures = list(failures)
        self.stopped = list(stopped)  # ranks the launcher killed after another failed
        self.signal = signal_  # the signal that stopped the job (forwarded to every rank)
        self.killed_after_signal = list(killed_after_signal)  # still running STOP_GRACE_S after it

    @property
    def ok(self) -> bool:
        return not self.timed_out and not self.failures and self.signal is None and \
            all(rc == 0 for rc in self.returncodes)

    @property
    def first_failed_rank(self) -> int | None:
        return self.failures[0][0] if self.failures else None

    @property
    def exit_code(self) -> int:
        """What `python -m jax_ar launch` exits with: 0; 128 + the signal's
        number when one stopped the job; 124 at the deadline; else the first
        failed rank's exit code (1 if it has none)."""
        if self.signal is not None:
            return 128 + self.signal
        if self.ok:
            return 0
        if self.timed_out:
            return 124
        first = self.first_failed_rank
        rc = self.returncodes[first] if first is not None else None
        return rc if rc is not None and rc > 0 else 1

    def summary(self) -> str:
        if self.ok:
            return f"all {len(self.returncodes)} ranks succeeded"
        parts = [f"rank {rank} failed ({what})" for rank, what in self.failures]
        if len(parts) > 1:
            parts[0] += ", the first to fail"
        if self.stopped:
            parts.append(f"{_ranks(self.stopped)} still running after that, killed")
        if self.timed_out:
            late = [i for i, rc in enumerate(self.returncodes) if rc is None]
            parts.append(f"{_ranks(late)} killed at the deadline")
        if self.signal is not None:
            text = f"stopped by {_signal_name(self.signal)}, forwarded to every rank"
            if self.killed_after_signal:
                text += (f"; {_ranks(self.killed_after_signal)} still running "
                         f"{STOP_GRACE_S:g} s later, killed")
            parts.append(text)
        return "; ".join(parts) or "failed"


def _ranks(ranks) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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


class _Scope:
    """Signals caught by forwarding_signals() and the jobs they stop."""

    def __init__(self):
        self.signum = None  # the first stop signal that came
        self.jobs = set()
        self.previous = {}  # signal -> handler before ours


class _Job:
    """One launch() in progress, as the signal handler sees it."""

    def __init__(self):
        self.stop_signum = None
        self.hurry = False  # a second signal: kill without the grace

    def request_stop(self, signum):
        if self.stop_signum is None:
            self.stop_signum = signum
        else:
            self.hurry = True


_scope: _Scope | None = None


@contextlib.contextmanager
def forwarding_signals():
    """Inside it, SIGTERM, SIGHUP and SIGINT reaching this process stop every
    launch() running in it, in any thread: the signal is forwarded to each
    rank, those still running STOP_GRACE_S later are killed (a second signal
    kills at once), and launch() returns a result whose .signal names it.
    Yields the scope; its .signum is the first signal that came, or None.
    Signals this process ignores (nohup's SIGHUP) stay ignored. Main thread
    only; an inner use is the outer one."""
    global _scope
    if _scope is not None:
        yield _scope
        return
    if threading.current_thread() is not threading.main_thread():
        yield _Scope()  # signals reach only the main thread: nothing to install
        return
    scope = _Scope()

    def on_signal(signum, frame):
        if scope.signum is None:
            scope.signum = signum
        for job in list(scope.jobs):
            job.request_stop(signum)

    for signum in STOP_SIGNALS:
        previous = signal.getsignal(signum)
        if previous is signal.SIG_IGN:
            continue
        scope.previous[signum] = previous
        signal.signal(signum, on_signal)
    _scope = scope
    try:
        yield scope
    finally:
        _scope = None
        for signum, previous in scope.previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)


def launch(script=None, args=(), num_processes=2, cpu_devices=None, platform="auto",
           timeout_s=600.0, log_dir=None, stream=True, env=None, grace_s=None, *,
           module=None) -> LaunchResult:
    """Runs `script` (or `module`, as python -m does) in `num_processes`
    ranks; returns when all have ended.

    Once a rank fails (raises, or exits non-zero, or dies), the others get
    `grace_s` seconds to end by themselves; then those still running are
    killed (after a dump of their Python stacks to their log).

    Called in the main thread outside forwarding_signals(), it forwards
    SIGTERM, SIGHUP and SIGINT to the ranks while they run (see
    forwarding_signals) and, once every rank has ended, lets the signal act
    on this process as it would have: SIGINT raises KeyboardInterrupt, the
    others run their previous handler (by default, end the process)."""
    if (script is None) == (module is None):
        raise ValueError("launch: give a script or a module, not both")
    if num_processes < 1:
        raise ValueError("num_processes must be at least 1")
    if _scope is not None or threading.current_thread() is not threading.main_thread():
        return _launch(_scope, script, module, args, num_processes, cpu_devices, platform,
                       timeout_s, log_dir, stream, env, grace_s)
    with forwarding_signals() as scope:
        result = _launch(scope, script, module, args, num_processes, cpu_devices, platform,
                         timeout_s, log_dir, stream, env, grace_s)
        previous = scope.previous.get(result.signal)
    if result.signal is not None:
        if result.signal == signal.SIGINT and previous is signal.default_int_handler:
            raise KeyboardInterrupt
        signal.raise_signal(result.signal)  # the restored handler acts on it
    return result


def _launch(scope, script, module, args, num_processes, cpu_devices, platform, timeout_s,
            log_dir, stream, env, grace_s) -> LaunchResult:
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
    target = ["-m", module] if module is not None else [script]

    job = _Job()
    if scope is not None:
        scope.jobs.add(job)
        if scope.signum is not None:  # a signal came before this launch started
            job.request_stop(scope.signum)
    procs, logs, threads = [], [[] for _ in range(num_processes)], []
    watch = _Watch()
    print_lock = threading.Lock()
    try:
        for rank in range(num_processes):
            if job.stop_signum is not None:
                break  # stopped while starting: start no more ranks
            rank_env = dict(base_env)
            rank_env.update({
                "JAX_AR_COORDINATOR": f"127.0.0.1:{port}",
                "JAX_AR_NUM_PROCESSES": str(num_processes),
                "JAX_AR_PROCESS_ID": str(rank),
                "JAX_AR_LAUNCH_STATUS_DIR": status_dir,
                "JAX_AR_LAUNCHER_PID": str(os.getpid()),
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
            cmd = [sys.executable, "-m", "jax_ar.tools.bootstrap", *target, *args]
            proc = subprocess.Popen(cmd, env=rank_env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, errors="replace",
                                    start_new_session=True)
            procs.append(proc)
            log_file = open(os.path.join(log_dir, f"rank{rank}.log"), "w") if log_dir else None
            for fn, fn_args in ((_pump, (proc, rank, logs[rank], log_file, stream, print_lock)),
                                (_reap, (proc, rank, watch))):
                thread = threading.Thread(target=fn, args=fn_args, daemon=True)
                thread.start()
                threads.append(thread)
        _supervise(job, procs, logs, status_dir, timeout_s, grace_s, print_lock, stream, watch)
        if watch.signal is None and job.stop_signum is not None:
            watch.signal = job.stop_signum  # it came as the last ranks ended: still obeyed
    finally:
        _kill_all(procs)
        shutil.rmtree(status_dir, ignore_errors=True)
        if scope is not None:
            scope.jobs.discard(job)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    for t in threads:
        t.join(timeout=10)
    returncodes = []
    for i, p in enumerate(procs):
        rc = p.returncode
        killed_at_deadline = watch.timed_out and rc is not None and rc < 0 and \
            i not in watch.failed_at
        returncodes.append(None if killed_at_deadline else rc)
    returncodes += [None] * (num_processes - len(procs))  # never started (a signal came)
    failures = [(r, _describe_failure(r, returncodes[r], watch)) for r in watch.order]
    return LaunchResult(returncodes, ["".join(lines) for lines in logs], watch.timed_out,
                        failures, watch.stopped, watch.signal, watch.killed_after_signal)


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
        self.failed_at = {}  # failed rank -> when it failed (time.time())
        self.exited_at = {}  # rank -> when its process ended (time.time())
        self.reported = {}  # rank -> the error it reported ("Type: message")
        self.stopped = []  # ranks killed because they still ran after a failure
        self.ended_by_launcher = False  # the launcher killed what was left
        self.timed_out = False
        self.signal = None  # the signal forwarded to the ranks
        self.killed_after_signal = []

    @property
    def order(self) -> list[int]:
        """Failed ranks, the first to fail first (ties: by rank)."""
        return sorted(self.failed_at, key=lambda r: (self.failed_at[r], r))


def _supervise(job, procs, logs, status_dir, timeout_s, grace_s, print_lock, stream, watch):
    """Waits for the ranks, stopping them as described in launch()."""
    deadline = time.monotonic() + timeout_s
    first_failure_at = settled_at = None

    def pause(seconds):  # sleeps, unless a signal asks to stop the job
        end = time.monotonic() + seconds
        while job.stop_signum is None and time.monotonic() < end:
            time.sleep(0.02)

    while True:
        if job.stop_signum is not None:
            return _stop(job, procs, watch, status_dir)
        _collect_failures(procs, status_dir, watch)
        if len(procs) == len(logs) and all(r in watch.exited_at for r in range(len(procs))):
            _collect_failures(procs, status_dir, watch)
            return
        now = time.monotonic()
        if watch.failed_at and first_failure_at is None:
            first_failure_at = now
        if now > deadline:
            watch.timed_out = watch.ended_by_launcher = True
            _kill_all(procs)
            return
        if first_failure_at is not None and not any(
                p.returncode is None and r not in watch.failed_at for r, p in enumerate(procs)):
            # Every rank has ended or reported its failure; those still alive
            # wait in jax.distributed's shutdown for peers that are gone.
            settled_at = settled_at if settled_at is not None else now
            if now > settled_at + 1.0:
                watch.ended_by_launcher = True
                _kill_all(procs)
                return
        if first_failure_at is not None and now > first_failure_at + grace_s:
            watch.stopped = [r for r, p in enumerate(procs)
                             if p.returncode is None and r not in watch.failed_at]
            for rank in watch.stopped:
                _note(logs, rank, f"jax_ar launch: rank {rank} is still running {grace_s:.1f} s "
                      f"after rank {watch.order[0]} failed; dumping its stack, then killing it",
                      print_lock, stream)
                _signal(procs[rank], signal.SIGUSR1)
            if watch.stopped:
                pause(1.0)  # time for the stack dumps
            if job.stop_signum is not None:
                return _stop(job, procs, watch, status_dir)
            watch.ended_by_launcher = True
            _kill_all(procs)
            return
        pause(POLL_S)


def _stop(job, procs, watch, status_dir):
    """Forwards the job's stop signal to every rank still running, waits up
    to STOP_GRACE_S (less after a second signal), kills what is left. A rank
    still starting (bootstrap.py has not said "ready") holds nothing yet and
    would only print a traceback of the import it was in: it is killed."""
    watch.signal = job.stop_signum
    for rank, p in enumerate(procs):
        ready = os.path.exists(os.path.join(status_dir, f"rank{rank}.ready"))
        _signal_group(p, job.stop_signum if ready else signal.SIGKILL)
    end = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < end and not job.hurry and \
            any(p.returncode is None for p in procs):
        time.sleep(0.02)
    watch.killed_after_signal = [r for r, p in enumerate(procs) if p.returncode is None]
    watch.ended_by_launcher = True
    _kill_all(procs)


def _collect_failures(procs, status_dir, watch):
    for rank, proc in enumerate(procs):
        if rank in watch.failed_at:
            continue
        path = os.path.join(status_dir, f"rank{rank}.failed")
        if os.path.exists(path):
            try:
                with open(path) as f:
                    stamp, _, text = f.read().strip().partition(" ")
                when = float(stamp)
            except (OSError, ValueError):
                text, when = "an error", time.time()
            watch.reported[rank] = text
            # A rank that raised because its peer died usually reports after
            # the peer's exit; either way the earlier event counts.
            watch.failed_at[rank] = min(when, watch.exited_at.get(rank, when))
        elif rank in watch.exited_at and proc.returncode != 0:
            when = watch.exited_at[rank]
            if proc.returncode < 0 and -proc.returncode != signal.SIGABRT:
                # Killed from outside (SIGKILL, ...): its peers, spinning on
                # it, see it within milliseconds, while this process, on a
                # busy machine, may hear of it later; a peer's report less
                # than KILL_SLACK_S before the exit is taken as its effect.
                # (JAX ends processes whose coordinator died with SIGABRT:
                # those were not first.)
                when -= KILL_SLACK_S
            watch.failed_at[rank] = when


def _describe_failure(rank, rc, watch) -> str:
    """'raised ValueError: ..., exit code 1', 'exit code 3', 'killed by SIGKILL'."""
    parts = []
    reported = watch.reported.get(rank, "")
    if reported and not reported.startswith("SystemExit"):
        parts.append(f"raised {reported}")
    if rc is not None and rc > 0:
        parts.append(f"exit code {rc}")
    elif reported.startswith("SystemExit: "):  # sys.exit(N), then held in the shutdown
        parts.append(f"exit code {reported[len('SystemExit: '):]}")
    elif rc is not None and rc < 0:
        if rank in watch.reported and watch.ended_by_launcher:
            parts.append("stopped while exiting")
        else:
            parts.append(f"killed by {_signal_name(-rc)}")
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


def _signal_group(proc, signum):
    """`signum` to the rank's process group (the rank and what it started).
    Only while the rank is unreaped: its pid cannot belong to another
    process then."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        _signal(proc, signum)


def _reap(proc, rank, watch):
    proc.wait()
    watch.exited_at[rank] = time.time()


def _pump(proc, rank, sink, log_file, stream, lock):
    for line in proc.stdout:
        if log_file:
            log_file.write(line)
            log_file.flush()
        if NOISE.search(line):
            continue
        sink.append(line)
        if stream:
            with lock:
                sys.stdout.write(f"[rank {rank}] {line}")
                sys.stdout.flush()
    if log_file:
        log_file.close()


def _kill_all(procs):
    for p in procs:
        _signal_group(p, signal.SIGKILL)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jax_ar launch",
        usage="%(prog)s [options] (SCRIPT | -m MODULE) [ARGS ...]",
        description="Run SCRIPT (or -m MODULE) in N local processes joined by jax.distributed, "
                    "each as __main__ with ARGS. SIGTERM, SIGHUP and Ctrl-C are forwarded to "
                    "every rank; ranks still running 3 s later are killed.",
        epilog="exit status: 0 when every rank succeeded; the first failed rank's exit code "
               "(or 1); 124 at --timeout; 128 + N when signal N stopped the job")
    parser.add_argument("-n", "--num-processes", type=int, default=2, metavar="N",
                        help="number of processes (ranks) to start, as mpirun -n (default 2)")
    parser.add_argument("--cpu-devices", type=int, default=None, metavar="K",
                        help="CPU devices per process (CPU platform; default 1)")
    parser.add_argument("--platform", choices=("auto", "cpu", "gpu"), default="auto",
                        help="auto: GPUs when nvidia-smi lists any, else CPU")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="kill every rank after this many seconds (default 600)")
    parser.add_argument("--grace", type=float, default=None, metavar="SECONDS",
                        help="seconds the other ranks may run on after one fails before they "
                             "are killed (default: 5 on CPU, JAX_AR_TIMEOUT_S + 5 on GPU)")
    parser.add_argument("--log-dir", default=None,
                        help="also write each rank's output, as printed (the chatter the "
                             "stream drops included), to rank<i>.log here")
    parser.add_argument("--quiet", action="store_true", help="do not stream rank output")
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE",
                        help="run library module MODULE as a script, as python -m does "
                             "(what follows it goes to the module)")
    parser.add_argument("script", nargs="?", metavar="SCRIPT",
                        help="the Python file every rank runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments for SCRIPT or MODULE (its sys.argv[1:])")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    module = None
    if ns.module is not None:
        if not ns.module:
            parser.error("argument -m: expected a module name")
        module, args = ns.module[0], ns.module[1:]
        if ns.script is not None:
            parser.error("give SCRIPT or -m MODULE, not both")
        if importlib.util.find_spec(module.split(".")[0]) is None:
            parser.error(f"no module named {module.split('.')[0]!r}")
    else:
        if ns.script is None:
            parser.error("give SCRIPT or -m MODULE")
        if not os.path.exists(ns.script):
            parser.error(f"no such script: {ns.script}")
        args = ns.args
    if ns.num_processes < 1:
        parser.error(f"-n must be at least 1, got {ns.num_processes}")
    with forwarding_signals():
        result = launch(ns.script, args, ns.num_processes, ns.cpu_devices, ns.platform,
                        ns.timeout, ns.log_dir, stream=not ns.quiet, grace_s=ns.grace,
                        module=module)
    print(f"jax_ar launch: {result.summary()}", file=sys.stderr)
    return result.exit_code
