"""python -m jax_ar launch: ranks joined by jax.distributed, failures named,
deadlines enforced."""
import subprocess
import sys
import time

from jax_ar.tools.launch import launch

from harness import WORKERS, runs_on

pytestmark = runs_on("cpu", reason="the launcher does the same for either platform; these tests "
                                 "drive it with CPU ranks, and every GPU test runs through it")

PROBE = str(WORKERS / "tools_launch_probe.py")


def test_all_ranks_join_and_succeed():
    result = launch(PROBE, ["ok", "-1"], num_processes=3, cpu_devices=2, platform="cpu",
                    timeout_s=120, stream=False)
    assert result.ok, result.summary()
    for rank, log in enumerate(result.logs):
        assert f"rank {rank} of 3 with 2 devices" in log


def test_failing_rank_is_named_and_others_are_stopped():
    start = time.monotonic()
    result = launch(PROBE, ["fail", "1"], num_processes=2, platform="cpu", timeout_s=120,
                    stream=False, grace_s=2)
    assert not result.ok
    assert result.returncodes[1] == 3
    assert "rank 1 failed (exit code 3)" in result.summary()
    assert "failing on purpose" in result.logs[1]
    assert time.monotonic() - start < 60


def test_deadline_kills_every_rank():
    start = time.monotonic()
    result = launch(PROBE, ["hang", "0"], num_processes=2, platform="cpu", timeout_s=8,
                    stream=False)
    assert result.timed_out and not result.ok
    assert result.returncodes[0] is None  # killed at the deadline
    assert "killed at the deadline" in result.summary()
    assert time.monotonic() - start < 40


def test_command_line_exit_code_and_prefixed_output():
    proc = subprocess.run([sys.executable, "-m", "jax_ar", "launch", "-n", "2", "--platform",
                           "cpu", PROBE, "fail", "0"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 3
    assert "[rank 0] failing on purpose" in proc.stdout
    assert "rank 0 failed (exit code 3)" in proc.stderr
