"""python -m jax_ar launch -n N script.py: N local processes joined by jax.distributed.

Each rank runs `script.py` (or, with -m, a module) as __main__ after
jax.distributed.initialize() (see bootstrap.py), so the script needs no
launcher-specific code. Output of every rank is streamed with a "[rank i]"
prefix (without the collectives' connection chatter, relay.GlooReports, and
the shutdown noise listed in relay.NOISE) and, with --log-dir, kept as
printed in one file per rank; should stdout's reader go away (`launch ... |
head`), the ranks run on, read but no longer printed (relay.Output). The
launcher exits non-zero if any rank fails, naming it, and kills every rank
still running at the deadline. Every word after SCRIPT (or -m MODULE) goes
to it as python would pass it (split_command).

When a rank fails, the others get a short grace period (see
default_grace_s) to report their own errors, then the launcher dumps the
stacks of those still running and kills them. A rank that raised counts as
failed at once, even though jax.distributed's shutdown may hold its process
until every peer exits. relay.py watches the ranks and says which failed
first.

SIGTERM, SIGHUP and SIGINT (Ctrl-C) that reach the launcher are forwarded
to every rank (launch_signals.py; each rank runs in a session of its own,
so a terminal's signals reach only the launcher); ranks still running
STOP_GRACE_S later are killed, and the launcher exits 128 + the signal
number with one line naming the signal. The ranks also die with the
launcher if it is killed outright (bootstrap.py asks the kernel for that).

This file starts the ranks and holds the command line.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

from ..config import DEFAULT_TIMEOUT_S
from . import relay
from .closed_output import flush_or_silence, print_or_silence
from .folders import unwritable
from .launch_signals import STOP_SIGNALS, Job, current_scope, forwarding_signals
from .relay import STOP_GRACE_S, LaunchResult

__all__ = ["LaunchResult", "STOP_GRACE_S", "STOP_SIGNALS", "forwarding_signals", "launch",
           "main"]


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


def resolve_platform(platform: str, env) -> tuple[str, int]:
    """("cpu" | "gpu", number of GPUs) for platform auto|cpu|gpu: auto is
    the GPUs when nvidia-smi lists any (and JAX_PLATFORMS in `env` is not
    cpu), else CPU devices. ValueError for gpu where there is none."""
    gpus = gpu_count()
    if platform == "auto":
        platform = "gpu" if gpus > 0 and env.get("JAX_PLATFORMS", "") != "cpu" else "cpu"
    if platform == "gpu" and gpus == 0:
        raise ValueError("--platform gpu, but nvidia-smi lists no GPU")
    return platform, gpus


def check_arguments(num_processes, cpu_devices, timeout_s, grace_s) -> None:
    """ValueError, naming the option, for a value launch() cannot run with
    (NaN included: it would compare as no deadline, or no grace)."""
    if num_processes < 1:
        raise ValueError(f"-n must be at least 1, got {num_processes}")
    if cpu_devices is not None and cpu_devices < 1:
        raise ValueError(f"--cpu-devices must be at least 1, got {cpu_devices}")
    check_timeout(timeout_s)
    if grace_s is not None and not (math.isfinite(grace_s) and grace_s >= 0):
        raise ValueError(f"--grace must be 0 or a positive number of seconds, got {grace_s:g}")


def check_timeout(timeout_s) -> None:
    """ValueError unless `timeout_s` is a deadline: positive and finite."""
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"--timeout must be a positive number of seconds, got {timeout_s:g}")


def prepare_log_dir(log_dir) -> None:
    """Creates `log_dir` unless it exists; ValueError, naming --log-dir,
    where the ranks' logs cannot be written."""
    if os.path.exists(log_dir) and not os.path.isdir(log_dir):
        raise ValueError(f"--log-dir {log_dir} is not a directory")
    failed = unwritable(log_dir)
    if failed:
        stage, e = failed
        raise ValueError(f"--log-dir {log_dir}: cannot "
                         f"{'create it' if stage == 'create' else 'write in it'} "
                         f"({e.strerror or e})")


