"""Printing to a stdout or stderr whose reader may have gone away
(`python -m jax_ar bench | head -2`): the tools end quietly there, with
their results written, instead of raising BrokenPipeError."""
from __future__ import annotations

import os
import sys

__all__ = ["print_or_silence", "flush_or_silence", "silence"]


def print_or_silence(text: str, stream=None) -> None:
    """print(text) to `stream` (stdout); where its reader is gone, the
    stream is silenced and the text goes nowhere."""
    stream = sys.stdout if stream is None else stream
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):
        silence(stream)


def flush_or_silence(stream) -> None:
    try:
        stream.flush()
    except (OSError, ValueError):
        silence(stream)


def silence(stream) -> None:
    """Points `stream`'s file descriptor at /dev/null, so that what is left
    in its buffer goes nowhere at exit instead of failing again (Python
    would print "Exception ignored ... BrokenPipeError" and exit 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError):
        pass
