"""Faults: ranks that disagree, skip a call, die, or hang must end in errors
naming jax_ar on every rank, quickly, and never in a result or a hang.

Each test launches tests/workers/comm_faults.py with one scenario; the
worker asserts what every rank sees (messages, how fast) and that close() +
setup() gives exact results afterwards. Here the launcher's side is checked:
which rank it blames, which it stops, how long the job takes, and that
nothing is left in /dev/shm.
"""
import os
import re
import subprocess
import sys
import time

import pytest

from harness import ON_GPU, format_failure, run_ranks, runs_on

pytestmark = runs_on("cpu", "gpu")


# Short deadlines keep these tests fast; scenarios that must not wait for a
# deadline set a long one themselves and check that they did not.
FAULT_ENV = {"JAX_AR_TIMEOUT_S": "5", "FAULT_DEADLINE_S": "2"}
# How every failure message of both backends ends (cuda/common/failure_text.h).
ADVICE = "The communicator is unusable until close() and a new setup()."


def run_fault(scenario, processes=2, expect_ok=True, env=None, timeout_s=180):
    result = run_ranks("comm_faults.py", scenario, processes=processes, timeout_s=timeout_s,
                       env={**FAULT_ENV, **(env or {})}, expect_ok=expect_ok)
    return result


def assert_ranks_checked(result, scenario, ranks):
    for rank in ranks:
        assert f"fault-check ok: {scenario}" in result.logs[rank], format_failure(result)


def pids_of(result):
    return [int(m) for log in result.logs for m in re.findall(r"\] pid (\d+)", log)]


def jax_ar_segments_of(pids):
    """Names in /dev/shm that processes `pids` created."""
    if ON_GPU or not os.path.isdir("/dev/shm"):
        return []
    return [n for n in os.listdir("/dev/shm")
            if n.startswith("jax_ar_") and any(f"_{pid}_" in n for pid in pids)]


@pytest.mark.parametrize("processes", [2, 3])
def test_disagreeing_calls_fail_on_every_rank(processes):
    result = run_fault("disagree", processes=processes)
    assert_ranks_checked(result, "disagree", range(processes))


def test_skipped_call():
    result = run_fault("skip")
    assert_ranks_checked(result, "skip", range(2))


def test_rank_that_skips_its_last_call_and_ends():
    """Both ranks end in errors naming jax_ar: the waiting one at once, the
    skipping one when its script ends (it closes, sees that its peer
    started a call it never made)."""
    start = time.monotonic()
    result = run_fault("skip_and_end", expect_ok=False, env={"FAULT_DEADLINE_S": "default"})
    took = time.monotonic() - start
    assert_ranks_checked(result, "skip_and_end", range(2))
    failed = dict(result.failures)
    assert "jax_ar" in failed.get(0, "") and ADVICE in failed[0], format_failure(result)
    if not ON_GPU:  # the CPU backend sees the skipped call when odd closes
        assert "jax_ar" in failed.get(1, "") and "skipped" in failed[1], format_failure(result)
        # ... and the same picture of a rank that came after its peer's deadline.
        assert "or came to it after rank 0 had given up on it" in failed[1], \
            format_failure(result)
        # ... naming the other cause of the same picture: calls still queued.
        assert "jax.block_until_ready" in failed[1], format_failure(result)
        assert took < 30, f"the job took {took:.1f} s"


def test_failures_are_caught_as_jax_ar_errors():
    """jax_ar.checked() and trace-time checks give JaxArError (README,
    docs/guarantees.md: what is raised where)."""
    result = run_fault("catchable")
    assert_ranks_checked(result, "catchable", range(2))


def test_disagreeing_setups():
    result = run_fault("setup_disagree")
    assert_ranks_checked(result, "setup_disagree", range(2))


def test_dead_rank_in_all_reduce():
    result = run_fault("die", processes=3, expect_ok=False)
    assert result.first_failed_rank == 1, format_failure(result)
    assert "SIGKILL" in result.failures[0][1], result.summary()
    assert_ranks_checked(result, "die", [0, 2])
    assert not jax_ar_segments_of(pids_of(result)), "a killed rank left segments in /dev/shm"


