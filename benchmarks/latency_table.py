"""Markdown tables from the JSON lines of scripts/latency_ab.sh: us per call
by case and variant (rows) and ranks x bytes per rank (columns), and each
figure's ratio to the LL floor probe of the same session. A variant run
more than once (an A/B in turn: main, variant, variant, main) shows every
run, in order, and the ratio of their median. A case whose result was
wrong (per_call_overhead.py checks one call) shows "wrong".

    python benchmarks/latency_table.py docs/results/latency_....jsonl [--bytes 16384]
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def label(row):
    if row["case"] == "ll_floor":
        return "LL floor probe"
    return f"{row['variant']} ({row['commit']}): {row['case']}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jsonl")
    parser.add_argument("--bytes", default=None,
                        help="comma-separated bytes per rank to show (default: all)")
    args = parser.parse_args()
    rows = load(args.jsonl)
    wanted = None if args.bytes is None else {int(b) for b in args.bytes.split(",")}
    figures = defaultdict(lambda: defaultdict(list))  # label -> (ranks, bytes) -> us of each run
    for row in rows:
        if wanted is not None and row["bytes_per_rank"] not in wanted:
            continue
        us = None if row.get("result") == "wrong" else row["us_per_call"]
        figures[label(row)][(row["ranks"], row["bytes_per_rank"])].append(us)
    columns = sorted({key for per in figures.values() for key in per})
    floor = figures.get("LL floor probe", {})
    head = " | ".join(f"{n} ranks, {b // 1024} KB" for n, b in columns)
    print(f"| us per call (x LL floor) | {head} |")
    print("|---" * (len(columns) + 1) + "|")
    for name in sorted(figures, key=lambda k: (k != "LL floor probe", k)):
        cells = []
        for key in columns:
            if key not in figures[name]:
                cells.append("")
                continue
            runs = figures[name][key]
            if None in runs:
                cells.append("wrong")
                continue
            text = " / ".join(f"{us:.2f}" for us in runs)
            base = floor.get(key)
            if name != "LL floor probe" and base and None not in base:
                text += f" ({statistics.median(runs) / statistics.median(base):.2f}x)"
            cells.append(text)
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
