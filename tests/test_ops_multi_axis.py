"""all_reduce over a (node, local) mesh, with processes standing in for hosts.

Each configuration launches workers/ops_multi_axis.py once; each suite is a
test id: host detection (a group spanning hosts falls back to psum, logged
once), both multi-axis plans for every dtype and op bit for bit against
jax_ar's arithmetic and psum over both axes, gradients, vmap, pytrees,
reduce_scatter / all_gather over the intra-host axis, bad input.
"""
import pytest

from harness import ON_GPU, check_suite, runs_on, suites_of

pytestmark = runs_on("cpu", "gpu")


WORKER = "ops_multi_axis.py"
CONFIGS = [  # (processes, devices per process, processes per host)
    (2, 2, 1),  # 2 hosts x 2 devices, each host one process
    (2, 4, 1),  # 2 hosts x 4 devices
    (4, 1, 2),  # 2 hosts x 2 processes: groups inside a host span processes
]
if ON_GPU:
    CONFIGS = [(4, 1, 2)]  # ranks share the GPU; only the suites without psum run


@pytest.mark.parametrize("suite", suites_of(WORKER))
@pytest.mark.parametrize("processes,devices,per_host", CONFIGS, ids=lambda v: str(v))
def test_multi_axis(processes, devices, per_host, suite):
    check_suite(WORKER, suite, per_host, processes=processes, devices_per_process=devices,
                timeout_s=600)
