"""python -m jax_ar {bench,tune,launch} ..."""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "bench": ("jax_ar.tools.bench", "nccl-tests style sweep of all_reduce against psum"),
    "tune": ("jax_ar.tools.tune", "measure this machine and write the algorithm table"),
    "launch": ("jax_ar.tools.launch", "run a script in N local processes joined by jax.distributed"),
}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m jax_ar {bench,tune,launch} [options]\n")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:8s} {text}")
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nunknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:]) or 0
