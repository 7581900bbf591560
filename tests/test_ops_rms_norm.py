"""jax_ar.rms_norm: values of every dtype against numpy, NamedSharding arrays
in plain jit (sharding kept), shard_map, derivatives, vmap, bad input.

One launch per configuration runs workers/ops_rms_norm.py; each suite is a
test id. On CPU two processes of two devices (a 2x2 mesh whose arrays span
processes); on the GPU machine one process on the GPU, which runs the CUDA
kernels.
"""
import pytest

from harness import ON_GPU, check_suite, runs_on, suites_of

pytestmark = runs_on("cpu", "gpu")


WORKER = "ops_rms_norm.py"
CONFIGS = [(1, 1)] if ON_GPU else [(2, 2)]  # (processes, devices per process)


@pytest.mark.parametrize("suite", suites_of(WORKER))
@pytest.mark.parametrize("processes,devices", CONFIGS, ids=lambda v: str(v))
def test_rms_norm(processes, devices, suite):
    check_suite(WORKER, suite, processes=processes, devices_per_process=devices, timeout_s=600)