def test_rank_killed_in_a_call_its_peers_never_make():
    """A peer killed inside a call is not one whose program made an extra
    call: the others' end-of-script check blames nobody and does not wait
    for it (they raise on purpose, to skip jax.distributed's shutdown)."""
    result = run_fault("die_in_extra_call", expect_ok=False)
    assert result.first_failed_rank == 1, format_failure(result)
    assert "SIGKILL" in result.failures[0][1], result.summary()
    assert_ranks_checked(result, "die_in_extra_call", [0])


def test_dead_rank_in_setup():
    result = run_fault("die_in_setup", expect_ok=False)
    assert result.first_failed_rank == 1, format_failure(result)
    assert_ranks_checked(result, "die_in_setup", [0])
    # The victim died holding a named segment; the next workspace created on
    # this machine removes it.
    _create_one_workspace()
    assert not jax_ar_segments_of(pids_of(result)), "segment of a dead process not removed"


def test_stuck_rank_is_stopped_by_the_launcher():
    start = time.monotonic()
    result = run_fault("stuck", expect_ok=False)
    took = time.monotonic() - start
    assert result.first_failed_rank == 0 and result.stopped == [1], format_failure(result)
    assert all(fragment in result.failures[0][1] for fragment in
               ("jax_ar", "timed out", "rank 0", "rank 1", ADVICE)), format_failure(result)
    stuck_log = result.logs[1]
    assert "still running" in stuck_log and "scenario_stuck" in stuck_log, stuck_log
    if not ON_GPU:  # deadline 2 s + grace 5 s + start-up
        assert took < 40, f"the job took {took:.1f} s"


@pytest.mark.skipif(ON_GPU, reason="the 30 s bound is for CPU (GPU grace is deadline + 5 s)")
def test_skipped_call_with_default_deadline_ends_within_30_s():
    """The default deadline, the launcher's default grace and start-up fit in
    30 s: a rank that skips a call (and hangs) ends the job with errors
    naming jax_ar."""
    start = time.monotonic()
    result = run_fault("stuck", expect_ok=False,
                       env={"JAX_AR_TIMEOUT_S": "", "FAULT_DEADLINE_S": "default"})
    took = time.monotonic() - start
    assert result.first_failed_rank == 0 and result.stopped == [1], format_failure(result)
    assert "jax_ar" in result.logs[0] and "jax_ar launch" in result.logs[1]
    assert took < 30, f"the job took {took:.1f} s:\n{format_failure(result)}"


@pytest.mark.skipif(ON_GPU, reason="/dev/shm is the CPU backend's")
def test_segments_of_exited_creators_are_removed():
    """A name left by a process killed inside setup (its creator's identity
    is in the name) is removed by the next workspace creation."""
    probe = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    dead_pid = int(probe.stdout)
    namespace = os.stat("/proc/self/ns/pid").st_ino
    leftover = f"/dev/shm/jax_ar_{namespace}_{dead_pid}_1_0_0"
    with open(leftover, "wb") as f:
        f.write(b"\0" * 4096)
    alive = f"/dev/shm/jax_ar_{namespace}_{os.getpid()}_1_0_0"  # ours, start time differs
    mine = f"/dev/shm/jax_ar_{namespace}_{os.getpid()}_{_start_ticks()}_0_0"
    for path in (alive, mine):
        with open(path, "wb") as f:
            f.write(b"\0" * 4096)
    try:
        _create_one_workspace()
        assert not os.path.exists(leftover), "the dead creator's segment was not removed"
        assert not os.path.exists(alive), "a segment of a reused pid was not removed"
        assert os.path.exists(mine), "a live creator's segment was removed"
    finally:
        for path in (leftover, alive, mine):
            if os.path.exists(path):
                os.unlink(path)


def _start_ticks():
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def _create_one_workspace():
    if ON_GPU:
        return
    from jax_ar import _native

    cpu = _native.cpu
    comm_id = 0x7fff_0000_0000 + os.getpid()
    cpu.create_workspace(comm_id, 1 << 20)
    cpu.unlink_workspaces(comm_id)
    cpu.close_comm(comm_id)
