"""Entry point of one rank started by `python -m jax_ar launch`.

Configures JAX from the launcher's environment, joins jax.distributed, runs
the user's script (or, after -m, module) as __main__, then ends in order:
jax_ar's communicators are closed, then jax.distributed is shut down (every
process takes part in its shutdown, so none goes away while its peers still
poll it). A rank that succeeded ends quietly: see _quiet_shutdown.

SIGTERM and SIGHUP (which the launcher forwards) raise SystemExit(128 + N)
in the script, as SIGINT raises KeyboardInterrupt, so its `finally` blocks
run; the rank then says it was stopped by the signal, closes its
communicators and exits 128 + N at once, without a traceback and without
waiting for its peers in jax.distributed's shutdown (they are being stopped
too).
"""
from __future__ import annotations

import faulthandler
import os
import runpy
import signal
import sys
import time
import traceback

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class _Stopped(SystemExit):
    """The launcher forwarded a stop signal."""

    def __init__(self, signum):
        super().__init__(128 + signum)
        self.signum = signum


# What `launch` sets for its ranks (jax_ar/tools/launch.py), and what a bad
# value tells the user: JAX_AR_CPU_DEVICES is --cpu-devices (a value the
# launcher inherits is passed on when --cpu-devices is not given); the rest
# are the launcher's own.
_FROM_LAUNCH = "set by `python -m jax_ar launch` for its ranks; run the script with launch"
_CPU_DEVICES_TODO = ("it is what `python -m jax_ar launch --cpu-devices K` gives each rank; "
                     "unset it, or pass --cpu-devices")


def _env_int(name: str, minimum: int, todo: str = _FROM_LAUNCH, text: str | None = None) -> int:
    """The integer the launcher's variable `name` holds; one line naming the
    variable (SystemExit, no traceback) if it is missing or no such number."""
    text = os.environ.get(name) if text is None else text
    if text is None:
        sys.exit(f"jax_ar: {name} is not set ({todo})")
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        sys.exit(f"jax_ar: {name} must be a whole number of at least {minimum}, got {text!r} "
                 f"({todo})")
    return value


def initialize_from_env() -> None:
    import jax

    cpu_devices = os.environ.get("JAX_AR_CPU_DEVICES")
    if cpu_devices:
        jax.config.update("jax_num_cpu_devices",
                          _env_int("JAX_AR_CPU_DEVICES", 1, _CPU_DEVICES_TODO))
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
        # psum across processes on CPU needs a collectives implementation.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    local_ids = os.environ.get("JAX_AR_LOCAL_DEVICE_IDS")
    coordinator = os.environ.get("JAX_AR_COORDINATOR")
    if not coordinator:
        sys.exit(f"jax_ar: JAX_AR_COORDINATOR is not set ({_FROM_LAUNCH})")
    num_processes = _env_int("JAX_AR_NUM_PROCESSES", 1)
    process_id = _env_int("JAX_AR_PROCESS_ID", 0)
    if process_id >= num_processes:
        sys.exit(f"jax_ar: JAX_AR_PROCESS_ID={process_id} is not below "
                 f"JAX_AR_NUM_PROCESSES={num_processes} ({_FROM_LAUNCH})")
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=[_env_int("JAX_AR_LOCAL_DEVICE_IDS", 0, text=i)
                          for i in local_ids.split(",")] if local_ids else None,
    )


