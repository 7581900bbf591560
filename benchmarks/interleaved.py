"""Which algorithm is fastest at each size, on a busy machine: the candidates
of one size timed in turn, round after round.

`python -m jax_ar bench` times one algorithm after the other, so on a
machine whose load changes within a minute (the project's shared 2-core VM)
the ranking moves from run to run. Here every round times each candidate
once (one sample: enough launches of its chained program to last
--min-sample-ms), alternating the order from round to round, so load
changes hit every candidate alike. The programs, data and checks are
bench's (jax_ar/tools/bench_rank.py); the time of a sample is the slowest
rank's. Run as ranks of the launcher:

    python -m jax_ar launch -n 2 --platform cpu benchmarks/interleaved.py \
        --mode all_reduce --bytes 1K,2K,...,1M --rounds 8 --json ab.jsonl
    python -m jax_ar launch -n 2 --platform cpu benchmarks/interleaved.py \
        --mode rms_norm --dtype bfloat16 --bytes 8K,64K --rounds 8 --json ab.jsonl

--bytes is a comma list of sizes (K, M, G binary); "A,...,B" (or
"A,2A,...,B") runs from A to B, doubling (or multiplying by the step the
two sizes before "..." give).

all_reduce compares oneshot, twoshot and psum (sum); rms_norm compares the
paths all_reduce_rms_norm(algorithm="auto") chooses among: fused_oneshot,
fused_twoshot and the pair all_reduce+rms_norm (whose all-reduce is
algorithm="auto"), with psum+norm as the baseline (hidden
min(4096, elements), as bench). Where ranks share a GPU, NCCL refuses
them, so psum and psum+norm are left out, as bench leaves them out. Rank 0
appends one JSON line per size (every sample) to --json and prints, per
candidate, the median time and the median over rounds of its time / the
round's fastest.
jax_ar/selection/defaults.py's CPU curves were fitted to such runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax

from jax_ar.tools import bench_rank
from jax_ar.tools.bench import NCCL_ALGORITHMS
from jax_ar.tools.sweep import parse_size
from jax_ar.tools.timing import calibrate, gather, launches_for

def parse_sizes(text: str) -> list[int]:
    """'1K,16K' -> [1024, 16384]; '1K,...,8K' -> 1K, 2K, 4K, 8K; '1K,4K,...,64K'
    steps by 4 (the ratio of the two sizes before '...')."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    sizes = []
    for i, item in enumerate(items):
        if item != "...":
            sizes.append(parse_size(item))
            continue
        if not sizes or i + 1 >= len(items) or items[i + 1] == "...":
            raise ValueError(f"--bytes {text!r}: '...' goes between two sizes")
        factor = sizes[-1] // sizes[-2] if len(sizes) >= 2 else 2
        end = parse_size(items[i + 1])
        if len(sizes) >= 2 and sizes[-1] != sizes[-2] * factor or factor < 2:
            raise ValueError(f"--bytes {text!r}: the two sizes before '...' must grow by a "
                             "whole factor of 2 or more")
        start = sizes[-1]
        size = start * factor
        while size < end:
            sizes.append(size)
            size *= factor
        if size != end:
            raise ValueError(f"--bytes {text!r}: {items[i + 1]} is not {start} bytes times a "
                             f"power of {factor}")
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--bytes {text!r}: give sizes of 1 byte or more")
    return sizes


CANDIDATES = {"all_reduce": ("oneshot", "twoshot", "psum"),
              "rms_norm": ("fused_oneshot", "fused_twoshot", "all_reduce+rms_norm",
                           "psum+norm")}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=tuple(CANDIDATES), default="all_reduce")
    p.add_argument("--bytes", default="1K,16K,256K",
                   help="sizes per rank, comma-separated; A,...,B doubles from A to B")
    p.add_argument("--dtype", choices=tuple(ITEMSIZE), default="float32")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--iters", type=int, default=10, help="calls chained per program")
    p.add_argument("--min-sample-ms", type=float, default=20.0)
    p.add_argument("--json", default=None, help="file to append results to (rank 0)")
    ns = p.parse_args()
    try:
        sizes = parse_sizes(ns.bytes)
    except ValueError as e:
        p.error(str(e))
    config = dict(iters=ns.iters, eps=1e-6, seed=0, check=True, run_id="interleaved",
                  warmup=1, launches=2, min_sample_s=ns.min_sample_ms / 1e3,
                  workspace_bytes=None)
    runner = bench_rank.Runner(config)
    candidates = CANDIDATES[ns.mode]
    leader = jax.process_index() == 0
    if runner.comm.psum_unavailable:  # ranks sharing a GPU: NCCL refuses them
        left_out = [n for n in candidates if n in NCCL_ALGORITHMS]
        candidates = tuple(n for n in candidates if n not in left_out)
        if leader:
            print(f"# without {', '.join(left_out)}: {runner.comm.psum_unavailable}", flush=True)
    for nbytes in sizes:
        count = nbytes // ITEMSIZE[ns.dtype]
        programs = {}
        for name in candidates:
            case = dict(dtype=ns.dtype, op="sum" if ns.mode == "all_reduce" else "rms_norm",
                        count=count, bytes=nbytes, algorithm=name)
            if ns.mode == "rms_norm":
                hidden = min(4096, count)
                case.update(hidden=hidden, tokens=count // hidden)
            program, args, chain, check = runner._prepare(case)
            compiled, _ = runner._compile(program, args, name, chain)  # (program, targets)
            run = (lambda c, a: lambda: c(*a))(compiled, args)
            out = run()
            wrong = check(out)
            if wrong:
                raise AssertionError(f"{name} at {nbytes} bytes: {wrong} wrong elements")
            launch_s = max(gather("interleaved", f"calibrate/{ns.mode}/{nbytes}/{name}",
                                  calibrate(run, 1), 600))
            programs[name] = (run, launches_for(launch_s, 2, config["min_sample_s"]), chain)
        samples = {name: [] for name in candidates}
        for k in range(ns.rounds):
            for name in (candidates if k % 2 == 0 else candidates[::-1]):
                run, launches, chain = programs[name]
                start = time.perf_counter()
                for _ in range(launches):
                    out = run()
                jax.block_until_ready(out)
                samples[name].append((time.perf_counter() - start) * 1e6 / (launches * chain))
        every = gather("interleaved", f"samples/{ns.mode}/{nbytes}", samples, 600)
        if not leader:
            continue
        slowest = {n: [max(rank[n][k] for rank in every) for k in range(ns.rounds)]
                   for n in candidates}
        ratios = {n: statistics.median(slowest[n][k] / min(slowest[m][k] for m in candidates)
                                       for k in range(ns.rounds)) for n in candidates}
        print(f"{nbytes:>10} {ns.dtype:>9} " + "  ".join(
            f"{n} {statistics.median(slowest[n]):.1f} us ({ratios[n]:.2f})" for n in candidates),
            flush=True)
        if ns.json:
            with open(ns.json, "a") as f:
                f.write(json.dumps({"mode": ns.mode, "dtype": ns.dtype, "bytes": nbytes,
                                    "ranks": jax.device_count(),
                                    "capacities": {a: runner.comm.capacity_bytes(a)
                                                   for a in ("oneshot", "twoshot")},
                                    "samples": slowest, "load": os.getloadavg()[0],
                                    "time": time.time()}) + "\n")


if __name__ == "__main__":
    main()
