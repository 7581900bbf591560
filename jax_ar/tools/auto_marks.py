"""Which rows of a bench result `algorithm="auto"` runs: the table's `*` and
the plot's rings (bench.py and plot.py both mark them)."""
from __future__ import annotations

__all__ = ["auto_rows", "label_of", "pick_of"]


def pick_of(doc: dict, r: dict) -> str | None:
    """What algorithm="auto" runs for result r's message: an all-reduce
    algorithm (picks keyed by bytes) or an rms_norm variant (keyed "dtype
    bytes", bench_rank.auto_picks)."""
    picks = doc.get("selection", {}).get("picks", {})
    return picks.get(f"{r['dtype']} {r['bytes']}", picks.get(str(r["bytes"])))


def label_of(r: dict) -> str:
    """A row's name in the table: the kernel that ran where the library chose
    one (twoshot_ll or twoshot for "twoshot"), else the algorithm."""
    return r.get("kernel") or r["algorithm"]


def auto_rows(doc: dict) -> set:
    """Indices of the results to mark as what algorithm="auto" runs: per
    message (dtype, op, size), the timed row of the algorithm it picks, else
    (that algorithm not timed) the row of "auto" itself."""
    groups = {}
    for i, r in enumerate(doc["results"]):
        if r["status"] == "ok":
            groups.setdefault((r["dtype"], r["op"], r["bytes"]), []).append(i)
    marked = set()
    for rows in groups.values():
        pick = pick_of(doc, doc["results"][rows[0]])
        for wanted in (pick, "auto"):
            found = [i for i in rows if label_of(doc["results"][i]) == wanted or
                     doc["results"][i]["algorithm"] == wanted]
            if found:
                marked.add(found[0])
                break
    return marked
