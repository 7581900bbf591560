"""RMSNorm benchmarks on one GPU, both sides of every comparison from one run.

Part 1 (default): jax_ar.rms_norm with a residual, bfloat16 [tokens, hidden]
for hidden 4096 and 8192 and tokens 1..32768, against
  (a) the device's copy bandwidth, measured in the same run on a 1 GiB
      bfloat16 array: the better of a device-to-device copy and XLA's
      x + 1, counting bytes read and written, and
  (b) XLA's own fusion of the same jnp code (jax_ar.tools.baselines.xla_rms_norm).
It moves 4 * tokens * hidden * 2 bytes per call (reads x and residual,
writes out and residual_out). Targets (issue 4): >= 90% of the copy
bandwidth for tokens >= 8192, and never slower than XLA's fusion.

Part 2 (--fused): jax_ar.all_reduce_rms_norm (one fused kernel) against
jax_ar.all_reduce followed by jax_ar.rms_norm, per rank, for 2 ranks sharing
the GPU under CUDA MPS (start MPS first; see docs/rms_norm.md). Run as
    python -m jax_ar launch -n 2 benchmarks/rms_norm_bench.py --fused
It is skipped, saying why, when the build has no fused CUDA kernel. Ranks
on one GPU share its bandwidth and SMs: these figures compare the two
paths' costs, they say nothing about NVLink. Its programs return the
chain's results (timing.chained, unchecked), the method bench left on
2026-12-06: XLA keeps part of such a chain in output buffers that move at
every launch and records the program again: 0.3 (all_reduce) and 0.5 us
(fused) a call more at 2 ranks and 16 KB (benchmarks/output_buffers.py,
docs/latency_log.md "thirty-seventh push").

Timing (jax_ar/timing.py, as `python -m jax_ar bench`): K calls in one
jitted function, each call's inputs are the previous call's outputs (no
fori_loop), with an optimization barrier between calls so that XLA cannot
fuse across them. A sample launches that program L times back to back and
blocks once, so that the host's fixed cost of one execution (dispatch,
command-buffer launch, the wake-up after the last kernel) is paid once
per L * K calls instead of once per K; L is chosen after warm-up so that a sample
lasts at least 20 ms. jax_ar's and XLA's samples alternate, and the median
of the repeats is reported. The per-call time of a single launch is kept in
the JSON too (`*_one_launch_us`): it shows what that fixed cost adds when it
is divided by K alone. A second figure comes from a jax.profiler trace of 3
launches: the GPU kernel time per call (`dev` columns; XLA's fusion is two
kernels per call, summed), what the kernels cost without the gaps between
them and without host work. When one chain's buffers would stay in the 60 MB
L2 between calls, R <= 32 independent chains are interleaved (call i
continues chain i mod R) so that every call reads inputs last touched R
calls earlier, after more than twice L2 of traffic; calls too small for 32
chains to do that (under 3.75 MB) run in one chain, from L2.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import uuid

import numpy as np

import jax
import jax.numpy as jnp

from jax_ar.tools import timing

L2_BYTES = 60 << 20
TOKENS = [2**i for i in range(16)]  # 1 .. 32768
HIDDEN = (4096, 8192)
FUSED_TOKENS = (1, 16, 128, 512, 2048)
EPS = 1e-6
MAX_CHAINS = 32
MIN_SAMPLE_S = 0.02
MIN_LAUNCHES = 3


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


def plan(bytes_per_call_touched, expected_s):
    """(chains, calls). Chains: enough that a call's inputs were last touched
    more than twice L2 earlier, where MAX_CHAINS can do that; otherwise one,
    since the data stays in L2 whatever the order and every chain adds
    arrays that the host dispatches on each launch. Calls: enough for about
    3 ms per launch, 16 to 256."""
    needed = math.ceil(2 * L2_BYTES / max(1, bytes_per_call_touched))
    chains = needed if needed <= MAX_CHAINS else 1
    calls = max(16, min(256, math.ceil(3e-3 / expected_s)))
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
    copy_us = timing.measure(lambda: copy(x), 1, calls, repeats)[0]
    memcpy = 2 * n * 2 / (copy_us * 1e-6)
    one = jnp.bfloat16(1)
    add = chained(lambda a: (a + one,), 1, calls)
    elementwise = 2 * n * 2 / pipelined({"add": add}, ((x,),), calls, repeats)["add"][0]
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


def pipelined(impls, args, calls, repeats, agree=None):
    """{name: (median seconds per call, seconds per call of one launch)} for
    each function in `impls` (each a program of `calls` calls taking
    `args`). Samples of L back-to-back launches (jax_ar/timing.py), the
    implementations' samples interleaved so that drift in the machine
    affects all alike. `agree(seconds)` makes ranks agree on L (the
    slowest rank's launch time): every launch of a collective program must
    happen on every rank."""
    runs = {name: (lambda fn=fn: fn(args)) for name, fn in impls.items()}
    one_launch = {name: timing.calibrate(run, warmup=2) for name, run in runs.items()}
    slowest = max(one_launch.values())
    launches = timing.launches_for(agree(slowest) if agree else slowest, MIN_LAUNCHES,
                                    MIN_SAMPLE_S)
    samples = {name: [] for name in impls}
    for _ in range(repeats):
        for name, run in runs.items():
            per_call_us = timing.measure(run, calls, launches, 1)[0]
            samples[name].append(per_call_us * 1e-6)
    return {name: (statistics.median(s), one_launch[name] / calls) for name, s in samples.items()}


def bench_norm(args):
    import jax_ar
    from jax_ar.tools.baselines import xla_rms_norm as reference

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
    print(f"{'hidden':>6} {'tokens':>6} {'jax_ar us':>10} {'xla us':>10} {'xla/jax_ar':>10} "
          f"{'jax_ar TB/s':>11} {'% copy':>7} {'dev jax_ar':>10} {'dev xla':>8} "
          f"{'dev ratio':>9} {'chains':>6} {'calls':>5}")
    rows = []
    ours = lambda x, r, g: tuple(jax_ar.rms_norm(x, g, eps=EPS, residual=r))
    xla = lambda x, r, g: tuple(reference(x, g, EPS, r))
    for hidden in args.hidden:
        for tokens in args.tokens:
            moved = 4 * tokens * hidden * 2
            chains, calls = plan(moved, max(4e-6, moved / copy_bps))
            states, gamma = norm_inputs(jax.random.key(tokens + hidden), chains, tokens, hidden)
            impls = {name: chained(lambda x, r, impl=impl: impl(x, r, gamma), chains, calls)
                     for name, impl in (("jax_ar", ours), ("xla", xla))}
            timed = pipelined(impls, states, calls, args.repeats)
            seconds = {name: t[0] for name, t in timed.items()}
            device_s = {name: timing.device_time_per_call(lambda fn=fn: fn(states), calls)
                        for name, fn in impls.items()}
            row = dict(hidden=hidden, tokens=tokens, bytes=moved, chains=chains, calls=calls,
                       jax_ar_us=seconds["jax_ar"] * 1e6, xla_us=seconds["xla"] * 1e6,
                       jax_ar_one_launch_us=timed["jax_ar"][1] * 1e6,
                       xla_one_launch_us=timed["xla"][1] * 1e6,
                       jax_ar_tbps=moved / seconds["jax_ar"] / 1e12,
                       xla_tbps=moved / seconds["xla"] / 1e12)
            row["percent_of_copy"] = 100 * moved / seconds["jax_ar"] / copy_bps
            row["xla_over_jax_ar"] = seconds["xla"] / seconds["jax_ar"]
            for name, (kernel_s, kernels) in device_s.items():
                row[f"{name}_device_us"] = None if kernel_s is None else kernel_s * 1e6
                row[f"{name}_kernels_per_call"] = kernels
            if row["jax_ar_device_us"] and row["xla_device_us"]:
                row["device_xla_over_jax_ar"] = row["xla_device_us"] / row["jax_ar_device_us"]
            rows.append(row)
            device_text = (f"{row['jax_ar_device_us']:>10.2f} {row['xla_device_us']:>8.2f} "
                           f"{row['device_xla_over_jax_ar']:>9.2f}"
                           if "device_xla_over_jax_ar" in row else f"{'n/a':>10} {'n/a':>8} {'':>9}")
            print(f"{hidden:>6} {tokens:>6} {row['jax_ar_us']:>10.2f} {row['xla_us']:>10.2f} "
                  f"{row['xla_over_jax_ar']:>10.2f} {row['jax_ar_tbps']:>11.3f} "
                  f"{row['percent_of_copy']:>7.1f} {device_text} {chains:>6} {calls:>5}",
                  flush=True)
    large = [r["percent_of_copy"] for r in rows if r["tokens"] >= 8192]
    if large:
        print(f"# target >= 90% of copy bandwidth for tokens >= 8192: worst {min(large):.1f}% -> "
              f"{'met' if min(large) >= 90 else 'NOT met'}")
    worst_ratio = min(r["xla_over_jax_ar"] for r in rows)
    print(f"# target never slower than XLA's fusion, time per call: worst xla/jax_ar "
          f"{worst_ratio:.2f} -> {'met' if worst_ratio >= 1.0 else 'NOT met'}")
    device_rows = [r for r in rows if "device_xla_over_jax_ar" in r]
    if device_rows:
        worst = min(device_rows, key=lambda r: r["device_xla_over_jax_ar"])
        print(f"# kernel time per call (profiler, gaps between kernels excluded): worst xla/jax_ar "
              f"{worst['device_xla_over_jax_ar']:.2f} at hidden {worst['hidden']}, "
              f"{worst['tokens']} tokens ({worst['jax_ar_device_us']:.2f} us vs "
              f"{worst['xla_device_us']:.2f} us in {worst['xla_kernels_per_call']:.0f} kernels)")
    return dict(part="rms_norm", device=device.device_kind, jax=jax.__version__,
                date=datetime.date.today().isoformat(), copy_tbps=copy_bps / 1e12,
                memcpy_tbps=memcpy_bps / 1e12, add_tbps=add_bps / 1e12, rows=rows)


def bench_fused(args):
    import jax_ar
    from jax.sharding import NamedSharding, PartitionSpec as P
    from jax_ar.tools.baselines import fused_norm_unavailable

    mesh = jax.make_mesh((jax.device_count(),), ("tp",))
    comm = jax_ar.setup(mesh, "tp")
    me = jax.process_index()
    say = (lambda *a: print(*a, flush=True)) if me == 0 else (lambda *a: None)
    reason = fused_norm_unavailable(comm)
    if reason:
        say(f"# fused all_reduce_rms_norm benchmark skipped: {reason}")
        comm.close()
        return dict(part="fused", skipped=reason)
    say(f"# all_reduce_rms_norm (fused) vs all_reduce + rms_norm, bfloat16, "
        f"{comm.world_size} ranks on {jax.devices()[0].device_kind}; jax {jax.__version__}; "
        f"{datetime.date.today().isoformat()}")
    say(f"{'hidden':>6} {'tokens':>6} {'fused us':>9} {'separate us':>11} {'separate/fused':>14}")
    world = comm.world_size
    # One id for this run's key-value entries, the same on every rank.
    run_id = timing.gather("rms_norm_bench", "run_id", uuid.uuid4().hex, 300)[0]
    def fused_algorithm(x):
        """The fused kernel's protocol as the table picks it (algorithm="auto"
        may run the pair instead, which is the other column)."""
        path = jax_ar.selection.choose_norm_path(comm, x.size * x.dtype.itemsize,
                                                 ("fused_oneshot", "fused_twoshot"))
        return path[len("fused_"):]

    steps = {
        "fused": lambda x, r, g: (*jax_ar.all_reduce_rms_norm(
            x, r, g, "tp", eps=EPS, algorithm=fused_algorithm(x)), g),
        "separate": lambda x, r, g: (*jax_ar.rms_norm(jax_ar.all_reduce(x, "tp"), g, eps=EPS,
                                                      residual=r), g),
    }
    calls = 32
    rows = []
    for hidden in args.hidden:
        for tokens in FUSED_TOKENS:
            # make_array_from_callback, not device_put: device_put checks
            # that processes agree through a collective, which NCCL refuses
            # for ranks sharing a GPU.
            rng = np.random.default_rng(0)
            x = rng.standard_normal((world * tokens, hidden)).astype(jnp.bfloat16)
            x = jax.make_array_from_callback(x.shape, NamedSharding(mesh, P("tp")),
                                             lambda idx, x=x: x[idx])
            replicated = NamedSharding(mesh, P())
            residual = jax.make_array_from_callback(
                (tokens, hidden), replicated,
                lambda idx: np.ones((tokens, hidden), jnp.bfloat16)[idx])
            g = jax.make_array_from_callback((hidden,), replicated,
                                             lambda idx: np.ones((hidden,), jnp.bfloat16)[idx])
            programs = {name: timing.chained(step, mesh, "tp", calls, n_args=3)
                        for name, step in steps.items()}
            impls = {name: (lambda a, fn=fn: fn(*a)) for name, fn in programs.items()}
            case = f"{hidden}/{tokens}"
            agree = lambda seconds: max(timing.gather(run_id, case, seconds, 300))
            timed = pipelined(impls, (x, residual, g), calls, args.repeats, agree=agree)
            row = dict(hidden=hidden, tokens=tokens, fused_us=timed["fused"][0] * 1e6,
                       separate_us=timed["separate"][0] * 1e6)
            rows.append(row)
            say(f"{hidden:>6} {tokens:>6} {row['fused_us']:>9.2f} {row['separate_us']:>11.2f} "
                f"{row['separate_us'] / row['fused_us']:>14.2f}")
    comm.check()
    comm.close()
    return dict(part="fused", world=world, rows=rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fused", action="store_true",
                        help="the fused all-reduce part (run under jax_ar launch, MPS started)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--hidden", type=int, nargs="+", default=list(HIDDEN),
                        help="hidden sizes (default: %(default)s)")
    parser.add_argument("--tokens", type=int, nargs="+", default=TOKENS,
                        help="token counts of the rms_norm part (default: 1 .. 32768)")
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
