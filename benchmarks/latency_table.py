"""Markdown tables from the JSON lines of scripts/latency_ab.sh: us per call
by case and variant (rows) and ranks x bytes per rank (columns), and each
figure's ratio to the LL floor probe of the same session. A variant run
more than once (an A/B in turn: main, variant, variant, main) shows every
run, in order, and the ratio of their median. A case whose result was
wrong (per_call_overhead.py checks one call) shows "wrong". The fused
cases (`all_reduce_rms_norm`, one row a hidden size) also get a second
table: how far each run lies above the one-shot all_reduce of the same
bytes in the same run of its tree (issue 23's "at most 1.0 us above"):
the one-shot line of that tree, ranks and bytes that the file holds last
before the fused line, as a job times the one-shot before its fused
cases (an earlier job of the tree may time the one-shot alone).

    python benchmarks/latency_table.py docs/results/latency_....jsonl [--bytes 16384]
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

PROBE = "LL floor probe"
ONE_SHOT = "all_reduce oneshot"


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def label(row, case=None):
    """A row's label, or with `case` the label of that case (no hidden size)
    in the row's tree."""
    if row["case"] == "ll_floor":
        return PROBE
    tree = f"{row['variant']} ({row['commit']})"
    if case is not None:
        return f"{tree}: {case}"
    hidden = f" h{row['norm_hidden']}" if "norm_hidden" in row else ""
    return f"{tree}: {row['case']}{hidden}"


def print_table(title, columns, rows):
    """rows: [(name, [cell text per column])]."""
    head = " | ".join(f"{n} ranks, {b // 1024} KB" for n, b in columns)
    print(f"| {title} | {head} |")
    print("|---" * (len(columns) + 1) + "|")
    for name, cells in rows:
        print(f"| {name} | " + " | ".join(cells) + " |")


def per_call_cells(name, per, floor, columns):
    cells = []
    for key in columns:
        runs = per.get(key)
        if not runs:
            cells.append("")
        elif None in runs:
            cells.append("wrong")
        else:
            text = " / ".join(f"{us:.2f}" for us in runs)
            base = floor.get(key)
            if name != PROBE and base and None not in base:
                text += f" ({statistics.median(runs) / statistics.median(base):.2f}x)"
            cells.append(text)
    return cells


def above_one_shot_cells(above, columns):
    """above: (ranks, bytes) -> each run's fused us minus its one-shot us
    (None where either was wrong)."""
    cells = []
    for key in columns:
        runs = above.get(key)
        if not runs:
            cells.append("")
        elif None in runs:
            cells.append("wrong")
        else:
            cells.append(", ".join(f"{us:+.2f}" for us in runs))
    return cells


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jsonl")
    parser.add_argument("--bytes", default=None,
                        help="comma-separated bytes per rank to show (default: all)")
    args = parser.parse_args()
    rows = load(args.jsonl)
    wanted = None if args.bytes is None else {int(b) for b in args.bytes.split(",")}
    figures = defaultdict(lambda: defaultdict(list))  # label -> (ranks, bytes) -> us of each run
    above = defaultdict(lambda: defaultdict(list))  # fused label -> (ranks, bytes) -> us above
    last_one_shot = {}  # (tree's one-shot label, ranks, bytes) -> its last us in the file
    for row in rows:
        if wanted is not None and row["bytes_per_rank"] not in wanted:
            continue
        key = (row["ranks"], row["bytes_per_rank"])
        us = None if row.get("result") == "wrong" else row["us_per_call"]
        figures[label(row)][key].append(us)
        if row["case"] == ONE_SHOT:
            last_one_shot[(label(row), *key)] = us
        elif "norm_hidden" in row:
            runs = above[label(row)][key]  # its cell stays empty without a one-shot before it
            one_shot = (label(row, ONE_SHOT), *key)
            if one_shot in last_one_shot:
                base = last_one_shot[one_shot]
                runs.append(None if None in (us, base) else us - base)
    columns = sorted({key for per in figures.values() for key in per})
    floor = figures.get(PROBE, {})
    names = sorted(figures, key=lambda k: (k != PROBE, k))
    print_table("us per call (x LL floor)", columns,
                [(name, per_call_cells(name, figures[name], floor, columns)) for name in names])
    fused = [name for name in names if name in above]
    if fused:
        print()
        print_table("us above the one-shot all_reduce of the same bytes, run by run", columns,
                    [(name, above_one_shot_cells(above[name], columns)) for name in fused])


if __name__ == "__main__":
    main()
