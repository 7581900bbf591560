"""bench.png: latency and bus bandwidth against message size, one line per
algorithm (and per dtype/op when the sweep has several), with a ring on the
point of the algorithm that algorithm="auto" picks at each size."""
from __future__ import annotations

import collections

from .auto_marks import auto_rows

__all__ = ["plot"]


def plot(doc: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    results = [r for r in doc["results"] if r["status"] == "ok"]
    several = len({(r["dtype"], r["op"]) for r in results}) > 1
    lines = collections.defaultdict(list)
    for r in results:
        label = r["algorithm"] + (f" {r['dtype']} {r['op']}" if several else "")
        lines[label].append((r["bytes"], r["time_us"], r["busbw_gbps"]))
    marked = auto_rows(doc)
    picked = sorted((r["bytes"], r["time_us"], r["busbw_gbps"])
                    for i, r in enumerate(doc["results"]) if i in marked)

    fig, (ax_time, ax_bw) = plt.subplots(1, 2, figsize=(13, 5))
    for label, points in lines.items():
        points.sort()
        sizes = [p[0] for p in points]
        ax_time.plot(sizes, [p[1] for p in points], marker="o", markersize=3, label=label)
        ax_bw.plot(sizes, [p[2] for p in points], marker="o", markersize=3, label=label)
    if picked:
        for ax, column in ((ax_time, 1), (ax_bw, 2)):
            ax.scatter([p[0] for p in picked], [p[column] for p in picked], s=90,
                       facecolors="none", edgecolors="black", linewidths=1.2, zorder=3,
                       label="algorithm='auto' picks")
    ax_time.set(yscale="log", ylabel="time per call (us)", title="latency")
    ax_bw.set(ylabel="bus bandwidth (GB/s)", title="bus bandwidth = algbw x 2(n-1)/n")
    sizes = sorted({r["bytes"] for r in results})
    ticks = sizes[::max(1, -(-len(sizes) // 10))]  # at most ~10 labels
    for ax in (ax_time, ax_bw):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [_size_label(t) for t in ticks])
        ax.set_xlabel("message size per rank (bytes)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    machine = doc["machine"]
    where = machine["device_kind"] if machine["platform"] == "gpu" else machine["cpu"]
    fig.suptitle(f"jax_ar bench, {doc['ranks']} ranks, {machine['platform']} ({where}), "
                 f"{doc['date'][:10]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _size_label(value) -> str:
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if value >= 1 << shift:
            return f"{value / (1 << shift):g}{unit}"
    return f"{value:g}"
