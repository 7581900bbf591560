"""Entry point of one rank started by `python -m jax_ar launch`.

Configures JAX from the launcher's environment, joins jax.distributed, then
runs the user's script as __main__.
"""
from __future__ import annotations

import faulthandler
import os
import runpy
import signal
import sys
import traceback


def initialize_from_env() -> None:
    import jax

    cpu_devices = os.environ.get("JAX_AR_CPU_DEVICES")
    if cpu_devices:
        jax.config.update("jax_num_cpu_devices", int(cpu_devices))
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
        # psum across processes on CPU needs a collectives implementation.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    local_ids = os.environ.get("JAX_AR_LOCAL_DEVICE_IDS")
    jax.distributed.initialize(
        coordinator_address=os.environ["JAX_AR_COORDINATOR"],
        num_processes=int(os.environ["JAX_AR_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_AR_PROCESS_ID"]),
        local_device_ids=[int(i) for i in local_ids.split(",")] if local_ids else None,
    )


def report_failure(error: BaseException) -> None:
    """Tells the launcher that this rank failed. Needed because a failed rank
    does not exit at once: jax.distributed's shutdown waits for every other
    process, and the launcher must not wait for that to stop the job."""
    status_dir = os.environ.get("JAX_AR_LAUNCH_STATUS_DIR")
    if not status_dir:
        return
    if isinstance(error, SystemExit) and error.__context__ is not None:
        error = error.__context__  # sys.exit(1) in an except block: report what was caught
    text = f"{type(error).__name__}: {error}".splitlines()[0][:500] if str(error) else \
        type(error).__name__
    path = os.path.join(status_dir, f"rank{os.environ.get('JAX_AR_PROCESS_ID', '0')}.failed")
    try:
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
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


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m jax_ar.tools.bootstrap SCRIPT [ARGS...]")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    # The launcher sends SIGUSR1 before it kills a rank that is still running
    # after another failed: its stack then shows where it was stuck.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    initialize_from_env()
    from jax_ar import _compat
    from jax_ar.comm import rendezvous

    rendezvous.publish_process_identity(_compat.distributed_client(),
                                 int(os.environ["JAX_AR_PROCESS_ID"]))
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            report_failure(e)
            raise
    except BaseException as e:
        _fail(e)
    try:
        _fail_if_calls_were_skipped()
    except BaseException as e:
        _fail(e)


def _fail(error: BaseException) -> None:
    # The traceback goes out before the report: the launcher may stop this
    # process soon after it.
    traceback.print_exception(error)
    sys.stderr.flush()
    report_failure(error)
    sys.exit(1)


if __name__ == "__main__":
    main()
