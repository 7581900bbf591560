"""jax_ar.all_reduce_rms_norm across real processes: every dtype with and
without FP8 output against numpy (residual_out bit for bit, out against
float64), random shapes down to one token, the general and psum paths,
gradients against the unfused all_reduce + add + norm, vmap, bad input.

One launch per configuration runs every suite of
workers/norm_all_reduce_rms_norm_worker.py: 2, 4 and 8 ranks.
"""
import pytest

from multiprocess import ON_GPU, run_ranks
from norm_skips import fused_target_missing

CONFIGS = [(2, 1), (2, 2), (2, 4)]  # (processes, devices per process): 2, 4, 8 ranks
if ON_GPU:
    CONFIGS = [(2, 1), (4, 1), (8, 1)]


@pytest.mark.parametrize("processes,devices", CONFIGS, ids=lambda v: str(v))
def test_all_reduce_rms_norm(processes, devices):
    missing = fused_target_missing()
    if missing:  # psum cannot stand in on a shared GPU
        pytest.skip(missing)
    run_ranks("norm_all_reduce_rms_norm_worker.py", processes=processes,
              devices_per_process=devices, timeout_s=900)
