"""The launcher's process relay: it watches the ranks of one launch while
they run, streams their output (each line prefixed "[rank i]", less NOISE),
notices failures and when they happened, and stops the ranks: after one
failed (a grace period, a stack dump, then a kill), at the deadline, or on
a forwarded signal (STOP_GRACE_S, then a kill). launch.py starts the ranks
and turns what the relay saw into a LaunchResult.

The first failure is the one that happened first: a rank's exit is timed
when it happens, a raised error when the rank caught it (bootstrap.py
writes it to the status folder), so a rank killed from outside is named
before the peer whose call then failed, however late the launcher looks
(and however late, on a busy machine, it hears of the kill: see
KILL_SLACK_S).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

__all__ = ["GlooReports", "LaunchResult", "NOISE", "NOISE_DETAIL", "Output", "POLL_S",
           "STOP_GRACE_S", "Watch", "kill_all", "pump", "reap", "result_of", "supervise"]

STOP_GRACE_S = 3.0  # how long ranks may take to end after a forwarded signal
POLL_S = 0.05  # how often the launcher looks at the ranks
KILL_SLACK_S = 0.5  # see _collect_failures

# Lines no user needs: gloo's report of each connection it made (psum on CPU;
# GlooReports), and what gRPC and absl print when a process of
# jax.distributed goes away while its peers still poll it (these come after
# the ranks' own errors or results; the launcher's summary says how each rank
# ended). A rank that succeeds prints none of the latter (bootstrap.py);
# failing ones may.
NOISE = re.compile(
    r"WatchTasksAsync|WatchJobStateAsync|PollForError"
    r"|Terminating process because the JAX distributed service"
    r"|^\*\*\* Check failure stack trace: \*\*\*"
    r"|^\s+@\s+0x[0-9a-f]+\s")
# The lines gRPC adds to a NOISE line's message (dropped with it): the
# remote status, the source location trace, blank lines.
NOISE_DETAIL = re.compile(
    r"^(Additional GRPC error information from remote target|:[A-Z_]+:"
    r"|=== Source Location Trace: ===|\S+\.(cc|h):\d+$|$)")


# The pieces gloo writes its report with, one write each:
# "[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected
# peer ranks is : 1". Threads that report at once (a process with several
# CPU devices) splice their pieces into lines such as "[Gloo] Rank 1 is
# connected to 1 peer ranks. Expected number of connected peer ranks is :
# [Gloo] Rank 1 is connected to 11" and " peer ranks. Expected number of
# connected peer ranks is : 1".
GLOO_TEXT = re.compile(r"\[Gloo\] Rank | is connected to | peer ranks\. "
                       r"|Expected number of connected peer ranks is : ")
GLOO_PIECES = re.compile(rf"(?:{GLOO_TEXT.pattern}|\d+)+")
GLOO_START = "[Gloo] Rank "


class GlooReports:
    """Tells the lines of one rank's output made of gloo's reports, whole or
    spliced. Each line ends one report (its number, then the newline); a
    line that begins two leaves one unfinished, whose number may come alone
    on a later line: such a bare number is dropped only while a report is
    unfinished (anywhere else it is the program's own output)."""

    def __init__(self):
        self.unfinished = 0

    def drops(self, line: str) -> bool:
        text = line.rstrip("\r\n")
        if not GLOO_PIECES.fullmatch(text):
            return False
        if not GLOO_TEXT.search(text) and not self.unfinished:
            return False  # a number of the program's own
        self.unfinished = max(0, self.unfinished + text.count(GLOO_START) - 1)
        return True


class Output:
    """Where the ranks' lines are printed: this process's stdout, one line
    at a time. Once a write fails (the reader of a pipe went away, as in
    `launch ... | head`, or any other error), nothing more is printed: the
    ranks' output is still read to its end (a rank writing to a full pipe
    would block) and kept in their logs, and the ranks run on."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.lock = threading.Lock()
        self.error = None  # the error that ended printing

    def write(self, text: str) -> None:
        if not self.enabled or self.error is not None:
            return
        with self.lock:
            if self.error is not None:
                return
            try:
                sys.stdout.write(text)
                sys.stdout.flush()
            except (OSError, ValueError) as e:  # ValueError: stdout closed
                self.error = e


class LaunchResult:
    def __init__(self, returncodes, logs, timed_out, failures=(), stopped=(), signal_=None,
                 killed_after_signal=(), exiting_with=None, hurried=False):
        self.returncodes = returncodes  # per rank; None if killed at the deadline
        # Failed ranks the launcher killed while they were exiting (held in
        # jax.distributed's shutdown) -> the exit status each was ending with.
        self.exiting_with = dict(exiting_with or {})
        self.logs = logs  # per rank: what it printed (less NOISE)
        self.timed_out = timed_out
        # (rank, what happened), in the order the failures happened; the first
        # is the rank that brought the job down.
        self.failures = list(failures)
        self.stopped = list(stopped)  # ranks the launcher killed after another failed
        self.signal = signal_  # the signal that stopped the job (forwarded to every rank)
        self.killed_after_signal = list(killed_after_signal)  # still running STOP_GRACE_S after it
        self.hurried = hurried  # a second signal came first: those were killed then

    @property
    def ok(self) -> bool:
        return not self.timed_out and not self.failures and self.signal is None and \
            all(rc == 0 for rc in self.returncodes)

    @property
    def first_failed_rank(self) -> int | None:
        return self.failures[0][0] if self.failures else None

    @property
    def exit_code(self) -> int:
        """What `python -m jax_ar launch` exits with: 0; 128 + the signal's
        number when one stopped the job; 124 at the deadline; else the first
        failed rank's exit code, the one its failure names (1 if it has
        none)."""
        if self.signal is not None:
            return 128 + self.signal
        if self.ok:
            return 0
        if self.timed_out:
            return 124
        first = self.first_failed_rank
        rc = _exit_code_of(first, self.returncodes[first], self.exiting_with) \
            if first is not None else None
        return rc if rc is not None and rc > 0 else 1

    def summary(self) -> str:
        if self.ok:
            count = len(self.returncodes)
            return "the rank succeeded" if count == 1 else f"all {count} ranks succeeded"
        parts = [f"rank {rank} failed ({what})" for rank, what in self.failures]
        if len(parts) > 1:
            parts[0] += ", the first to fail"
        if self.stopped:
            parts.append(f"{_ranks(self.stopped)} still running after that, killed")
        if self.timed_out:
            late = [i for i, rc in enumerate(self.returncodes) if rc is None]
            parts.append(f"{_ranks(late)} killed at the deadline")
        if self.signal is not None:
            text = f"stopped by {_signal_name(self.signal)}, forwarded to every rank"
            if self.killed_after_signal:
                when = "at a second signal" if self.hurried else f"{STOP_GRACE_S:g} s later"
                text += f"; {_ranks(self.killed_after_signal)} still running {when}, killed"
            parts.append(text)
        return "; ".join(parts) or "failed"


def _exit_code_of(rank, returncode, exiting_with) -> int | None:
    """The rank's exit code: its process's own, or, when the launcher killed
    it while it was exiting, the one it was ending with."""
    if returncode is not None and returncode >= 0:
        return returncode
    return exiting_with.get(rank)


def _ranks(ranks) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Watch:
    """What the launcher saw while the ranks ran."""

    def __init__(self):
        self.failed_at = {}  # failed rank -> when it failed (time.time())
        self.exited_at = {}  # rank -> when its process ended (time.time())
        self.reported = {}  # rank -> the error it reported ("Type: message")
        self.reported_exit = {}  # rank -> the exit status it reported it was ending with
        self.stopped = []  # ranks killed because they still ran after a failure
        self.ended_by_launcher = False  # the launcher killed what was left
        self.timed_out = False
        self.signal = None  # the signal forwarded to the ranks
        self.killed_after_signal = []
        self.hurried = False  # killed_after_signal were killed at a second signal

    @property
    def order(self) -> list[int]:
        """Failed ranks, the first to fail first (ties: by rank)."""
        return sorted(self.failed_at, key=lambda r: (self.failed_at[r], r))


def supervise(job, procs, logs, status_dir, timeout_s, grace_s, output, watch):
    """Waits for the ranks, stopping them as described in launch()."""
    deadline = time.monotonic() + timeout_s
    first_failure_at = settled_at = None

    def pause(seconds):  # sleeps, unless a signal asks to stop the job
        end = time.monotonic() + seconds
        while job.stop_signum is None and time.monotonic() < end:
            time.sleep(0.02)

    while True:
        if job.stop_signum is not None:
            return _stop(job, procs, watch, status_dir)
        _collect_failures(procs, status_dir, watch)
        if len(procs) == len(logs) and all(r in watch.exited_at for r in range(len(procs))):
            _collect_failures(procs, status_dir, watch)
            return
        now = time.monotonic()
        if watch.failed_at and first_failure_at is None:
            first_failure_at = now
        if now > deadline:
            watch.timed_out = watch.ended_by_launcher = True
            kill_all(procs)
            return
        if first_failure_at is not None and not any(
                p.returncode is None and r not in watch.failed_at for r, p in enumerate(procs)):
            # Every rank has ended or reported its failure; those still alive
            # wait in jax.distributed's shutdown for peers that are gone.
            settled_at = settled_at if settled_at is not None else now
            if now > settled_at + 1.0:
                watch.ended_by_launcher = True
                kill_all(procs)
                return
        if first_failure_at is not None and now > first_failure_at + grace_s:
            watch.stopped = [r for r, p in enumerate(procs)
                             if p.returncode is None and r not in watch.failed_at]
            for rank in watch.stopped:
                _note(logs, rank, f"jax_ar launch: rank {rank} is still running {grace_s:.1f} s "
                      f"after rank {watch.order[0]} failed; dumping its stack, then killing it",
                      output)
                _signal(procs[rank], signal.SIGUSR1)
            if watch.stopped:
                pause(1.0)  # time for the stack dumps
            if job.stop_signum is not None:
                return _stop(job, procs, watch, status_dir)
            watch.ended_by_launcher = True
            kill_all(procs)
            return
        pause(POLL_S)


def _stop(job, procs, watch, status_dir):
    """Forwards the job's stop signal to every rank still running, waits up
    to STOP_GRACE_S (less after a second signal), kills what is left. A rank
    still starting (bootstrap.py has not said "ready") holds nothing yet and
    would only print a traceback of the import it was in: it is killed."""
    watch.signal = job.stop_signum
    for rank, p in enumerate(procs):
        ready = os.path.exists(os.path.join(status_dir, f"rank{rank}.ready"))
        _signal_group(p, job.stop_signum if ready else signal.SIGKILL)
    end = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < end and not job.hurry and \
            any(p.returncode is None for p in procs):
        time.sleep(0.02)
    watch.killed_after_signal = [r for r, p in enumerate(procs) if p.returncode is None]
    watch.hurried = job.hurry and bool(watch.killed_after_signal)
    watch.ended_by_launcher = True
    kill_all(procs)


def _collect_failures(procs, status_dir, watch):
    for rank, proc in enumerate(procs):
        if rank in watch.failed_at:
            continue
        path = os.path.join(status_dir, f"rank{rank}.failed")
        if os.path.exists(path):
            try:
                with open(path) as f:
                    stamp, exit_status, text = f.read().strip().split(" ", 2)
                when = float(stamp)
                watch.reported_exit[rank] = int(exit_status)
            except (OSError, ValueError):
                text, when = "an error", time.time()
            watch.reported[rank] = text
            # A rank that raised because its peer died usually reports after
            # the peer's exit; either way the earlier event counts.
            watch.failed_at[rank] = min(when, watch.exited_at.get(rank, when))
        elif rank in watch.exited_at and proc.returncode != 0:
            when = watch.exited_at[rank]
            if proc.returncode < 0 and -proc.returncode != signal.SIGABRT:
                # Killed from outside (SIGKILL, ...): its peers, spinning on
                # it, see it within milliseconds, while this process, on a
                # busy machine, may hear of it later; a peer's report less
                # than KILL_SLACK_S before the exit is taken as its effect.
                # (JAX ends processes whose coordinator died with SIGABRT:
                # those were not first.)
                when -= KILL_SLACK_S
            watch.failed_at[rank] = when


def _describe_failure(rank, rc, watch, exiting_with) -> str:
    """'raised ValueError: ..., exit code 1', 'exit code 3', 'killed by SIGKILL'."""
    parts = []
    reported = watch.reported.get(rank, "")
    if reported and not reported.startswith("SystemExit"):
        parts.append(f"raised {reported}")
    code = _exit_code_of(rank, rc, exiting_with)
    if code is not None and code > 0:
        parts.append(f"exit code {code}")
    elif rc is not None and rc < 0:
        parts.append(f"killed by {_signal_name(-rc)}")
    return ", ".join(parts) or "failed"


def _note(logs, rank, line, output):
    logs[rank].append(line + "\n")
    output.write(f"[rank {rank}] {line}\n")


def _signal(proc, signum):
    try:
        proc.send_signal(signum)
    except (ProcessLookupError, OSError):
        pass


def _signal_group(proc, signum):
    """`signum` to the rank's process group (the rank and what it started).
    Only while the rank is unreaped: its pid cannot belong to another
    process then."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        _signal(proc, signum)


