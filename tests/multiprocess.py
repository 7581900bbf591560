"""Runs a worker script in several ranks through jax_ar's launcher.

Every rank's whole log is shown when any rank fails. The platform comes from
JAX_AR_TEST_PLATFORM: "cpu" (default, CI) or "gpu" (the device machine,
ranks sharing GPUs under CUDA MPS; see scripts/gpu_run.sh).
"""
from __future__ import annotations

import os
import pathlib

import pytest

from jax_ar.launch import launch

WORKERS = pathlib.Path(__file__).parent / "workers"
PLATFORM = os.environ.get("JAX_AR_TEST_PLATFORM", "cpu")
ON_GPU = PLATFORM == "gpu"


def run_ranks(worker: str, *args, processes: int = 2, devices_per_process: int = 1,
              timeout_s: float = 300.0, env: dict | None = None, expect_ok: bool = True):
    """Runs tests/workers/<worker> in `processes` ranks with
    `devices_per_process` devices each; fails the test (with every rank's
    log) unless all ranks exit 0. Returns the LaunchResult."""
    if ON_GPU and devices_per_process != 1:
        pytest.skip("on the GPU machine each rank owns one (shared) GPU")
    full_env = dict(os.environ)
    full_env.setdefault("JAX_AR_TIMEOUT_S", "60")
    full_env.update(env or {})
    result = launch(str(WORKERS / worker), [str(a) for a in args], num_processes=processes,
                    cpu_devices=None if ON_GPU else devices_per_process,
                    platform="gpu" if ON_GPU else "cpu", timeout_s=timeout_s, stream=False,
                    env=full_env)
    if expect_ok and not result.ok:
        pytest.fail(format_failure(result), pytrace=False)
    return result


def format_failure(result) -> str:
    parts = [f"jax_ar launch: {result.summary()}"]
    for rank, log in enumerate(result.logs):
        parts.append(f"----- rank {rank} (exit code {result.returncodes[rank]}) -----\n"
                     f"{log.rstrip()}")
    return "\n".join(parts)
