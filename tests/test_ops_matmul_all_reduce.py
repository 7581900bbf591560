"""jax_ar.matmul_all_reduce: inside shard_map and in plain jit on sharded
arrays (Explicit and Auto mesh axes, 1-D and 2-D meshes), bit for bit
against numpy, jnp + psum and XLA's own partitioning; independent calls in
one program, derivatives, vmap, the psum fallback (also in processes where
jax_ar.setup never ran), bad input.

One launch per configuration runs workers/ops_matmul_all_reduce.py; each
suite is a test id. On CPU two processes of two devices (4 ranks, so the
2 x 2 mesh runs too); on the GPU machine two ranks sharing the GPU.
"""
import pytest

from harness import ON_GPU, check_suite, runs_on, suites_of

pytestmark = runs_on("cpu", "gpu")

WORKER = "ops_matmul_all_reduce.py"
CONFIGS = [(2, 1)] if ON_GPU else [(2, 2)]  # (processes, devices per process)


@pytest.mark.parametrize("suite", suites_of(WORKER))
@pytest.mark.parametrize("processes,devices", CONFIGS, ids=lambda v: str(v))
def test_matmul_all_reduce(processes, devices, suite):
    check_suite(WORKER, suite, processes=processes, devices_per_process=devices, timeout_s=600)


@pytest.mark.skipif(ON_GPU, reason="ranks sharing a GPU cannot run psum, the fallback")
def test_psum_fallback_before_setup():
    check_suite(WORKER, "before_setup", "before_setup", processes=2, devices_per_process=1,
                timeout_s=300)
