"""A launch's timeline, warp by warp, from the fstamp diagnostic's stamps.

    python3 experiments/stamps.py LOG [--mhz SM_CLOCK]

fstamp.patch (a diagnostic, never on main; in git history, 3f4dcfa's
experiments/) has lane 0 of every warp of a launch's first blocks read the
SM's clock at six places of the one-shot all_reduce and the fused
one-shot, in one launch of 8192, and print them:

    [rank 0] stamp fused rank 0 launch 4000 block 0 warp 3 of 16 bytes 524288: t0 ... t5

t0 the launch number known, t1 the block's packets sent, t2 the row's (the
vector's) sums over ranks done (its last packet in), t3 the row sum over
the block's warps done (fused; the all_reduce: its result stored), t4 the
last store issued, t5 FinishLaunch passed. scripts/latency_ab.sh's log
holds every rank's lines under "===== VARIANT, N ranks" headers. For each
variant, kernel, ranks and bytes this prints the medians, over the
launches, ranks and blocks stamped, of where the block's warps were,
counted from the block's earliest t0 (stamps compare within a block: its
warps share an SM's clock): the last warp's sends; the first and the last
warp's packets in; the last warp past the row sum; the last warp's end;
and the tail, the end less the last packet in: what a launch spends after
its data arrived. Cycles, or microseconds with --mhz (the SM clock ab.sh
writes to gpu.txt).

tstamp.patch (fstamp's stamps, and a line a turn) also prints, for each of
the first four turns of a thread that takes rows (fused) or vectors
(all_reduce) in turns, a line of kernel "KERNEL_tT" whose t1 is the turn's
start, t2 its last packet in and t3 its row sum (its stored result); t0,
t4 and t5 are the launch's. Their "sent" column is then the turn's start.
With --turns it prints instead, for those launches, each warp's own times
(medians over warps, ranks, launches and blocks): from a turn's start to
its last packet in, from there to its row sum, and from its row sum to the
next turn's start (the last turn: to the launch's end), so that a turn's
cost is not read across warps that started apart.
"""
from __future__ import annotations

import argparse
import re
import statistics
from collections import defaultdict

HEADER = re.compile(r"^===== (.+?), (\d+) ranks")
STAMP = re.compile(r"stamp (\S+) rank (\d+) launch (\d+) block (\d+) warp (\d+) of (\d+) "
                   r"bytes (\d+): (-?\d+) (-?\d+) (-?\d+) (-?\d+) (-?\d+) (-?\d+)")
COLUMNS = ("sent", "first in", "last in", "summed", "end", "tail")


def read_blocks(lines):
    """(variant, ranks, kernel, bytes) -> one dict a stamped block (rank,
    launch, block): warp -> its six stamps."""
    blocks = defaultdict(lambda: defaultdict(dict))
    variant, ranks = None, None
    for line in lines:
        header = HEADER.match(line)
        if header:
            variant, ranks = header.group(1), int(header.group(2))
            continue
        stamp = STAMP.search(line)
        if stamp is None or variant is None:
            continue
        kernel, rank, launch, block, warp, _, nbytes = stamp.groups()[:7]
        times = [int(t) for t in stamp.groups()[7:]]
        blocks[(variant, ranks, kernel, int(nbytes))][(rank, launch, block)][int(warp)] = times
    return blocks


def timeline(warps):
    """One block's COLUMNS, in cycles from its earliest t0 (a stamp of 0 was
    not reached: left out)."""
    start = min(t[0] for t in warps.values())

    def at(i, pick):
        reached = [t[i] - start for t in warps.values() if t[i] != 0]
        return pick(reached) if reached else float("nan")

    last_in = at(2, max)
    end = at(5, max)
    return {"sent": at(1, max), "first in": at(2, min), "last in": last_in,
            "summed": at(3, max), "end": end, "tail": end - last_in}


def summarize(blocks):
    """(variant, ranks, kernel, bytes) -> (blocks stamped, column -> median)."""
    table = {}
    for key, stamped in sorted(blocks.items()):  # (variant, ranks, kernel, bytes): bytes by size
        rows = [timeline(warps) for warps in stamped.values()]
        table[key] = (len(rows), {c: statistics.median(r[c] for r in rows) for c in COLUMNS})
    return table


def warp_turns(lines):
    """(variant, ranks, kernel, bytes, turn) -> (to last packet, to row sum,
    to next) in cycles, medians over every stamped warp's own turn."""
    turns = defaultdict(dict)
    for key, stamped in read_blocks(lines).items():
        variant, ranks, kernel, nbytes = key
        if "_t" not in kernel:
            continue
        base, turn = kernel.rsplit("_t", 1)
        for (rank, launch, block), warps in stamped.items():
            for warp, times in warps.items():
                turns[(variant, ranks, base, nbytes, rank, launch, block, warp)][int(turn)] = times
    spans = defaultdict(list)
    for key, by_turn in turns.items():
        for turn, t in by_turn.items():
            if 0 in t[1:4]:
                continue
            after = by_turn[turn + 1][1] if turn + 1 in by_turn else t[5]
            spans[key[:4] + (turn,)].append((t[2] - t[1], t[3] - t[2], after - t[3]))
    return {key: tuple(statistics.median(s[i] for s in rows) for i in range(3))
            for key, rows in sorted(spans.items())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("--mhz", type=float, help="SM clock: print microseconds, not cycles")
    parser.add_argument("--turns", action="store_true",
                        help="each warp's own turn times (tstamp's turn lines)")
    args = parser.parse_args()
    unit = "us" if args.mhz else "cycles"

    def cells(values):
        return " | ".join(f"{v / args.mhz:.2f}" if args.mhz else f"{v:.0f}" for v in values)

    if args.turns:
        with open(args.log) as f:
            spans = warp_turns(f)
        print(f"| variant | ranks | kernel | bytes | turn | start to last packet | to row sum "
              f"| to next turn or end ({unit}) |")
        print("|---" * 8 + "|")
        for (variant, ranks, kernel, nbytes, turn), values in spans.items():
            print(f"| {variant} | {ranks} | {kernel} | {nbytes} | {turn} | {cells(values)} |")
        return
    with open(args.log) as f:
        table = summarize(read_blocks(f))
    print("| variant | ranks | kernel | bytes | blocks | " + " | ".join(COLUMNS) + f" ({unit}) |")
    print("|---" * (5 + len(COLUMNS)) + "|")
    for (variant, ranks, kernel, nbytes), (count, medians) in table.items():
        print(f"| {variant} | {ranks} | {kernel} | {nbytes} | {count} | {cells(medians.values())} |")


if __name__ == "__main__":
    main()
