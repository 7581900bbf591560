"""The machine code of built kernels, counted, to read a variant beside main.

    python3 experiments/sass_size.py MODULE [MODULE ...] [--match TEXT]

MODULE is a built module (jax_ar/_jax_ar_cuda*.so, or ab/NAME/jax_ar/...
after experiments/prepare.sh) or an object file. For each kernel whose
mangled name holds TEXT (default OneShotRmsNormKernel), one line a module:
instructions, block barriers (BAR.SYNC and BAR.RED), double-precision
arithmetic (DADD, DFMA, DMUL) and calls. The anonymous namespace's
per-build hash is dropped from the names, so the same kernel of two builds
lines up.

Needs cuobjdump on PATH. nvcc 13.0 on the CPU machine has none; the
package index has one: `pip download --no-deps nvidia-cuda-cuobjdump`,
then unzip the wheel and use its nvidia/cu13/bin.
"""
from __future__ import annotations

import argparse
import re
import subprocess
from collections import defaultdict

INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
# An anonymous namespace mangles as LENGTH_GLOBAL__N__..., where the
# LENGTH characters carry the build's hash and the file's name and end in
# eight characters that are a hash or, in some files, part of a symbol's
# name (rms_norm.cu's "kRmsNorm"): the length says where it ends.
ANONYMOUS_NAMESPACE = re.compile(r"(\d+)(?=_GLOBAL__N__)")


def without_build_hash(name: str) -> str:
    """`name` with its anonymous namespaces left out."""
    while (match := ANONYMOUS_NAMESPACE.search(name)) is not None:
        name = name[:match.start()] + name[match.end() + int(match.group(1)):]
    return name


def kernel_counts(sass: str) -> dict[str, dict[str, int]]:
    """Kernel name (hash dropped) -> counts, from `cuobjdump -sass` text."""
    counts: dict[str, dict[str, int]] = {}
    current = None
    for line in sass.splitlines():
        header = re.search(r"Function : (\S+)", line)
        if header:
            current = counts.setdefault(without_build_hash(header.group(1)),
                                        defaultdict(int))
            continue
        match = INSTRUCTION.match(line) if current is not None else None
        if not match:
            continue
        opcode = match.group(1)
        current["instructions"] += 1
        if opcode.startswith(("BAR.SYNC", "BAR.RED")):
            current["barriers"] += 1
        if opcode.split(".")[0] in ("DADD", "DFMA", "DMUL"):
            current["double"] += 1
        if opcode.startswith("CALL"):
            current["calls"] += 1
    return {name: dict(c) for name, c in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="+")
    parser.add_argument("--match", default="OneShotRmsNormKernel")
    args = parser.parse_args()
    per_module = [kernel_counts(subprocess.run(["cuobjdump", "-sass", m], check=True,
                                               capture_output=True, text=True).stdout)
                  for m in args.modules]
    names = sorted({n for counts in per_module for n in counts if args.match in n})
    for name in names:
        print(name)
        for module, counts in zip(args.modules, per_module):
            c = counts.get(name)
            print(f"  {module}: " + ("absent" if c is None else
                  f"{c.get('instructions', 0)} instructions, {c.get('barriers', 0)} barriers, "
                  f"{c.get('double', 0)} double, {c.get('calls', 0)} calls"))


if __name__ == "__main__":
    main()