def launch(script=None, args=(), num_processes=2, cpu_devices=None, platform="auto",
           timeout_s=600.0, log_dir=None, stream=True, env=None, grace_s=None, *,
           module=None) -> LaunchResult:
    """Runs `script` (or `module`, as python -m does) in `num_processes`
    ranks; returns when all have ended.

    Once a rank fails (raises, or exits non-zero, or dies), the others get
    `grace_s` seconds to end by themselves; then those still running are
    killed (after a dump of their Python stacks to their log).

    With `stream`, each rank's lines are printed to sys.stdout as they come;
    should a write fail (a closed pipe), printing stops and the ranks run on.
    `log_dir` is created if need be (ValueError where it cannot be, before
    any rank starts).

    Called in the main thread outside forwarding_signals(), it forwards
    SIGTERM, SIGHUP and SIGINT to the ranks while they run (see
    forwarding_signals) and, once every rank has ended, lets the signal act
    on this process as it would have: SIGINT raises KeyboardInterrupt, the
    others run their previous handler (by default, end the process)."""
    if (script is None) == (module is None):
        raise ValueError("launch: give a script or a module, not both")
    check_arguments(num_processes, cpu_devices, timeout_s, grace_s)
    if log_dir:
        prepare_log_dir(log_dir)
    scope = current_scope()
    if scope is not None or threading.current_thread() is not threading.main_thread():
        return _launch(scope, script, module, args, num_processes, cpu_devices, platform,
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
    platform, gpus = resolve_platform(platform, base_env)
    if grace_s is None:
        grace_s = default_grace_s(platform, base_env)
    log_files = []  # opened before any rank starts
    try:
        for rank in range(num_processes if log_dir else 0):
            log_files.append(open(os.path.join(log_dir, f"rank{rank}.log"), "w"))
    except OSError:
        for f in log_files:
            f.close()
        raise
    status_dir = tempfile.mkdtemp(prefix="jax_ar_launch_")
    target = ["-m", module] if module is not None else [script]

    job = Job()
    if scope is not None:
        scope.jobs.add(job)
        if scope.signum is not None:  # a signal came before this launch started
            job.request_stop(scope.signum)
    procs, logs, threads = [], [[] for _ in range(num_processes)], []
    watch = relay.Watch()
    output = relay.Output(enabled=stream)
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
            log_file = log_files[rank] if log_files else None
            for fn, fn_args in ((relay.pump, (proc, rank, logs[rank], log_file, output)),
                                (relay.reap, (proc, rank, watch))):
                thread = threading.Thread(target=fn, args=fn_args, daemon=True)
                thread.start()
                threads.append(thread)
        relay.supervise(job, procs, logs, status_dir, timeout_s, grace_s, output, watch)
        if watch.signal is None and job.stop_signum is not None:
            watch.signal = job.stop_signum  # it came as the last ranks ended: still obeyed
    finally:
        relay.kill_all(procs)
        for f in log_files[len(procs):]:  # ranks never started (the pumps close the others)
            f.close()
        shutil.rmtree(status_dir, ignore_errors=True)
        if scope is not None:
            scope.jobs.discard(job)
    return relay.result_of(procs, threads, logs, watch, num_processes)


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jax_ar launch",
        usage="%(prog)s [options] [--] (SCRIPT | -m MODULE) [ARGS ...]",
        description="Run SCRIPT (or -m MODULE) in N local processes joined by jax.distributed, "
                    "each as __main__ with ARGS: everything after SCRIPT or MODULE, passed on "
                    "as python passes it ('--' and options included). SIGTERM, SIGHUP and "
                    "Ctrl-C are forwarded to every rank; ranks still running 3 s later are "
                    "killed.",
        epilog="exit status: 0 when every rank succeeded; the first failed rank's exit code "
               "(or 1); 124 at --timeout; 128 + N when signal N stopped the job; 2 for a "
               "usage error")
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
    parser.add_argument("--log-dir", default=None, metavar="DIR",
                        help="also write each rank's output, as printed (the chatter the "
                             "stream drops included), to rank<i>.log in DIR (created if "
                             "need be)")
    parser.add_argument("--quiet", action="store_true", help="do not stream rank output")
    # SCRIPT, -m MODULE and ARGS are here for --help: split_command finds them.
    parser.add_argument("-m", dest="module", metavar="MODULE",
                        help="run library module MODULE as a script, as python -m does "
                             "(what follows it goes to the module)")
    parser.add_argument("script", nargs="?", metavar="SCRIPT",
                        help="the Python file every rank runs ('--' before it ends the "
                             "launcher's options)")
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments for SCRIPT or MODULE (its sys.argv[1:], verbatim)")
    return parser


