"""RMSNorm benchmarks on one GPU, both sides of every comparison from one run.

Part 1 (default): jax_ar.rms_norm with a residual, bfloat16 [tokens, hidden]
for hidden 4096 and 8192 and tokens 1..32768, against
  (a) the device's copy bandwidth, measured in the same run on a 1 GiB
      bfloat16 array: the better of a device-to-device copy and XLA's
      x + 1, counting bytes read and written, and
  (b) XLA's own fusion of the same jnp code (jax_ar.rms_norm.reference).
It moves 4 * tokens * hidden * 2 bytes per call (reads x and residual,
writes out and residual_out). Targets (issue 4): >= 90% of the copy
bandwidth for tokens >= 8192, and never slower than XLA's fusion.

Part 2 (--fused): jax_ar.all_reduce_rms_norm (one fused kernel) against
jax_ar.all_reduce followed by jax_ar.rms_norm, per rank, for 2 ranks sharing
the GPU under CUDA MPS (start MPS first; see docs/rms_norm.md). Run as
    python -m jax_ar launch -n 2 benchmarks/rms_norm_bench.py --fused
It is skipped, saying why, when the build has no fused CUDA kernel. Ranks
on one GPU share its bandwidth and SMs: these figures compare the two
paths' costs, they say nothing about NVLink.

Timing: K calls in one jitted function, each call's inputs are the previous
call's outputs (no fori_loop), with an optimization barrier between calls
so that XLA cannot fuse across them; the first run (compile, warm-up) is
excluded, jax_ar's and XLA's timed runs alternate, and the median of the
repeats is reported. When one chain's
buffers would stay in the 60 MB L2 between calls, R independent chains are
interleaved (call i continues chain i mod R) so that every call reads
inputs last touched R calls earlier, after more than twice L2 of traffic.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp

L2_BYTES = 60 << 20
TOKENS = [2**i for i in range(16)]  # 1 .. 32768
HIDDEN = (4096, 8192)
FUSED_TOKENS = (1, 16, 128, 512, 2048)
EPS = 1e-6


def chained(step, num_chains, calls):
    """jit of `calls` applications of step over `num_chains` interleaved
    chains; state is a tuple of per-chain tuples of arrays."""
    def run(states):
        states = list(states)
        for i in range(calls):
            c = i % num_chains
            states[c] = jax.lax.optimization_barrier(step(*states[c]))
        return tuple(states)
    return jax.jit(run)


def time_per_call(fn, args, calls, repeats):
    """Median seconds per call over `repeats` timed runs after a warm-up."""
    jax.block_until_ready(fn(args))  # compile + warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(args))
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def plan(bytes_per_call_touched, expected_s):
    """(chains, calls): enough chains to leave L2, enough calls for ~3 ms."""
    chains = max(1, min(32, math.ceil(2 * L2_BYTES / max(1, bytes_per_call_touched))))
    calls = max(16, min(64, math.ceil(3e-3 / expected_s)))
    calls = max(chains, calls // chains * chains)
    return chains, calls


def copy_bandwidth(repeats):
    """Bytes read + written per second copying a 1 GiB bfloat16 array: the
    better of a device-to-device copy (XLA's copy of a jit argument into a
    new buffer) and XLA's elementwise x + 1. Returns (best, memcpy, x + 1)."""
    n = 1 << 29
    x = jax.random.normal(jax.random.key(0), (n,), jnp.bfloat16)
    calls = 16
    copy = jax.jit(lambda a: jnp.copy(a))
    jax.block_until_ready(copy(x))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls - 1):
            copy(x)
        jax.block_until_ready(copy(x))
        samples.append((time.perf_counter() - start) / calls)
    memcpy = 2 * n * 2 / statistics.median(samples)
    one = jnp.bfloat16(1)
    add = chained(lambda a: (a + one,), 1, calls)
    elementwise = 2 * n * 2 / time_per_call(add, ((x,),), calls, repeats)
    return max(memcpy, elementwise), memcpy, elementwise


def norm_inputs(key, chains, tokens, hidden):
    keys = jax.random.split(key, 2 * chains + 1)
    gamma = jax.random.normal(keys[-1], (hidden,), jnp.float32).astype(jnp.bfloat16)
    states = tuple((jax.random.normal(keys[2 * c], (tokens, hidden), jnp.bfloat16),
                    jax.random.normal(keys[2 * c + 1], (tokens, hidden), jnp.bfloat16))
                   for c in range(chains))
    return states, gamma


