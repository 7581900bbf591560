"""Lifecycle: 100 setup/close cycles without growth in shared-memory names,
file descriptors, mappings, registered ranks or GPU memory; compiled
programs that outlive close(); two communicators of a 2-D mesh in one
program; recompiles; a process that exits without close() leaves nothing.

See tests/workers/comm_lifecycle.py for the checks made in every rank.
"""
import os

from harness import ON_GPU, format_failure, run_ranks, runs_on

pytestmark = runs_on("cpu", "gpu")


CYCLES = 100


def test_lifecycle():
    # 4 ranks: two processes of two CPU devices (local and remote peers), or
    # four processes sharing the GPU.
    processes, devices = (4, 1) if ON_GPU else (2, 2)
    result = run_ranks("comm_lifecycle.py", CYCLES, processes=processes,
                       devices_per_process=devices, timeout_s=300)
    for rank, log in enumerate(result.logs):
        assert "lifecycle-check ok" in log, format_failure(result)
    if not ON_GPU:
        pids = [int(line.rsplit(" ", 1)[1]) for log in result.logs for line in log.splitlines()
                if "] pid " in line]
        assert len(pids) == processes, pids
        left = [n for n in os.listdir("/dev/shm")
                if n.startswith("jax_ar_") and any(f"_{pid}_" in n for pid in pids)]
        assert not left, f"processes that exited without close() left {left} in /dev/shm"
