"""Registers and spills of every kernel in two builds, from ptxas's report.

    python3 experiments/ptxas_use.py A.log B.log

Each log is what ptxas prints with `-Xptxas -v` (nvcc's stderr) for the
.cu files of one tree, for example, from the tree's root:

    for f in cuda/gpu/*.cu; do
      nvcc -std=c++17 --expt-relaxed-constexpr -O3 -arch=sm_90 -Icuda \\
        -I"$(python -c 'import jax; print(jax.ffi.include_dir())')" \\
        -c "$f" -o /tmp/kernel.o -Xptxas -v
    done 2> A.log

Prints each kernel whose registers, stack frame or spills differ (its
name without the anonymous namespace's build hash, as sass_size.py
keys them; demangled where c++filt is on PATH), then how many differ.
ptxas gives a function's frame and spills in the line after "Function
properties for NAME", and after a kernel's own it may list functions the
kernel calls: a reader that gave a kernel the last such line it saw
would report a callee's figures as the kernel's.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess

from sass_size import without_build_hash

ENTRY = re.compile(r"Compiling entry function '(\S+)'")
PROPERTIES = re.compile(r"Function properties for (\S+)")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
REGISTERS = re.compile(r"Used (\d+) registers")


def kernel_use(log: str) -> dict[str, tuple[str, dict[str, int]]]:
    """Kernel name (hash dropped) -> (the name as built, its registers,
    frame, spill stores and loads)."""
    kernels: set[str] = set()
    use: dict[str, dict[str, int]] = {}
    entry = described = None  # the kernel being compiled; the function the next frame line is of
    for line in log.splitlines():
        if match := ENTRY.search(line):
            entry = match.group(1)
            kernels.add(entry)
            described = None
        elif match := PROPERTIES.search(line):
            described = match.group(1)
        elif (match := FRAME.search(line)) and described is not None:
            frame, stores, loads = map(int, match.groups())
            use.setdefault(described, {}).update(frame=frame, spill_stores=stores,
                                                 spill_loads=loads)
            described = None
        elif (match := REGISTERS.search(line)) and entry is not None:
            use.setdefault(entry, {})["registers"] = int(match.group(1))
    return {without_build_hash(name): (name, use.get(name, {})) for name in kernels}


def readable(names: list[str]) -> list[str]:
    """Built names demangled, without "(anonymous namespace)::", where
    c++filt is on PATH (dropping the hash from a mangled name leaves its
    back-references pointing elsewhere, so demangle first)."""
    if not names or shutil.which("c++filt") is None:
        return names
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout.splitlines()
    if len(out) != len(names):
        return names
    return [name.replace("(anonymous namespace)::", "") for name in out]


def describe(use: dict[str, int] | None) -> str:
    if use is None:
        return "absent"
    return (f"{use.get('registers', '?')} registers, {use.get('frame', '?')} B frame, "
            f"spill {use.get('spill_stores', '?')} / {use.get('spill_loads', '?')} B")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    args = parser.parse_args()
    with open(args.a) as a, open(args.b) as b:
        use_a, use_b = kernel_use(a.read()), kernel_use(b.read())
    names = sorted(set(use_a) | set(use_b))
    figures_a = {n: figures for n, (_, figures) in use_a.items()}
    figures_b = {n: figures for n, (_, figures) in use_b.items()}
    differ = [n for n in names if figures_a.get(n) != figures_b.get(n)]
    built = [(use_a.get(n) or use_b[n])[0] for n in differ]
    for name, shown in zip(differ, readable(built)):
        print(f"{shown}\n  {args.a}: {describe(figures_a.get(name))}\n"
              f"  {args.b}: {describe(figures_b.get(name))}")
    print(f"{len(differ)} of {len(names)} kernels differ")


if __name__ == "__main__":
    main()
