"""Per-call cost of jax_ar.all_reduce against a plain device copy (issue 3, item 6).

Run as ranks of the launcher, e.g. on one GPU shared by 2 ranks under MPS:

    python -m jax_ar launch -n 2 --platform gpu benchmarks/per_call_overhead.py [--calls 1000]

Two jitted programs, identical but for the operation in the chain:

  all_reduce  y <- jax_ar.all_reduce(y, "tp")           K times, each on the last result
  copy        y <- optimization_barrier(-y)             K times (one read + one write
                                                        kernel of the same bytes; the
                                                        barrier keeps XLA from fusing
                                                        or folding the chain)

on a 16 KB bfloat16 array per rank. Each program is compiled, warmed up,
then timed end to end (dispatch to block_until_ready) `--repeats` times; the
median over K is the per-call time. The all-reduce FFI handler's invocation
count is read before and after the timed runs: 0 under command buffers means
the calls cost no host work (the CUDA graph replays the kernels). Rank 0
prints a JSON line prefixed with "PER_CALL_RESULT ".
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_ar


def chain(step, calls):
    def body(y):
        for _ in range(calls):
            y = step(y)
        return y
    return body


def timed(fn, arg, repeats, handler_calls):
    """Seconds per run of fn(arg) after two warm-up runs (compile, record),
    and how often the all-reduce handler ran during the timed runs."""
    fn(arg).block_until_ready()
    fn(arg).block_until_ready()
    before = handler_calls()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(arg).block_until_ready()
        samples.append(time.perf_counter() - start)
    return samples, handler_calls() - before


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per program (K)")
    parser.add_argument("--bytes", type=int, default=16 * 1024, help="bytes per rank")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--algorithm", default="oneshot")
    args = parser.parse_args()

    mesh = jax.make_mesh((jax.device_count(),), ("tp",))
    comm = jax_ar.setup(mesh, "tp")
    assert comm.serves_calls, comm
    n = jax.device_count()
    elements = args.bytes // 2
    # make_array_from_callback, not device_put: device_put of a global array
    # checks through a collective that processes agree, and NCCL refuses
    # ranks that share a GPU.
    data = np.random.default_rng(0).integers(-4, 5, (n * elements,)).astype(jnp.bfloat16)
    x = jax.make_array_from_callback(data.shape, jax.sharding.NamedSharding(mesh, P("tp")),
                                     lambda idx: data[idx])
    # Invariant results feed the next call, so the vma checks are off; avg
    # keeps the values from growing over the chain.
    wrap = lambda body: jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("tp"),
                                              out_specs=P("tp"), check_vma=False))
    programs = {
        "all_reduce": wrap(chain(lambda y: jax_ar.all_reduce(y, "tp", op="avg",
                                                                 algorithm=args.algorithm),
                                 args.calls)),
        "copy": wrap(chain(lambda y: jax.lax.optimization_barrier(-y), args.calls)),
    }
    handler_calls = comm.handler_calls
    results = {}
    for name, fn in programs.items():
        samples, handler_runs = timed(fn, x, args.repeats, handler_calls)
        median = statistics.median(samples)
        results[name] = {
            "us_per_call": 1e6 * median / args.calls,
            "program_ms_median": 1e3 * median,
            "program_ms_all": [round(1e3 * s, 3) for s in samples],
            "handler_calls_during_timed_runs": handler_runs,
        }
    comm.check()
    comm.close()
    ratio = results["all_reduce"]["us_per_call"] / results["copy"]["us_per_call"]
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": jax.devices()[0].device_kind,
        "ranks": n,
        "processes": jax.process_count(),
        "bytes_per_rank": args.bytes,
        "dtype": "bfloat16",
        "calls_per_program": args.calls,
        "repeats": args.repeats,
        "algorithm": args.algorithm,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "results": results,
        "ratio_all_reduce_to_copy": ratio,
    }
    if jax.process_index() == 0:
        print("PER_CALL_RESULT " + json.dumps(report), flush=True)
        print(f"per call: all_reduce {results['all_reduce']['us_per_call']:.2f} us, copy "
              f"{results['copy']['us_per_call']:.2f} us, ratio {ratio:.2f} "
              f"({n} ranks, {args.bytes} B bfloat16, {args.calls} calls/program, "
              f"handler runs during the timed programs: "
              f"{results['all_reduce']['handler_calls_during_timed_runs']})", flush=True)


if __name__ == "__main__":
    main()
