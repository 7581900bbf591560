"""Communicator lookup by devices: several communicators of one axis name in
one program (two device orders of a mesh, disjoint sub-meshes), a mesh never
set up, a mesh of another shape with the same groups, a jaxpr reused for
another device order, eager shard_map, jax.set_mesh, a nested shard_map,
an AbstractMesh, a shard_map that leaves a mesh axis automatic.

Each configuration launches workers/comm_lookup.py once; each suite is a
test id.
"""
import pytest

from harness import ON_GPU, check_suite, runs_on, suites_of

pytestmark = runs_on("cpu", "gpu")


WORKER = "comm_lookup.py"
CONFIGS = [  # (processes, devices per process)
    (1, 4),
    (2, 2),
]
if ON_GPU:
    CONFIGS = [(4, 1)]


@pytest.mark.parametrize("suite", suites_of(WORKER))
@pytest.mark.parametrize("processes,devices", CONFIGS, ids=lambda v: str(v))
def test_comm_lookup(processes, devices, suite):
    check_suite(WORKER, suite, processes=processes, devices_per_process=devices, timeout_s=600)
