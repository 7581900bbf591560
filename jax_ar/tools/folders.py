"""The folders the tools write into (launch's --log-dir, bench's --out-dir,
tune's table folder), made and proven writable before any rank starts, so
that a bad one is a usage error rather than a traceback after the run."""
from __future__ import annotations

import os
import tempfile

__all__ = ["unwritable"]


def unwritable(folder: str) -> tuple[str, OSError] | None:
    """Creates `folder` (and its parents) if need be and a file in it,
    removed at once; None when both worked, else ("create" or "write", the
    error), for the caller's own words."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        return "create", e
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return "write", e
    return None
