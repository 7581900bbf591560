"""Exceptions jax_ar raises itself (bad arguments raise TypeError/ValueError),
and how a failure that reached Python as XLA's error is recognized."""
from __future__ import annotations

import re

__all__ = ["JaxArError", "JaxArTimeoutError", "error_for", "runtime_failure_text"]


class JaxArError(RuntimeError):
    """A collective failed: a peer disagreed, a communicator broke or was closed."""


class JaxArTimeoutError(JaxArError, TimeoutError):
    """A peer did not arrive before the deadline (JAX_AR_TIMEOUT_S / timeout_s)."""


# What XLA puts before a failed custom call's own message: the status code
# ("ABORTED: ", "FAILED_PRECONDITION: ", ...), whichever the handler chose.
_STATUS_PREFIX = re.compile(r"^(?:[A-Z][A-Z_]*: )*")


def runtime_failure_text(error: BaseException) -> str | None:
    """The message of a jax_ar call that failed at run time and reached
    Python as XLA's error (jax.errors.JaxRuntimeError, or ValueError where
    JAX's C++ fast path ran the call; README's Errors section): the text from
    "jax_ar:" on. None for any other error, and for exceptions of jax_ar's
    own (JaxArError, TableError, argument errors)."""
    if type(error).__module__.split(".")[0] == "jax_ar":
        return None
    text = str(error)
    body = text[_STATUS_PREFIX.match(text).end():]
    return body if body.startswith("jax_ar:") else None


def error_for(message: str) -> JaxArError:
    """The JaxArError for a failure message: JaxArTimeoutError when the
    failure was a deadline."""
    timed_out = " timed out " in message.split("\n", 1)[0]
    return (JaxArTimeoutError if timed_out else JaxArError)(message)
