"""Load: 10,000 back-to-back all-reduces of mixed sizes, dtypes, ops and
algorithms in one program (a scan), every result checked in the program
against plain XLA arithmetic and the digest of all of them against a numpy
simulation, bitwise equal on every rank, twice in a row.

See tests/workers/ops_load.py.
"""
import pytest

from harness import ON_GPU, run_ranks, runs_on

pytestmark = runs_on("cpu", "gpu")


ITERATIONS = 2000  # x 5 calls per iteration = 10,000 all-reduces

CONFIGS = [(4, 1)] if ON_GPU else [(2, 2), (4, 1)]  # (processes, devices per process)


@pytest.mark.parametrize("processes,devices", CONFIGS, ids=lambda v: str(v))
def test_ten_thousand_all_reduces(processes, devices):
    result = run_ranks("ops_load.py", ITERATIONS, processes=processes,
                       devices_per_process=devices, timeout_s=300)
    for log in result.logs:
        assert "load-check ok: 10000 results" in log, log
