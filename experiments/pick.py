"""Which variant of an experiments/ab.sh run to land, if any.

    python3 experiments/pick.py LATENCY_JSONL [--candidates NAME,...]
        [--case "all_reduce_rms_norm oneshot"]

Prints each candidate's gain over main, cell by cell (ranks and bytes per
rank), and, as its last line, the variant to land or "none". A tree's
figure in a cell is the faster of its passes (ab.sh runs main first and
last, each variant twice in turn), so a pass slowed by the machine counts
less; the trees share the one-shot all_reduce's code, so the case itself is
compared, not its excess over the all_reduce, whose own noise (0.1-0.4 us
a cell) would be credited to the variant. A candidate qualifies when every
result of the run was right, its gain over main averages at least
GAIN_US at 4 and 8 ranks, and no cell at any world size is more than
LOSS_US slower than main (a choice is measured at 2, 4 and 8 ranks before
it is kept); the largest mean gain wins. Diagnostics (variants with wrong
results on purpose) are left out with --candidates.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict

GAIN_US = 0.1
LOSS_US = 0.1
FUSED_ONESHOT = "all_reduce_rms_norm oneshot"


def best_of_passes(lines, case):
    """(variant, ranks, bytes per rank, hidden) -> the fastest us_per_call of
    that case (hidden 0 for cases without rows)."""
    best = defaultdict(lambda: float("inf"))
    for line in lines:
        if line.get("case") == case:
            key = (line["variant"], line["ranks"], line["bytes_per_rank"],
                   line.get("norm_hidden", 0))
            best[key] = min(best[key], line["us_per_call"])
    return best


def cell_name(cell):
    ranks, bytes_per_rank, hidden = cell
    return f"{ranks}r {bytes_per_rank // 1024}K" + (f" h{hidden}" if hidden else "")


def pick(lines, candidates=None, case=FUSED_ONESHOT):
    """Returns (report lines, the variant to land or None)."""
    wrong = {line["variant"] for line in lines
             if line.get("case") != "ll_floor" and line.get("result", "ok") != "ok"}
    best = best_of_passes(lines, case)
    cells = sorted({key[1:] for key in best if key[0] == "main"})
    variants = sorted({key[0] for key in best} - {"main"})
    if candidates is not None:
        variants = [v for v in variants if v in candidates]
    report, qualified = [], []
    if not cells:
        return [f"no main lines of {case!r}"], None
    for v in variants:
        if v in wrong or "main" in wrong:
            report.append(f"{v}: a result of the run was wrong")
            continue
        gain = {cell: best[("main", *cell)] - best[(v, *cell)] for cell in cells
                if (v, *cell) in best}
        if len(gain) < len(cells):
            report.append(f"{v}: not every cell of main was measured")
            continue
        wide = [g for (ranks, _, _), g in gain.items() if ranks in (4, 8)]
        mean = sum(wide) / len(wide) if wide else 0.0
        worst = min(gain.values())
        ok = bool(wide) and mean >= GAIN_US and worst >= -LOSS_US
        report.append(f"{v}: mean gain at 4 and 8 ranks {mean:+.2f} us, worst cell {worst:+.2f}"
                      f" ({', '.join(f'{cell_name(c)} {g:+.2f}' for c, g in sorted(gain.items()))})"
                      + (": qualifies" if ok else ""))
        if ok:
            qualified.append((mean, v))
    return report, (max(qualified)[1] if qualified else None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jsonl")
    parser.add_argument("--candidates", default=None,
                        help="comma-separated variants that may land (default: all)")
    parser.add_argument("--case", default=FUSED_ONESHOT)
    args = parser.parse_args(argv)
    with open(args.jsonl) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    candidates = set(args.candidates.split(",")) if args.candidates else None
    report, winner = pick(lines, candidates, args.case)
    print("\n".join(report))
    print(winner or "none")


if __name__ == "__main__":
    main()
