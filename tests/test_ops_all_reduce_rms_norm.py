"""jax_ar.all_reduce_rms_norm across real processes: every dtype with and
without FP8 output against numpy (residual_out bit for bit, out against
float64), random shapes down to one token, the general and psum paths,
gradients against the unfused all_reduce + add + norm, vmap, bad input.

Each configuration (2, 4 and 8 ranks) launches
workers/ops_all_reduce_rms_norm.py once; each suite is a test id.
"""
import pytest

from harness import ON_GPU, check_suite, runs_on, suites_of
from norm_skips import fused_target_missing

pytestmark = runs_on("cpu", "gpu")

WORKER = "ops_all_reduce_rms_norm.py"
CONFIGS = [(2, 1), (2, 2), (2, 4)]  # (processes, devices per process): 2, 4, 8 ranks
if ON_GPU:
    CONFIGS = [(2, 1), (4, 1), (8, 1)]


@pytest.mark.parametrize("suite", suites_of(WORKER))
@pytest.mark.parametrize("processes,devices", CONFIGS, ids=lambda v: str(v))
def test_all_reduce_rms_norm(processes, devices, suite):
    missing = fused_target_missing()
    if missing:  # psum cannot stand in on a shared GPU
        pytest.skip(missing)
    check_suite(WORKER, suite, processes=processes, devices_per_process=devices, timeout_s=900)
