"""jax_ar.reduce_scatter and jax_ar.all_gather across real processes.

One launch per configuration runs every suite of
workers/axes_scatter_gather_worker.py: values of every dtype, dimension and
tiled form bit for bit against host references and (CPU) jax.lax's
psum_scatter / all_gather, special values, several protocol rounds,
gradients (each is the other's transpose), vmap, pytrees, bad input.
"""
import pytest

from multiprocess import ON_GPU, run_ranks

CONFIGS = [  # (processes, devices per process)
    (2, 2),
    (1, 3),
]
if ON_GPU:
    CONFIGS = [(2, 1), (4, 1)]


@pytest.mark.parametrize("processes,devices", CONFIGS, ids=lambda v: str(v))
def test_reduce_scatter_all_gather(processes, devices):
    run_ranks("axes_scatter_gather_worker.py", processes=processes,
              devices_per_process=devices, timeout_s=600)
