"""jax_ar.rms_norm: values of every dtype against numpy, NamedSharding arrays
in plain jit (sharding kept), shard_map, derivatives, vmap, bad input.

One launch per configuration runs every suite of
workers/norm_rms_norm_worker.py: on CPU two processes of two devices (a
2x2 mesh whose arrays span processes); on the GPU machine one process on
the GPU, which runs the CUDA kernels.
"""
import pytest

from multiprocess import ON_GPU, run_ranks

CONFIGS = [(1, 1)] if ON_GPU else [(2, 2)]  # (processes, devices per process)


@pytest.mark.parametrize("processes,devices", CONFIGS, ids=lambda v: str(v))
def test_rms_norm(processes, devices):
    run_ranks("norm_rms_norm_worker.py", processes=processes, devices_per_process=devices,
              timeout_s=600)
