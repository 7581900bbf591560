"""Signals that stop a launch: SIGTERM, SIGHUP and SIGINT (Ctrl-C) reaching
the launcher are forwarded to every rank of every launch() running in it.

forwarding_signals() installs the handlers (main thread only); each
launch() registers a Job whose stop the handler requests; relay.py's
supervisor sees the request and stops the ranks.
"""
from __future__ import annotations

import contextlib
import signal
import threading

__all__ = ["Job", "STOP_SIGNALS", "current_scope", "forwarding_signals"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class _Scope:
    """Signals caught by forwarding_signals() and the jobs they stop."""

    def __init__(self):
        self.signum = None  # the first stop signal that came
        self.jobs = set()
        self.previous = {}  # signal -> handler before ours


class Job:
    """One launch() in progress, as the signal handler sees it."""

    def __init__(self):
        self.stop_signum = None
        self.hurry = False  # a second signal: kill without the grace

    def request_stop(self, signum):
        if self.stop_signum is None:
            self.stop_signum = signum
        else:
            self.hurry = True


_scope: _Scope | None = None


@contextlib.contextmanager
def forwarding_signals():
    """Inside it, SIGTERM, SIGHUP and SIGINT reaching this process stop every
    launch() running in it, in any thread: the signal is forwarded to each
    rank, those still running STOP_GRACE_S later are killed (a second signal
    kills at once), and launch() returns a result whose .signal names it.
    Yields the scope; its .signum is the first signal that came, or None.
    Signals this process ignores (nohup's SIGHUP) stay ignored. Main thread
    only; an inner use is the outer one."""
    global _scope
    if _scope is not None:
        yield _scope
        return
    if threading.current_thread() is not threading.main_thread():
        yield _Scope()  # signals reach only the main thread: nothing to install
        return
    scope = _Scope()

    def on_signal(signum, frame):
        if scope.signum is None:
            scope.signum = signum
        for job in list(scope.jobs):
            job.request_stop(signum)

    for signum in STOP_SIGNALS:
        previous = signal.getsignal(signum)
        if previous is signal.SIG_IGN:
            continue
        scope.previous[signum] = previous
        signal.signal(signum, on_signal)
    _scope = scope
    try:
        yield scope
    finally:
        _scope = None
        for signum, previous in scope.previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)


def current_scope() -> _Scope | None:
    """The scope of the forwarding_signals() this process is inside, if any."""
    return _scope
