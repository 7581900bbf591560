"""jax_ar.all_reduce across real processes (and several devices per process).

Each configuration launches workers/ops_all_reduce.py once; each of its
suites is a test id: values of every dtype/op/algorithm bit for bit against
the emulated reduction order and close to float64, special values, pytrees,
gradients against psum, vmap, repeated calls of changing sizes, bad input.
"""
import pytest

from harness import ON_GPU, check_suite, runs_on, suites_of

pytestmark = runs_on("cpu", "gpu")


WORKER = "ops_all_reduce.py"
# (processes, devices per process). Eight ranks in one process (1, 8) and
# several devices in each of several processes (2, 2) cover what (4, 2)
# did, which cost CI about 2 minutes per jax version.
CONFIGS = [
    (1, 8),
    (2, 1),
    (2, 2),
    (4, 1),
]
if ON_GPU:
    CONFIGS = [(2, 1), (4, 1), (8, 1)]


@pytest.mark.parametrize("suite", suites_of(WORKER))
@pytest.mark.parametrize("processes,devices", CONFIGS, ids=lambda v: str(v))
def test_all_reduce(processes, devices, suite):
    # On the GPU a configuration takes 20-80 s: a launch that hangs ends at
    # 300 s with every rank's stack, inside gpu_run.sh's command budget.
    check_suite(WORKER, suite, processes=processes, devices_per_process=devices,
                timeout_s=300 if ON_GPU else 900)
