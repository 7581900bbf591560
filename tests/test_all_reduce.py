"""jax_ar.all_reduce across real processes (and several devices per process).

Each configuration runs every suite of workers/all_reduce_worker.py once:
values of every dtype/op/algorithm bit for bit against the emulated
reduction order and close to float64, special values, pytrees, gradients
against psum, vmap, repeated calls of changing sizes, and bad input.
"""
import pytest

from multiprocess import ON_GPU, run_ranks

CONFIGS = [  # (processes, devices per process)
    (1, 8),
    (2, 1),
    (2, 2),
    (4, 1),
    (4, 2),
]
if ON_GPU:
    CONFIGS = [(2, 1), (4, 1), (8, 1)]


@pytest.mark.parametrize("processes,devices", CONFIGS, ids=lambda v: str(v))
def test_all_reduce(processes, devices):
    run_ranks("all_reduce_worker.py", processes=processes, devices_per_process=devices,
              timeout_s=900)