def reap(proc, rank, watch):
    proc.wait()
    watch.exited_at[rank] = time.time()


def pump(proc, rank, sink, log_file, output):
    """Reads the rank's output to its end: every line to `log_file`, those
    not dropped to `sink` and, prefixed, to `output`. Neither a failing
    `output` nor a failing `log_file` (a full disk) stops the reading."""
    in_noise = False  # the last line kept out was NOISE: its details follow
    gloo = GlooReports()
    for line in proc.stdout:
        if log_file:
            try:
                log_file.write(line)
                log_file.flush()
            except (OSError, ValueError) as e:
                _close_quietly(log_file)
                log_file = None
                _note({rank: sink}, rank, f"jax_ar launch: cannot write this rank's log any "
                      f"more ({e})", output)
        if gloo.drops(line):
            continue
        if NOISE.search(line) or (in_noise and NOISE_DETAIL.match(line.strip())):
            in_noise = True
            continue
        in_noise = False
        sink.append(line)
        output.write(f"[rank {rank}] {line}")
    if log_file:
        _close_quietly(log_file)


def _close_quietly(file):
    try:
        file.close()
    except (OSError, ValueError):
        pass


def kill_all(procs):
    for p in procs:
        _signal_group(p, signal.SIGKILL)


def result_of(procs, threads, logs, watch, num_processes) -> LaunchResult:
    """What happened, once every rank has been killed or has ended."""
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    for t in threads:
        t.join(timeout=10)
    returncodes = []
    for i, p in enumerate(procs):
        rc = p.returncode
        killed_at_deadline = watch.timed_out and rc is not None and rc < 0 and \
            i not in watch.failed_at
        returncodes.append(None if killed_at_deadline else rc)
    returncodes += [None] * (num_processes - len(procs))  # never started (a signal came)
    # A failed rank the launcher killed was held in jax.distributed's
    # shutdown: its exit code is the one it reported it was ending with.
    exiting_with = {r: watch.reported_exit[r] for r in watch.order
                    if r in watch.reported_exit and watch.ended_by_launcher
                    and returncodes[r] is not None and returncodes[r] < 0}
    failures = [(r, _describe_failure(r, returncodes[r], watch, exiting_with))
                for r in watch.order]
    return LaunchResult(returncodes, ["".join(lines) for lines in logs], watch.timed_out,
                        failures, watch.stopped, watch.signal, watch.killed_after_signal,
                        exiting_with, watch.hurried)
