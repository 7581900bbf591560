"""Exceptions jax_ar raises itself (bad arguments raise TypeError/ValueError)."""

__all__ = ["JaxArError", "JaxArTimeoutError"]


class JaxArError(RuntimeError):
    """A collective failed: a peer disagreed, a communicator broke or was closed."""


class JaxArTimeoutError(JaxArError, TimeoutError):
    """A peer did not arrive before the deadline (JAX_AR_TIMEOUT_S / timeout_s)."""