def split_command(parser, argv):
    """(launcher's options, "script" | "module" | None, its name, ARGS):
    argv split where python would split it. The launcher's options end at
    the first word that is neither an option nor an option's value, at -m
    MODULE, or at '--' (which the launcher drops); the script or module
    comes next and every word after it is its own, verbatim. (argparse
    would drop a '--' meant for the script and take one after -m MODULE for
    its own.)"""
    argv = list(argv)
    actions = parser._option_string_actions
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            name = argv[i + 1] if i + 1 < len(argv) else None
            return argv[:i], ("script" if name is not None else None), name, argv[i + 2:]
        if word.startswith("-m") and not word.startswith("--"):  # -m MODULE, -mMODULE
            name = word[2:] or (argv[i + 1] if i + 1 < len(argv) else None)
            rest = argv[i + 1:] if word[2:] else argv[i + 2:]
            return argv[:i], "module", name, rest
        if not word.startswith("-") or word == "-":
            return argv[:i], "script", word, argv[i + 1:]
        if word.startswith("--"):
            action = None
            if "=" not in word:
                prefixed = [o for o in actions if o.startswith(word)]  # argparse's abbreviations
                action = actions.get(word) or (actions[prefixed[0]] if len(prefixed) == 1
                                               else None)
        else:
            action = actions.get(word) if len(word) == 2 else None  # -n3: value attached
        i += 2 if action is not None and action.nargs != 0 else 1
    return argv, None, None, []


def main(argv=None) -> int:
    parser = build_parser()
    options, kind, name, args = split_command(parser, sys.argv[1:] if argv is None else argv)
    ns = parser.parse_args(options)
    script = module = None
    if kind == "module":
        if not name:
            parser.error("argument -m: expected a module name")
        module = name
        if importlib.util.find_spec(module.split(".")[0]) is None:
            parser.error(f"no module named {module.split('.')[0]!r}")
    elif kind == "script":
        script = name
        if not os.path.exists(script):
            parser.error(f"no such script: {script}")
    else:
        parser.error("give SCRIPT or -m MODULE")
    try:
        check_arguments(ns.num_processes, ns.cpu_devices, ns.timeout, ns.grace)
        resolve_platform(ns.platform, os.environ)
        if ns.log_dir:
            prepare_log_dir(ns.log_dir)
    except ValueError as e:
        parser.error(str(e))
    with forwarding_signals():
        result = launch(script, args, ns.num_processes, ns.cpu_devices, ns.platform,
                        ns.timeout, ns.log_dir, stream=not ns.quiet, grace_s=ns.grace,
                        module=module)
    # stdout's reader may have gone (`launch ... | head`: the ranks ran on,
    # unprinted, relay.Output), and stderr's with it: no error of the job,
    # and no reason for a traceback.
    flush_or_silence(sys.stdout)
    print_or_silence(f"jax_ar launch: {result.summary()}", sys.stderr)
    return result.exit_code
