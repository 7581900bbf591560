"""python -m jax_ar {bench,tune,launch} ..."""
from __future__ import annotations

import importlib
import platform
import sys

COMMANDS = {
    "bench": ("jax_ar.tools.bench", "nccl-tests style sweep of all_reduce against psum"),
    "tune": ("jax_ar.tools.tune", "measure this machine and write the algorithm table"),
    "launch": ("jax_ar.tools.launch", "run a script in N local processes joined by jax.distributed"),
}


def usage() -> str:
    lines = ["usage: python -m jax_ar {bench,tune,launch} [options]", "",
             "commands:"]
    lines += [f"  {name:8s} {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "  -h, --help     show this help (python -m jax_ar COMMAND -h: its options)",
              "  --version      print the versions of jax_ar, jax and Python"]
    return "\n".join(lines)


def version() -> str:
    from .._version import __version__

    try:
        import jax

        jax_version = jax.__version__
    except ImportError:
        jax_version = "not installed"
    return f"jax_ar {__version__} (jax {jax_version}, Python {platform.python_version()})"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv and argv[0] == "--version":
        print(version())
        return 0
    if not argv or argv[0] not in COMMANDS:
        print(usage(), file=sys.stderr)
        why = f"unknown command {argv[0]!r}" if argv else "no command given"
        print(f"\npython -m jax_ar: error: {why}; try `python -m jax_ar bench` (the main job) "
              "or `python -m jax_ar COMMAND -h`", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:]) or 0