def report_failure(error: BaseException, failed_at: float | None = None) -> None:
    """Tells the launcher that this rank failed, when, and the exit status
    it is ending with. Needed because a failed rank does not exit at once:
    jax.distributed's shutdown waits for every other process, and the
    launcher, which must not wait for that to stop the job, may have to kill
    the rank before its exit status exists."""
    status_dir = os.environ.get("JAX_AR_LAUNCH_STATUS_DIR")
    if not status_dir:
        return
    exit_status = _exit_status(error.code) if isinstance(error, SystemExit) else 1
    if isinstance(error, SystemExit) and error.__context__ is not None:
        error = error.__context__  # sys.exit(1) in an except block: report what was caught
    text = f"{type(error).__name__}: {error}".splitlines()[0][:500] if str(error) else \
        type(error).__name__
    path = os.path.join(status_dir, f"rank{os.environ.get('JAX_AR_PROCESS_ID', '0')}.failed")
    try:
        with open(path + ".tmp", "w") as f:
            f.write(f"{failed_at if failed_at is not None else time.time():.6f} {exit_status} "
                    f"{text}")
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def _exit_status(code) -> int:
    """The status a process ending with SystemExit(code) exits with, as
    Python and the OS make it: None is 0, an integer is taken modulo 256,
    anything else (a message, which Python prints) is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1


def _tell_launcher(what: str) -> None:
    status_dir = os.environ.get("JAX_AR_LAUNCH_STATUS_DIR")
    if status_dir:
        try:
            open(os.path.join(status_dir, f"rank{os.environ.get('JAX_AR_PROCESS_ID', '0')}."
                                          f"{what}"), "w").close()
        except OSError:
            pass


def _fail_if_calls_were_skipped() -> None:
    """A script that ends while a peer waits in a call it never made has
    diverged from its peers (it skipped a call, or they made an extra one):
    that rank fails too, rather than exit 0 while its peers fail."""
    from jax_ar.comm import communicator
    from jax_ar.errors import JaxArError

    skipped = communicator.close_all()
    if skipped:
        raise JaxArError("jax_ar: " + "; ".join(skipped))


def _die_with_launcher() -> None:
    """Asks the kernel to kill this rank when the launcher dies (Linux), so
    that no rank outlives a launcher killed outright (SIGKILL)."""
    launcher = os.environ.get("JAX_AR_LAUNCHER_PID")
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if launcher and os.getppid() != _env_int("JAX_AR_LAUNCHER_PID", 1):
        os._exit(128 + signal.SIGKILL)  # the launcher died before prctl took effect


def _on_stop_signal(signum, frame):
    raise _Stopped(signum)


def _catch_stop_signals() -> None:
    for s in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _on_stop_signal)


def _stop(signum: int) -> None:
    """Ends this rank after a forwarded signal: one line saying so,
    communicators closed (peers see it at once), no traceback, no wait in
    jax.distributed's shutdown.

    What close() would report here is the stop's doing, not a bug: a peer
    that the signal reached later, or that was waiting in a call when it
    came, has started a call this rank will never make. The close reports
    it as a call this rank skipped (it cannot know why this rank closes),
    so its log records are dropped: the signal is the report."""
    for s in STOP_SIGNALS:  # a second signal must not interrupt the exit
        signal.signal(s, signal.SIG_IGN)
    print(f"jax_ar: rank {os.environ.get('JAX_AR_PROCESS_ID', '0')} stopped by "
          f"{signal.Signals(signum).name}", file=sys.stderr, flush=True)
    _quiet_shutdown()
    try:
        import logging

        from jax_ar.comm import communicator

        logging.getLogger("jax_ar").disabled = True
        for comm in communicator.open_communicators():
            comm.close()
    except BaseException:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)


def _shutdown_distributed() -> None:
    try:
        import jax

        jax.distributed.shutdown()
    except Exception:  # the process ends anyway; the launcher has its status
        pass


def _quiet_shutdown() -> None:
    """Keeps the end of a rank that succeeded, or was stopped by a signal,
    free of gRPC warnings.

    JAX's runtime client (the backend, on GPU) watches the jax.distributed
    coordination service from a thread of its own and logs a C++ warning
    for every watch that fails: the one jax.distributed.shutdown() cancels,
    then, once process 0 has stopped the service, an "UNAVAILABLE: failed to
    connect to all addresses ... Connection refused" every second until the
    process ends. The watch ends quietly only when the client is destroyed
    first, which needs every array, device and mesh of the program gone
    (jax_ar's closed communicators keep their mesh), so instead the C++
    log threshold goes up to ERROR for the shutdown: the rank has already
    done its work, and errors still show."""
    jax = sys.modules.get("jax")  # not imported yet: nothing to quiet
    if jax is None:
        return
    try:
        jax.config.update("jax_logging_level", "ERROR")
    except Exception:  # a jax without the option: its warnings show
        pass


def main() -> None:
    if len(sys.argv) < 2 or (sys.argv[1] == "-m" and len(sys.argv) < 3):
        sys.exit("usage: python -m jax_ar.tools.bootstrap (SCRIPT | -m MODULE) [ARGS...]")
    _die_with_launcher()
    _catch_stop_signals()
    _tell_launcher("ready")  # from now on a stop signal ends this rank in order
    module = sys.argv[2] if sys.argv[1] == "-m" else None
    script = None if module else sys.argv[1]
    sys.argv = sys.argv[2:] if module else sys.argv[1:]  # run_module sets argv[0]
    # The launcher sends SIGUSR1 before it kills a rank that is still running
    # after another failed: its stack then shows where it was stuck.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        try:
            initialize_from_env()
            # jax.distributed's preemption notifier takes SIGTERM over (it
            # logs it and lets the process run on): take it back.
            _catch_stop_signals()
            from jax_ar import _compat
            from jax_ar.comm import rendezvous

            rendezvous.publish_process_identity(_compat.distributed_client(),
                                                int(os.environ["JAX_AR_PROCESS_ID"]))
            if module:
                sys.path.insert(0, os.getcwd())  # as python -m
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
                runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            if isinstance(e, _Stopped) or e.code not in (None, 0):
                raise
        _fail_if_calls_were_skipped()
    except _Stopped as e:
        _stop(e.signum)
    except KeyboardInterrupt:
        _stop(signal.SIGINT)
    except SystemExit as e:
        report_failure(e)
        raise
    except BaseException as e:
        _fail(e, time.time())
    _quiet_shutdown()
    _shutdown_distributed()


def _fail(error: BaseException, failed_at: float) -> None:
    # The traceback goes out before the report: the launcher may stop this
    # process soon after it.
    traceback.print_exception(error)
    sys.stderr.flush()
    report_failure(error, failed_at)
    sys.exit(1)


if __name__ == "__main__":
    main()