def uses_kernel(gamma, x):
    import jax_ar

    text = jax.jit(lambda a, r, g: jax_ar.rms_norm(a, g, eps=EPS, residual=r)).lower(
        x, x, gamma).as_text()
    return "jax_ar_add_rms_norm" in text


def interleaved(impls, states, calls, repeats):
    """Median seconds per call of each named function in `impls`, their
    timed runs interleaved so that drift in the machine affects all alike."""
    samples = {name: [] for name in impls}
    for fn in impls.values():  # compile + warm-up
        jax.block_until_ready(fn(states))
    for _ in range(repeats):
        for name, fn in impls.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(states))
            samples[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(s) for name, s in samples.items()}


def bench_norm(args):
    import jax_ar
    from jax_ar.rms_norm import reference

    device = jax.devices()[0]
    copy_bps, memcpy_bps, add_bps = copy_bandwidth(args.repeats)
    print(f"# rms_norm with residual, bfloat16; {device.device_kind}; jax {jax.__version__}; "
          f"{datetime.date.today().isoformat()}")
    print(f"# copy bandwidth over 1 GiB bfloat16, read + write: device copy "
          f"{memcpy_bps / 1e12:.3f} TB/s, x + 1 {add_bps / 1e12:.3f} TB/s; baseline "
          f"{copy_bps / 1e12:.3f} TB/s")
    probe = jnp.zeros((1, HIDDEN[0]), jnp.bfloat16)
    if not uses_kernel(probe[0], probe):
        print("# WARNING: jax_ar.rms_norm did not lower to the CUDA kernel (see JAX_AR_LOG=info); "
              "the jax_ar columns below are XLA's fallback")
    print(f"{'hidden':>6} {'tokens':>6} {'jax_ar us':>10} {'xla us':>10} {'jax_ar TB/s':>11} "
          f"{'xla TB/s':>9} {'% copy':>7} {'xla/jax_ar':>10} {'chains':>6} {'calls':>5}")
    rows = []
    ours = lambda x, r, g: tuple(jax_ar.rms_norm(x, g, eps=EPS, residual=r))
    xla = lambda x, r, g: tuple(reference(x, g, EPS, r))
    for hidden in HIDDEN:
        for tokens in TOKENS:
            moved = 4 * tokens * hidden * 2
            chains, calls = plan(moved, max(4e-6, moved / copy_bps))
            states, gamma = norm_inputs(jax.random.key(tokens + hidden), chains, tokens, hidden)
            impls = {name: chained(lambda x, r, impl=impl: impl(x, r, gamma), chains, calls)
                     for name, impl in (("jax_ar", ours), ("xla", xla))}
            seconds = interleaved(impls, states, calls, args.repeats)
            row = dict(hidden=hidden, tokens=tokens, bytes=moved, chains=chains, calls=calls,
                       jax_ar_us=seconds["jax_ar"] * 1e6, xla_us=seconds["xla"] * 1e6,
                       jax_ar_tbps=moved / seconds["jax_ar"] / 1e12,
                       xla_tbps=moved / seconds["xla"] / 1e12)
            row["percent_of_copy"] = 100 * moved / seconds["jax_ar"] / copy_bps
            row["xla_over_jax_ar"] = seconds["xla"] / seconds["jax_ar"]
            rows.append(row)
            print(f"{hidden:>6} {tokens:>6} {row['jax_ar_us']:>10.2f} {row['xla_us']:>10.2f} "
                  f"{row['jax_ar_tbps']:>11.3f} {row['xla_tbps']:>9.3f} "
                  f"{row['percent_of_copy']:>7.1f} {row['xla_over_jax_ar']:>10.2f} "
                  f"{chains:>6} {calls:>5}", flush=True)
    large = [r["percent_of_copy"] for r in rows if r["tokens"] >= 8192]
    if large:
        print(f"# target >= 90% of copy bandwidth for tokens >= 8192: worst {min(large):.1f}% -> "
              f"{'met' if min(large) >= 90 else 'NOT met'}")
    worst_ratio = min(r["xla_over_jax_ar"] for r in rows)
    print(f"# target never slower than XLA's fusion: worst xla/jax_ar time {worst_ratio:.2f} -> "
          f"{'met' if worst_ratio >= 1.0 else 'NOT met'}")
    return dict(part="rms_norm", device=device.device_kind, jax=jax.__version__,
                date=datetime.date.today().isoformat(), copy_tbps=copy_bps / 1e12,
                memcpy_tbps=memcpy_bps / 1e12, add_tbps=add_bps / 1e12, rows=rows)


