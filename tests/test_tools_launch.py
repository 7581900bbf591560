"""python -m jax_ar launch: ranks joined by jax.distributed, failures named
(the first to fail first), deadlines enforced, signals forwarded and no rank
left behind, -m MODULE, arguments passed as python passes them, a closed
stdout."""
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from jax_ar.tools import launch as launch_module
from jax_ar.tools import relay
from jax_ar.tools.launch import launch

from harness import WORKERS, runs_on

pytestmark = runs_on("cpu", reason="the launcher does the same for either platform; these tests "
                                 "drive it with CPU ranks, and every GPU test runs through it")

PROBE = str(WORKERS / "tools_launch_probe.py")


def test_all_ranks_join_and_succeed():
    result = launch(PROBE, ["ok", "-1"], num_processes=3, cpu_devices=2, platform="cpu",
                    timeout_s=120, stream=False)
    assert result.ok, result.summary()
    assert result.summary() == "all 3 ranks succeeded"
    for rank, log in enumerate(result.logs):
        assert f"rank {rank} of 3 with 2 devices" in log


def test_one_rank_that_succeeds_is_summed_up_in_the_singular():
    result = launch(PROBE, ["ok", "-1"], num_processes=1, platform="cpu", timeout_s=120,
                    stream=False)
    assert result.ok and result.summary() == "the rank succeeded", result.summary()


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


def test_exit_code_of_a_failed_rank_the_launcher_had_to_kill():
    """Rank 1 exits 3 while rank 0 sleeps on: jax.distributed's shutdown
    holds rank 1 until the launcher kills it (SIGKILL), yet the launcher
    exits with the code rank 1 was ending with, the one its summary names."""
    proc = subprocess.run([sys.executable, "-m", "jax_ar", "launch", "-n", "2", "--platform",
                           "cpu", "--grace", "1", PROBE, "fail_others_loop", "1"],
                          capture_output=True, text=True, timeout=120)
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("jax_ar launch: rank 1 failed (exit code 3); rank 0 still running after "
                    "that, killed"), proc.stderr
    assert proc.returncode == 3, proc.stderr


def test_collectives_chatter_and_exit_noise_are_dropped_but_logged(tmp_path):
    result = launch(PROBE, ["noise", "-1"], num_processes=2, platform="cpu", timeout_s=120,
                    stream=False, log_dir=str(tmp_path))
    assert result.ok, result.summary()
    for rank, log in enumerate(result.logs):
        assert "my own line" in log and "\n7\n" in log
        assert "1" not in log.splitlines(), log  # the number of a spliced report
        for noise in ("[Gloo]", "peer ranks", "WatchTasksAsync", "Check failure", "0x7f0000000000", "GRPC",
                      "UNAVAILABLE", "Source Location", "grpc_util.h"):
            assert noise not in log, log
        assert "my last line" in log, log  # the first line after a gRPC message is kept
        kept = (tmp_path / f"rank{rank}.log").read_text()  # --log-dir keeps everything
        assert "[Gloo]" in kept and "WatchTasksAsync" in kept and "grpc_util.h" in kept


@pytest.mark.parametrize("value", ["abc", "0"])
def test_a_bad_jax_ar_cpu_devices_is_one_line_naming_it(value):
    """JAX_AR_CPU_DEVICES is what --cpu-devices gives each rank (a value in
    the launcher's environment passes on without it): a bad one is one line
    naming the variable, not a traceback from int()."""
    result = launch(PROBE, ["ok", "-1"], num_processes=1, platform="cpu", timeout_s=120,
                    stream=False, env=dict(os.environ, JAX_AR_CPU_DEVICES=value))
    assert not result.ok and result.returncodes == [1], result.summary()
    assert f"jax_ar: JAX_AR_CPU_DEVICES must be a whole number of at least 1, got {value!r}" \
        in result.logs[0] and "--cpu-devices" in result.logs[0], result.logs[0]
    assert "Traceback" not in result.logs[0], result.logs[0]


