"""all_reduce over a (node, local) mesh, with processes standing in for hosts.

One launch per configuration runs every suite of workers/axes_multi_axis_worker.py:
host detection (a group spanning hosts falls back to psum, logged once),
both hierarchical plans for every dtype and op bit for bit against jax_ar's
arithmetic and psum over both axes, gradients, vmap, pytrees,
reduce_scatter / all_gather over the intra-host axis, bad input.
"""
import pytest

from multiprocess import ON_GPU, run_ranks

CONFIGS = [  # (processes, devices per process, processes per host)
    (2, 2, 1),  # 2 hosts x 2 devices, each host one process
    (2, 4, 1),  # 2 hosts x 4 devices
    (4, 1, 2),  # 2 hosts x 2 processes: groups inside a host span processes
]
if ON_GPU:
    CONFIGS = [(4, 1, 2)]  # ranks share the GPU; only the suites without psum run


@pytest.mark.parametrize("processes,devices,per_host", CONFIGS, ids=lambda v: str(v))
def test_multi_axis(processes, devices, per_host):
    run_ranks("axes_multi_axis_worker.py", per_host, processes=processes,
              devices_per_process=devices, timeout_s=600)
