"""Markdown tables from the JSON lines of scripts/latency_ab.sh: us per call
by case and variant (rows) and ranks x bytes per rank (columns), and each
figure's ratio to the LL floor probe of the same session. A case whose
result was wrong (per_call_overhead.py checks one call) shows "wrong".

    python benchmarks/latency_table.py docs/results/latency_....jsonl [--bytes 16384]
"""
from __future__ import annotations

import argparse
import json
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
    figures = defaultdict(dict)  # label -> (ranks, bytes) -> us (the last line wins)
    for row in rows:
        if wanted is not None and row["bytes_per_rank"] not in wanted:
            continue
        us = None if row.get("result") == "wrong" else row["us_per_call"]
        figures[label(row)][(row["ranks"], row["bytes_per_rank"])] = us
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
            us = figures[name][key]
            if us is None:
                cells.append("wrong")
            elif name == "LL floor probe" or floor.get(key) is None:
                cells.append(f"{us:.2f}")
            else:
                cells.append(f"{us:.2f} ({us / floor[key]:.2f}x)")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