def test_bootstrap_outside_launch_is_one_line_naming_the_variable():
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_AR_")}
    proc = subprocess.run([sys.executable, "-m", "jax_ar.tools.bootstrap", PROBE, "ok", "-1"],
                          capture_output=True, text=True, timeout=120,
                          env=dict(env, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 1, proc
    assert proc.stderr.strip() == ("jax_ar: JAX_AR_COORDINATOR is not set (set by `python -m "
                                   "jax_ar launch` for its ranks; run the script with launch)"), \
        proc.stderr
    proc = subprocess.run([sys.executable, "-m", "jax_ar.tools.bootstrap", PROBE, "ok", "-1"],
                          capture_output=True, text=True, timeout=120,
                          env=dict(env, JAX_PLATFORMS="cpu", JAX_AR_COORDINATOR="127.0.0.1:1",
                                   JAX_AR_NUM_PROCESSES="2", JAX_AR_PROCESS_ID="two"))
    assert proc.returncode == 1, proc
    assert proc.stderr.strip().startswith("jax_ar: JAX_AR_PROCESS_ID must be a whole number of "
                                          "at least 0, got 'two'"), proc.stderr


def test_module_runs_like_python_dash_m():
    proc = subprocess.run([sys.executable, "-m", "jax_ar", "launch", "-n", "2", "--platform",
                           "cpu", "-m", "tools_launch_probe", "fail", "1"], cwd=WORKERS,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "[rank 0] rank 0 of 2" in proc.stdout and "[rank 1] failing on purpose" in proc.stdout
    missing = subprocess.run([sys.executable, "-m", "jax_ar", "launch", "-m", "no_such_module"],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no module named 'no_such_module'" in missing.stderr


@pytest.mark.parametrize("options,error,arguments", [
    (["-n", "0"], "-n must be at least 1, got 0", {"num_processes": 0}),
    (["--cpu-devices", "0"], "--cpu-devices must be at least 1, got 0", {"cpu_devices": 0}),
    (["--cpu-devices", "-1"], "--cpu-devices must be at least 1, got -1", {"cpu_devices": -1}),
    (["--timeout", "0"], "--timeout must be a positive number of seconds, got 0",
     {"timeout_s": 0}),
    (["--timeout", "-5"], "--timeout must be a positive number of seconds, got -5",
     {"timeout_s": -5}),
    (["--timeout", "nan"], "--timeout must be a positive number of seconds, got nan",
     {"timeout_s": float("nan")}),
    (["--grace", "-1"], "--grace must be 0 or a positive number of seconds, got -1",
     {"grace_s": -1}),
    (["--grace", "nan"], "--grace must be 0 or a positive number of seconds, got nan",
     {"grace_s": float("nan")}),
    (["--platform", "gpu"], "--platform gpu, but nvidia-smi lists no GPU", {"platform": "gpu"}),
])
def test_bad_options_are_usage_errors(options, error, arguments):
    if options[0] == "--platform" and launch_module.gpu_count() > 0:
        pytest.skip("this machine has a GPU")
    proc = subprocess.run([sys.executable, "-m", "jax_ar", "launch", *options, PROBE, "ok", "-1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"python -m jax_ar launch: error: {error}"
    assert "Traceback" not in proc.stderr and not proc.stdout  # no rank started
    with pytest.raises(ValueError) as raised:  # launch() refuses them too
        launch(PROBE, ["ok", "-1"], stream=False, **arguments)
    assert str(raised.value) == error


@pytest.mark.parametrize("make,error", [
    (lambda tmp: tmp / "a_file", "--log-dir {path} is not a directory"),
    (lambda tmp: tmp / "a_file" / "logs", "--log-dir {path}: cannot create it (Not a directory)"),
    (lambda tmp: "/proc/no_such_dir", "--log-dir {path}: cannot create it "
                                      "(No such file or directory)"),
], ids=["a_file", "under_a_file", "in_proc"])
def test_a_log_dir_that_cannot_be_made_is_a_usage_error(tmp_path, make, error):
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    (tmp_path / "a_file").write_text("")
    path = str(make(tmp_path))
    error = error.format(path=path)
    proc = subprocess.run([sys.executable, "-m", "jax_ar", "launch", "--log-dir", path, PROBE,
                           "ok", "-1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"python -m jax_ar launch: error: {error}"
    assert "Traceback" not in proc.stderr and not proc.stdout  # no rank started
    with pytest.raises(ValueError) as raised:  # launch() refuses it too
        launch(PROBE, ["ok", "-1"], stream=False, log_dir=path)
    assert str(raised.value) == error


ARGV_PROBE = "import sys\nprint('argv', sys.argv[1:])\n"


@pytest.mark.parametrize("words", [
    ["SCRIPT", "--", "--foo", "-n", "3"],
    ["--", "SCRIPT", "a", "--"],
    ["-m", "argv_probe", "--", "-m", "x"],
], ids=["dashes_after_the_script", "dashes_before_the_script", "module"])
def test_every_word_after_the_script_reaches_it_as_python_passes_it(tmp_path, words):
    """What follows SCRIPT (or -m MODULE) is its sys.argv[1:] exactly as
    `python` would make it, '--' included; a '--' before SCRIPT ends the
    launcher's options, as it ends python's."""
    (tmp_path / "argv_probe.py").write_text(ARGV_PROBE)
    words = [str(tmp_path / "argv_probe.py") if w == "SCRIPT" else w for w in words]
    python = subprocess.run([sys.executable, *words], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert python.returncode == 0 and python.stdout.startswith("argv "), python.stderr
    proc = subprocess.run([sys.executable, "-m", "jax_ar", "launch", "-n", "1", "--platform",
                           "cpu", *words], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"[rank 0] {python.stdout}" in proc.stdout, (python.stdout, proc.stdout)


@pytest.mark.parametrize("stderr", ["apart", "in_the_pipe"])
def test_a_closed_stdout_lets_the_ranks_run_to_their_end(tmp_path, stderr):
    """`launch ... | head -1` (and `2>&1 | head -1`): once the reader of
    stdout has gone, the launcher stops printing the ranks' output but
    still reads it (ranks writing to a full pipe would block until the
    deadline), and exits with the ranks' status, without a traceback
    (Python's at exit included: it would make the status 120)."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "jax_ar", "launch", "-n", "2", "--platform",
                             "cpu", "--timeout", "40", "--log-dir", str(tmp_path), PROBE,
                             "chatty", "-1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE if stderr == "apart" else subprocess.STDOUT,
                            text=True)
    try:
        assert proc.stdout.readline().startswith("[rank ")
        proc.stdout.close()  # as `head -1` does
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    if stderr == "apart":
        assert err.strip().splitlines()[-1] == "jax_ar launch: all 2 ranks succeeded", err
        for text in ("Traceback", "BrokenPipe", "Exception ignored"):
            assert text not in err, err
    for rank in (0, 1):  # every rank ran to its end
        assert (tmp_path / f"rank{rank}.log").read_text().endswith("done chatting\n")
    assert time.monotonic() - start < 40


def test_a_rank_killed_from_outside_is_the_first_to_fail(monkeypatch):
    """Rank 1 is SIGKILLed while rank 0 waits for it in an all_reduce, whose
    error rank 0 reports milliseconds later. With the launcher looking only
    every 1.5 s, both are seen at once: the order comes from when each
    happened, not from which rank the launcher looked at first."""
    monkeypatch.setattr(relay, "POLL_S", 1.5)
    result = launch(PROBE, ["die_in_call", "1"], num_processes=2, platform="cpu",
                    timeout_s=120, stream=False, env=dict(os.environ, JAX_AR_TIMEOUT_S="30"))
    assert result.first_failed_rank == 1, result.summary()
    assert result.summary().startswith("rank 1 failed (killed by SIGKILL), the first to fail; "
                                       "rank 0 failed (raised "), result.summary()
    assert "jax_ar" in dict(result.failures)[0]


# Signals: every process of the job carries JOB_ENV in its environment, so
# /proc tells whether any is left.

JOB_ENV = "JAX_AR_TEST_JOB"


def job_processes(marker: str) -> list[int]:
    """Live processes (not zombies) whose environment holds JOB_ENV=marker."""
    found, needle = [], f"{JOB_ENV}={marker}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    continue
        except OSError:
            continue
        found.append(int(name))
    return found


def wait_for(predicate, timeout_s, what):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _default_stop_signals():
    """In the child before exec: the launcher's stop signals as a terminal
    leaves them. A test run started in the background (nohup, `cmd &` in a
    script) passes SIGHUP or SIGINT on ignored, and the launcher rightly
    keeps ignoring what it inherits ignored."""
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


class Job:
    """`python -m jax_ar launch ... PROBE args` in the background."""

    def __init__(self, *args, grace=None):
        self.marker = uuid.uuid4().hex
        cmd = [sys.executable, "-m", "jax_ar", "launch", "-n", "2", "--platform", "cpu",
               *(["--grace", str(grace)] if grace else []), PROBE, *args]
        self.proc = subprocess.Popen(cmd, env=dict(os.environ, **{JOB_ENV: self.marker}),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=_default_stop_signals)
        self.out, self.err = [], []
        self.readers = [threading.Thread(target=lambda s=s, d=d: d.extend(s), daemon=True)
                        for s, d in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for r in self.readers:
            r.start()

    def printed(self, text: str, times: int = 1) -> bool:
        return sum(text in line for line in list(self.out)) >= times

    def ranks(self) -> list[int]:
        return [p for p in job_processes(self.marker) if p != self.proc.pid]

    def finish(self, timeout_s=30):
        try:
            rc = self.proc.wait(timeout=timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            for r in self.readers:
                r.join(timeout=10)
        return rc

    def cleanup(self):
        for pid in job_processes(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@pytest.mark.parametrize("signum,moment", [
    (signal.SIGTERM, "startup"),
    (signal.SIGTERM, "run"),
    (signal.SIGHUP, "run"),
    (signal.SIGINT, "run"),
    (signal.SIGINT, "grace"),
    (signal.SIGTERM, "calls"),
])
def test_signal_is_forwarded_and_no_rank_outlives_the_launcher(signum, moment):
    name = signal.Signals(signum).name
    mode = {"grace": "fail_others_loop", "calls": "loop_calls"}.get(moment, "loop")
    job = Job(mode, "1", grace=60 if moment == "grace" else None)
    try:
        if moment == "startup":  # a rank's process exists; it is still importing jax
            wait_for(lambda: job.ranks(), 60, "a rank process")
        elif moment in ("run", "calls"):
            wait_for(lambda: job.printed("looping", 2), 60, "both ranks looping")
        else:  # rank 1 failed; rank 0 runs on in the launcher's (60 s) grace
            wait_for(lambda: job.printed("looping") and job.printed("failing on purpose"), 60,
                     "rank 1's failure")
            time.sleep(0.5)
        start = time.monotonic()
        job.proc.send_signal(signum)
        rc = job.finish()
        took = time.monotonic() - start
        err = "".join(job.err)
        assert rc == 128 + signum, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("jax_ar launch: ") and f"stopped by {name}" in last, err
        assert "Traceback" not in err + "".join(job.out), err + "".join(job.out)
        if moment == "grace":
            assert "rank 1 failed (exit code 3)" in last, err
        if moment in ("run", "calls"):
            # Every rank reports the stop as a stop, not as a bug of the
            # program: ranks stopped between calls and ranks stopped in one
            # (whose peer has gone) alike.
            out = "".join(job.out)
            for rank in (0, 1):
                assert f"[rank {rank}] jax_ar: rank {rank} stopped by {name}" in out, out
            assert "skipped that call" not in out + err, out + err
        assert took < launch_module.STOP_GRACE_S + 5, f"the launcher took {took:.1f} s"
        # No process of the job is left (killed ones may take a moment to go).
        wait_for(lambda: not job.ranks(), 5, f"the ranks to end; left: {job.ranks()}")
    finally:
        job.cleanup()


def test_a_second_signal_kills_at_once_and_the_summary_says_so():
    """Ranks that ignore the forwarded signal are killed at the second one,
    not STOP_GRACE_S after the first, and the summary says when."""
    job = Job("deaf", "-1")
    try:
        wait_for(lambda: job.printed("looping", 2), 60, "both ranks looping")
        start = time.monotonic()
        job.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        job.proc.send_signal(signal.SIGTERM)
        rc = job.finish()
        took = time.monotonic() - start
        err = "".join(job.err)
        assert rc == 128 + signal.SIGTERM, err
        assert err.strip().splitlines()[-1] == (
            "jax_ar launch: stopped by SIGTERM, forwarded to every rank; ranks 0, 1 still "
            "running at a second signal, killed"), err
        assert took < launch_module.STOP_GRACE_S, f"the launcher took {took:.1f} s"
        wait_for(lambda: not job.ranks(), 5, f"the ranks to end; left: {job.ranks()}")
    finally:
        job.cleanup()


def test_ranks_die_with_a_launcher_killed_outright():
    job = Job("loop", "-1")
    try:
        wait_for(lambda: job.printed("looping", 2), 60, "both ranks looping")
        job.proc.kill()
        job.finish()
        wait_for(lambda: not job_processes(job.marker), 5, "the ranks to die with the launcher")
    finally:
        job.cleanup()


def test_ctrl_c_in_a_program_that_calls_launch():
    """launch() called in the main thread forwards the signal, ends every
    rank, and then raises KeyboardInterrupt in its caller."""
    marker = uuid.uuid4().hex
    env = dict(os.environ, **{JOB_ENV: marker})
    log_dir = f"/tmp/jax_ar_test_launch_{marker}"

    def interrupt_when_looping():
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                if sum("looping" in open(f"{log_dir}/rank{r}.log").read() for r in (0, 1)) == 2:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    # Ctrl-C's default meaning here too, should this run have inherited
    # SIGINT ignored (see _default_stop_signals).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    thread = threading.Thread(target=interrupt_when_looping, daemon=True)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(PROBE, ["loop", "-1"], num_processes=2, platform="cpu", timeout_s=120,
                   stream=False, env=env, log_dir=log_dir)
        assert not job_processes(marker)
    finally:
        thread.join(timeout=70)
        for pid in job_processes(marker):
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", log_dir])
        signal.signal(signal.SIGINT, previous)
