"""Entry point of one rank started by `python -m jax_ar launch`.

Configures JAX from the launcher's environment, joins jax.distributed, then
runs the user's script as __main__.
"""
from __future__ import annotations

import os
import runpy
import sys


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


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m jax_ar._bootstrap SCRIPT [ARGS...]")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    initialize_from_env()
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
