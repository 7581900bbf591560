"""jax_ar.checked(): one exception type for jax_ar's run-time failures.

A jax_ar call that fails at run time (a peer that timed out, disagreed,
failed, closed or died) fails inside XLA, and XLA turns the handler's error
into its own exception: jax.errors.JaxRuntimeError or ValueError, depending
on how JAX ran the call (README's Errors section), with a message that
starts with "jax_ar:" after the status code. On GPUs a kernel that fails records it and
the call may even return. Inside `with jax_ar.checked():` both become a
JaxArError (JaxArTimeoutError for a deadline): XLA's error is replaced by the
communicator's recorded failure (comm.check()), and at the end of the block
every communicator is checked once more.
"""
from __future__ import annotations

import contextlib

from .comm.communicator import Communicator, open_communicators
from .errors import JaxArError, error_for, runtime_failure_text

__all__ = ["checked"]


@contextlib.contextmanager
def checked(*comms: Communicator):
    """Raises jax_ar.JaxArError for every jax_ar failure inside the block.

        with jax_ar.checked(comm):
            y = jax.block_until_ready(step(x))

    An exception of XLA's whose message is a jax_ar failure ("jax_ar: ...",
    after XLA's status code) becomes the JaxArError that `comm.check()`
    raises (the communicator's recorded failure, naming the rank and the
    peer), or one with XLA's message where no communicator recorded one;
    the original is its __cause__. When the block ends normally, each
    communicator still open is checked (`comm.check()`), which is where
    failures of GPU kernels show. Without arguments: every open communicator. Other
    exceptions pass unchanged. Dispatch is asynchronous: block on the
    results (jax.block_until_ready, or reading them) inside the block."""
    for comm in comms:
        if not isinstance(comm, Communicator):
            raise TypeError(f"jax_ar.checked: expected Communicators (from jax_ar.setup), got "
                            f"{type(comm).__name__}")
    try:
        yield
    except Exception as error:
        text = runtime_failure_text(error)
        if text is None:
            raise
        raise _recorded_failure(comms) or error_for(text) from error
    for comm in comms or open_communicators():
        if not comm.closed:  # closed inside the block: nothing left to fail
            comm.check()


def _recorded_failure(comms) -> JaxArError | None:
    for comm in comms or open_communicators():
        if comm.closed and not comms:
            continue
        try:
            comm.check()
        except JaxArError as failure:
            return failure
    return None
