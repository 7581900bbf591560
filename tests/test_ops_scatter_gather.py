"""jax_ar.reduce_scatter and jax_ar.all_gather across real processes.

Each configuration launches workers/ops_scatter_gather.py once; each suite
is a test id: values of every dtype, dimension and tiled form bit for bit
against host references and (CPU) jax.lax's psum_scatter / all_gather,
special values, several protocol rounds, gradients (each is the other's
transpose), vmap, pytrees, bad input.
"""
import pytest

from harness import ON_GPU, check_suite, runs_on, suites_of

pytestmark = runs_on("cpu", "gpu")


WORKER = "ops_scatter_gather.py"
CONFIGS = [  # (processes, devices per process)
    (2, 2),
    (1, 3),
]
if ON_GPU:
    CONFIGS = [(2, 1), (4, 1)]


@pytest.mark.parametrize("suite", suites_of(WORKER))
@pytest.mark.parametrize("processes,devices", CONFIGS, ids=lambda v: str(v))
def test_reduce_scatter_all_gather(processes, devices, suite):
    check_suite(WORKER, suite, processes=processes, devices_per_process=devices, timeout_s=600)