def bench_fused(args):
    import jax_ar
    from jax.sharding import NamedSharding, PartitionSpec as P
    from jax_ar.rms_norm import _module_serves

    mesh = jax.make_mesh((jax.device_count(),), ("tp",))
    comm = jax_ar.setup(mesh, "tp")
    me = jax.process_index()
    say = (lambda *a: print(*a, flush=True)) if me == 0 else (lambda *a: None)
    reason = None if comm.serves_calls else comm.fallback_reason
    reason = reason or _module_serves(comm.platform, "jax_ar_all_reduce_rms_norm")
    if reason:
        say(f"# fused all_reduce_rms_norm benchmark skipped: {reason}")
        comm.close()
        return dict(part="fused", skipped=reason)
    say(f"# all_reduce_rms_norm (fused) vs all_reduce + rms_norm, bfloat16, "
        f"{comm.world_size} ranks on {jax.devices()[0].device_kind}; jax {jax.__version__}; "
        f"{datetime.date.today().isoformat()}")
    say(f"{'hidden':>6} {'tokens':>6} {'fused us':>9} {'separate us':>11} {'separate/fused':>14}")
    world = comm.world_size
    rows = []
    for hidden in HIDDEN:
        for tokens in FUSED_TOKENS:
            gamma = jnp.ones((hidden,), jnp.bfloat16)
            calls = 32

            def program(step):
                def run(x, residual, g):
                    for _ in range(calls):
                        x, residual = step(x, residual, g)
                    return x, residual
                return jax.jit(jax.shard_map(run, mesh=mesh, in_specs=(P("tp"), P(), P()),
                                             out_specs=(P("tp"), P())))

            fused = lambda x, r, g: _varying(jax_ar.all_reduce_rms_norm(x, r, g, "tp"), mesh)
            separate = lambda x, r, g: _varying(jax_ar.rms_norm(
                jax_ar.all_reduce(x, "tp"), g, eps=EPS, residual=r), mesh)
            x = jax.make_array_from_callback(
                (world * tokens, hidden), NamedSharding(mesh, P("tp")),
                lambda idx: np.random.default_rng(0).standard_normal(
                    (tokens, hidden)).astype(jnp.bfloat16))
            # make_array_from_callback, not device_put: device_put checks
            # that processes agree through a collective, which NCCL refuses
            # for ranks sharing a GPU.
            replicated = NamedSharding(mesh, P())
            residual = jax.make_array_from_callback(
                (tokens, hidden), replicated,
                lambda idx: np.ones((tokens, hidden), jnp.bfloat16)[idx])
            g = jax.make_array_from_callback((hidden,), replicated,
                                             lambda idx: np.asarray(gamma)[idx])
            seconds = {}
            for name, step in (("fused", fused), ("separate", separate)):
                fn = program(step)
                seconds[name] = time_per_call(lambda a, fn=fn: fn(*a), (x, residual, g), calls,
                                              args.repeats)
            row = dict(hidden=hidden, tokens=tokens, fused_us=seconds["fused"] * 1e6,
                       separate_us=seconds["separate"] * 1e6)
            rows.append(row)
            say(f"{hidden:>6} {tokens:>6} {row['fused_us']:>9.2f} {row['separate_us']:>11.2f} "
                f"{row['separate_us'] / row['fused_us']:>14.2f}")
    comm.close()
    return dict(part="fused", world=world, rows=rows)


def _varying(outs, mesh):
    """(out, residual_out) as the next call's (x, residual): x varies per rank."""
    from jax_ar import _compat

    out, residual_out = outs
    return _compat.pcast_to_varying(out, ("tp",)), residual_out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fused", action="store_true",
                        help="the fused all-reduce part (run under jax_ar launch, MPS started)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    if jax.devices()[0].platform != "gpu":
        print("# rms_norm_bench needs a GPU; nothing measured", file=sys.stderr)
        return 0
    result = bench_fused(args) if args.fused else bench_norm(args)
    if args.json and jax.process_index() == 0:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
