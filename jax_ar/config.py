"""Environment settings and jax_ar's logger.

JAX_AR_ALGO       overrides algorithm="auto" (oneshot | twoshot | psum; any case)
JAX_AR_TIMEOUT_S  deadline in seconds for every wait (setup and calls)
JAX_AR_LOG        log level of the "jax_ar" logger, read once at `import jax_ar`
                  (any case: debug, info, warning or warn, error, critical,
                  notset): info logs each choice once; error silences the
                  fallback warnings (`report`); another value is warned of
                  on stderr and ignored
JAX_AR_TABLE      cost table file for algorithm="auto", or "default"
                  (selection/table.py)
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from typing import NamedTuple

__all__ = [
    "ALGORITHMS",
    "Reason",
    "DEFAULT_TIMEOUT_S",
    "algorithm_override",
    "log_once",
    "logger",
    "report",
    "resolve_timeout",
]

ALGORITHMS = ("auto", "oneshot", "twoshot", "psum")

# How long a rank waits for a peer that is alive but not coming (a skipped
# call, a stuck or slow process); a peer that failed, closed or died is
# noticed at once on CPU devices. Long enough for ranks that finish
# compiling at different times on a loaded machine; short enough that start-
# up plus the deadline plus the launcher's grace stays under 30 s (see
# docs/guarantees.md). Raise it (JAX_AR_TIMEOUT_S) when compile times differ
# more than that between ranks.
DEFAULT_TIMEOUT_S = 15.0
# The longest deadline: the backends count deadlines in nanoseconds in 64
# bits (about 9.2e9 s before they wrap, and a wrapped one expires at once).
MAX_TIMEOUT_S = 1e6

logger = logging.getLogger("jax_ar")
_level = os.environ.get("JAX_AR_LOG", "").strip().upper()
_number = logging.getLevelName(_level) if _level else None
if _level and not isinstance(_number, int):
    # Not an error: the variable only tunes what is said, and a typo must
    # not stop `import jax_ar`. Said on stderr (logging's last resort).
    logger.warning("jax_ar: JAX_AR_LOG=%r is not a log level (debug, info, warning, error, "
                   "critical); ignored", os.environ["JAX_AR_LOG"])
elif _level:
    logger.setLevel(_number)
    if not logger.handlers:
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("[jax_ar %(levelname)s] %(message)s"))
        logger.addHandler(_handler)

_logged: set = set()
_logged_lock = threading.Lock()


def log_once(key, message: str, level: int = logging.INFO) -> None:
    """Logs `message` the first time `key` is seen in this process."""
    with _logged_lock:
        if key in _logged:
            return
        _logged.add(key)
    logger.log(level, message)


class Reason(NamedTuple):
    """Why a call (or part of one) is not served by jax_ar's kernels: `why`,
    what the user can do about it (`todo`), and whether the user loses
    speed by it (`slower`)."""
    why: str
    todo: str = ""
    slower: bool = True


def report(what: str, axes, served_by: str, reason: Reason) -> None:
    """The one logger of how calls go (ops/plan.py): says once per reason and
    call site that `what` over `axes` (None: a call without axes) is served
    by `served_by`, and why. A WARNING naming what to do where the user
    loses speed (JAX_AR_LOG=error silences it), DEBUG where nothing is lost."""
    site = _call_site()
    level = logging.WARNING if reason.slower else logging.DEBUG
    todo = f"; {reason.todo}" if reason.todo else ""
    axes = axes[0] if isinstance(axes, tuple) and len(axes) == 1 else axes
    over = "" if axes is None else f" over {axes!r}"
    log_once(("route", what, axes, served_by, reason, site),
             f"jax_ar: {what}{over} lowers to {served_by}: {reason.why}{todo} (at {site})", level)


def _call_site() -> str:
    """file:line of the user's code that made the call: the innermost frame
    outside jax_ar, jax and Python's own library."""
    skip = tuple(os.path.dirname(m.__file__) + os.sep
                 for m in (sys.modules["jax_ar"], sys.modules["jax"], os))
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(skip) and f"{os.sep}jaxlib{os.sep}" not in name:
            return f"{os.path.basename(name)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def resolve_timeout(explicit: float | None = None) -> float:
    """The wait deadline: `explicit`, else JAX_AR_TIMEOUT_S, else the default."""
    if explicit is None:
        text = os.environ.get("JAX_AR_TIMEOUT_S", "").strip()
        if not text:
            return DEFAULT_TIMEOUT_S
        try:
            explicit = float(text)
        except ValueError:
            raise ValueError(f"JAX_AR_TIMEOUT_S must be a number of seconds, got {text!r}") from None
        source = "JAX_AR_TIMEOUT_S"
    else:
        source = "timeout_s"
    if isinstance(explicit, bool) or not isinstance(explicit, (int, float)):
        raise TypeError(f"{source} must be a number of seconds, got {explicit!r}")
    if not 0 < explicit <= MAX_TIMEOUT_S:  # NaN fails both comparisons
        raise ValueError(f"{source} must be a positive number of seconds, at most "
                         f"{MAX_TIMEOUT_S:.0f} (11.6 days), got {explicit!r}")
    return float(explicit)


def algorithm_override() -> str | None:
    """JAX_AR_ALGO if set (checked; any case, blanks around it ignored), else
    None. A bad value's error shows it as the user typed it."""
    typed = os.environ.get("JAX_AR_ALGO", "")
    text = typed.strip().lower()
    if not text or text == "auto":
        return None
    if text not in ALGORITHMS:
        raise ValueError(f"jax_ar: JAX_AR_ALGO must be one of {ALGORITHMS}, got {typed!r}")
    return text
