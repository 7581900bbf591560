"""What a timed program's outputs cost: chains that return their results
against chains that return only a count of wrong elements.

XLA keeps some of a chain's values in the program's output buffers, which
move at every launch; it then records the launch's command buffer again
and traces each FFI call whose buffers moved through its handler (a trace
cache of 16 per call, keyed by buffer addresses). This times the same
chain of 16 KB calls (bfloat16, hidden 4096) built three ways:

  results   bench's program before 2026-12-06: x, residual and gamma chained,
            every result an output (timing.chained)
  count     the same chain returning each rank's count of wrong elements
            only (timing.chained_to_count, what bench and tune time now)
  pc        benchmarks/per_call_overhead.py's program with --output results
            (its method before 2026-12-06): one chained operand, its last
            result the sharded output

for jax_ar.all_reduce (one-shot, sum; pc: avg) and all_reduce_rms_norm
(one-shot), sampled two ways: "bench" (bench's method: 4 launches a sample,
10 samples, the last sample's output kept alive) and "steady" (10 launches
a sample, 7 samples, nothing kept). Run as ranks of the launcher, with
XLA's log to count the traces:

    TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE='command_buffer_thunk=3,*traced*=6' \\
    python -m jax_ar launch -n 2 --platform gpu benchmarks/output_buffers.py [--calls 300]

Rank 0 prints one line per program and pattern: us per call (median
sample), host us per call (the time the launches of a sample took to
return, before blocking) and the samples. Each case is framed by
"@@case NAME start/end" lines on stderr, so that XLA's log lines can be
counted per case (docs/latency_log.md, "thirty-seventh push").
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_ar
from jax_ar.tools import timing, wrong_count

import per_call_overhead  # this folder: the launcher puts it first on sys.path

HIDDEN, EPS, BYTES = 4096, 1e-6, 16384


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per program")
    args = parser.parse_args()
    calls = args.calls
    mesh = jax.make_mesh((jax.device_count(),), ("tp",))
    comm = jax_ar.setup(mesh, "tp")
    n = jax.device_count()
    tokens = BYTES // 2 // HIDDEN

    def put(shape, spec, seed):
        data = (np.random.default_rng(seed).integers(-4, 5, shape) / 8).astype(jnp.bfloat16)
        return jax.make_array_from_callback(shape, NamedSharding(mesh, spec), lambda i: data[i])

    x = put((tokens * n, HIDDEN), P("tp"), 0)
    residual, gamma = put((tokens, HIDDEN), P(), 1), put((HIDDEN,), P(), 2)
    ones_r, ones_g = jnp.ones((tokens, HIDDEN), jnp.bfloat16), jnp.ones((HIDDEN,), jnp.bfloat16)

    def fused(a, r, g):
        return jax_ar.all_reduce_rms_norm(a, r, g, "tp", eps=EPS, algorithm="oneshot")

    def all_reduce(a, op="sum"):
        return jax_ar.all_reduce(a, "tp", op=op, algorithm="oneshot")

    def pc_program(step):  # per_call_overhead's program before 2026-12-06 (--output results)
        return jax.jit(jax.shard_map(per_call_overhead.chain(step, calls, "results"), mesh=mesh,
                                     in_specs=P("tp"), out_specs=P("tp"), check_vma=False))

    # Counts against stand-in wants: only the programs' shapes matter here.
    def count_all(results, wants):
        return sum(wrong_count.off_tolerance(r, w) for r, w in zip(results, wants))

    programs = {
        "fused results": (timing.chained(lambda a, r, g: (*fused(a, r, g), g), mesh, "tp", calls,
                                         n_args=3), (x, residual, gamma)),
        "fused count": (timing.chained_to_count(lambda a, r, g: (*fused(a, r, g), g), mesh, "tp",
                                                calls, count_all, n_args=3, n_wants=2),
                        (x, residual, gamma, residual, residual)),
        "fused pc": (pc_program(lambda y: fused(y, ones_r, ones_g)[0]), (x,)),
        "all_reduce results": (timing.chained(lambda a: (all_reduce(a),), mesh, "tp", calls),
                               (x,)),
        "all_reduce count": (timing.chained_to_count(lambda a: (all_reduce(a),), mesh, "tp",
                                                     calls, count_all), (x, residual)),
        "all_reduce pc": (pc_program(lambda y: all_reduce(y, "avg")), (x,)),
    }
    me = jax.process_index()
    for pattern, launches, samples in (("bench", 4, 10), ("steady", 10, 7)):
        for name, (program, inputs) in programs.items():
            compiled = program.lower(*inputs).compile()
            run = lambda: compiled(*inputs)  # noqa: E731
            for _ in range(3):
                jax.block_until_ready(run())
            print(f"@@case {name} {pattern} start", file=sys.stderr, flush=True)
            per_call, host, kept = [], [], None
            for _ in range(samples):
                start = time.perf_counter()
                for _ in range(launches):
                    out = run()
                returned = time.perf_counter()
                jax.block_until_ready(out)
                done = time.perf_counter()
                per_call.append((done - start) * 1e6 / (launches * calls))
                host.append((returned - start) * 1e6 / (launches * calls))
                if pattern == "bench":
                    kept = out  # noqa: F841  (bench keeps the last output for its check)
            print(f"@@case {name} {pattern} end", file=sys.stderr, flush=True)
            if me == 0:
                print(f"output_buffers: {name:>18} {pattern:>6}: "
                      f"{statistics.median(per_call):6.2f} us a call, "
                      f"host {statistics.median(host):5.2f} us a call "
                      f"(samples {[round(v, 2) for v in per_call]})", flush=True)
    comm.check()
    comm.close()
    if me == 0:
        print(f"# output_buffers: {n} ranks on {jax.devices()[0].device_kind}, {calls} calls a "
              f"program, {BYTES} bytes a rank, jax {jax.__version__}")


if __name__ == "__main__":
    main()
