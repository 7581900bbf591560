"""A markdown table from benchmarks/interleaved.py's JSON lines: per size,
each candidate's median time over the rounds (the slowest rank's), the
fastest by median, how much slower the next one is, how many rounds each
won, and what algorithm="auto" picks now with the shipped defaults (of
this checkout) on the same number of ranks.

    python benchmarks/interleaved_table.py ab.jsonl --ranks 2 [--mode all_reduce] [--dtype float32]
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

from jax_ar import selection

# interleaved.py's rms_norm candidates as the selection names its paths.
NORM_PATH_OF = {"fused_oneshot": "fused_oneshot", "fused_twoshot": "fused_twoshot",
                "all_reduce+rms_norm": "composed"}


def auto_pick(mode: str, ranks: int, nbytes: int, capacities: dict) -> str:
    """What auto picks with the shipped defaults; `capacities`: what one
    round of each kernel carried in the timed runs (their workspace)."""
    table = selection.default_table("cpu", "cpu", ranks)
    if mode == "rms_norm":
        path = min(NORM_PATH_OF.values(), key=lambda p: table.call_us(p, nbytes))
        return next(c for c, p in NORM_PATH_OF.items() if p == path)
    return selection.choose_algorithm("cpu", ranks, nbytes, capacity_bytes=capacities.get)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jsonl", nargs="+")
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--mode", default="all_reduce", choices=("all_reduce", "rms_norm"))
    parser.add_argument("--dtype", default=None, help="only rows of this dtype")
    args = parser.parse_args()
    samples = defaultdict(lambda: defaultdict(list))  # (dtype, bytes) -> candidate -> [us]
    capacities = {}
    for path in args.jsonl:
        with open(path) as f:
            for row in map(json.loads, filter(str.strip, f)):
                if (row["mode"] == args.mode and row.get("ranks", args.ranks) == args.ranks
                        and args.dtype in (None, row["dtype"])):
                    capacities = row["capacities"]
                    for name, times in row["samples"].items():
                        samples[(row["dtype"], row["bytes"])][name].extend(times)
    if not samples:
        raise SystemExit(f"no {args.mode} rows of {args.ranks} ranks"
                         f"{' in ' + args.dtype if args.dtype else ''} in {', '.join(args.jsonl)}")
    names = list(next(iter(samples.values())))
    kernels = [n for n in names if n != "psum+norm"]  # the baseline is never auto's
    print("| size per rank | dtype | rounds | " + " | ".join(f"{n} us" for n in names) +
          " | fastest by median | next / fastest | rounds won | auto picks |")
    print("|---" * (len(names) + 7) + "|")
    for (dtype, nbytes), per in sorted(samples.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        medians = {n: statistics.median(per[n]) for n in names}
        ranked = sorted(kernels, key=medians.get)
        rounds = len(per[names[0]])
        won = [sum(per[n][k] == min(per[m][k] for m in kernels) for k in range(rounds))
               for n in kernels]
        pick = auto_pick(args.mode, args.ranks, nbytes, capacities)
        size = f"{nbytes >> 20}M" if nbytes >= 1 << 20 else f"{nbytes >> 10}K"
        print(f"| {size} | {dtype} | {rounds} | " +
              " | ".join(f"{medians[n]:.1f}" for n in names) +
              f" | {ranked[0]} | {medians[ranked[1]] / medians[ranked[0]]:.2f} | "
              f"{'/'.join(map(str, won))} | {pick} ({medians[pick] / medians[ranked[0]]:.2f}x) |")


if __name__ == "__main__":
    main()
