"""Timing that measures the device, not the dispatcher.

One jitted program runs a chain of K calls, each taking the previous call's
result as its input. That data dependency is what keeps XLA from merging
the calls (CSE, the all-reduce combiner) or dropping them; an
optimization_barrier does not (seen on XLA:CPU: the barrier is expanded
away and K psums are combined into one). No glue runs between the calls, so
nothing but the all-reduces is timed, and there is no fori_loop/while in
the program (on the H200 machine each loop iteration cost ~9 us of its own).
The compiled HLO is checked to hold K collectives before anything is timed.

A sample launches the program L times back to back (dispatch is
asynchronous, so only the first launch's host overhead is exposed) and
blocks once: per call = wall time / (L * K). L is chosen after warm-up from
one timed launch (the slowest rank's), so that a sample lasts at least a
few milliseconds; warm-up is not timed; the reported figure is the median
of the samples.
"""
from __future__ import annotations

import glob
import json
import os
import re
import statistics
import tempfile
import time

import jax
from jax.sharding import PartitionSpec as P

from .. import _compat

__all__ = ["calibrate", "calls_for", "chained", "chained_to_count", "chained_to_count_ends",
           "count_collectives", "device_time_per_call", "gather", "launches_for", "measure",
           "typical_spread"]


def calls_for(config: dict, nbytes: int) -> int:
    """Calls to chain for a message of `nbytes` a rank: config["iters"],
    or, where config["chain_bytes"] caps a default chain (sweep.py), as
    many as move that many bytes, at least config["chain_least"]."""
    cap = config.get("chain_bytes")
    if not cap:
        return config["iters"]
    return min(config["iters"], max(config["chain_least"], cap // max(nbytes, 1)))


def _run_chain(step, axis: str, chain: int, args):
    """`chain` calls of step(*args) -> args', each call's (invariant)
    results marked varying again and fed to the next one."""
    for k in range(chain):
        if k:
            args = (_compat.pcast_to_varying(args[0], (axis,)),) + tuple(args[1:])
        args = step(*args)
    return args


def chained(step, mesh, axis: str, chain: int, n_args: int = 1):
    """jit(shard_map) of `chain` calls of step(*args) -> args' (_run_chain),
    returning the last call's results. Inputs are sharded over `axis`
    except where step needs them replicated: every argument after the first
    is replicated (residual, gamma)."""
    in_specs = (P(axis),) + (P(),) * (n_args - 1)
    out_specs = (P(),) * n_args
    return jax.jit(jax.shard_map(lambda *args: _run_chain(step, axis, chain, args), mesh=mesh,
                                 in_specs=in_specs, out_specs=out_specs))


def chained_to_count(step, mesh, axis: str, chain: int, count_wrong, n_args: int = 1,
                     n_wants: int = 1):
    """`chained`'s chain whose only output is each rank's count of wrong
    elements: program(*args, *wants) -> int32 [world] sharded over `axis`;
    count_wrong(results, wants) -> int32 scalar; the `n_wants` wants
    (host references of the results) are replicated.

    Why not the results themselves: XLA places the chain's values in the
    program's output buffers where their sizes match (every other call's,
    in a chain of two results), and those buffers move at every launch.
    XLA then records the launch's command buffer again, tracing each FFI
    call whose buffers moved through its handler (cached by address, 16
    traces a call), and bench's launches ran host-bound: all_reduce_rms_norm
    at 16 KB and 2 ranks took 10.6 us a call in bench (300 calls a program)
    and 5.8 with the count alone, whose chain stays in the temporary
    buffer, as a model's layers' values do (one H100 under MPS, 2026-12-06,
    docs/latency_log.md "thirty-seventh push")."""
    def count(args, wants):
        return count_wrong(_run_chain(step, axis, chain, args), wants)

    return _count_program(count, mesh, axis, n_args, n_wants)


def chained_to_count_ends(step, mesh, axis: str, chain: int, count_first, count_last,
                          n_args: int = 1, n_wants: int = 1):
    """chained_to_count for a chain that no host emulation can follow: the
    first call's results are counted against the wants (the host's
    emulation of that one call), count_first(results, wants), and the last
    call's against its own inputs, count_last(results, inputs) (a reference
    taken on the device), both int32 scalars; chains of one call count the
    first only. A call in between is checked only through the inputs it
    leaves the next call: a mistake it makes alike on every rank goes
    uncounted.

    Why not the chain's end against the host's emulation of the whole
    chain: where a call rounds (all_reduce_rms_norm: the inverse RMS in
    float32, within 2 ulp, against the host's float64), a correct kernel
    and the emulation differ by one rounding at a few elements, and a chain
    that carries each call's residual_out on keeps those differences and
    adds new ones. On one H100 (4 ranks, hidden 4096, bfloat16, 8 MB) the
    fused kernels differed from the emulation at 69 elements after one
    call and at 1,829 after 57, 12 of them beyond bench's tolerance (the
    residual stream there near 300, whose rounding is 2); all_reduce then
    rms_norm, whose inverse RMS is the host's formula, stayed within it
    (docs/latency_log.md "forty-sixth push")."""
    def count(args, wants):
        results = step(*args)
        wrong = count_first(results, wants)
        for _ in range(chain - 1):
            args = (_compat.pcast_to_varying(results[0], (axis,)),) + tuple(results[1:])
            results = step(*args)
        return wrong + count_last(results, args) if chain > 1 else wrong

    return _count_program(count, mesh, axis, n_args, n_wants)


def _count_program(count, mesh, axis: str, n_args: int, n_wants: int):
    """jit(shard_map) of count(args, wants) -> int32 scalar, returning each
    rank's count as one element of an int32 [world] sharded over `axis`;
    the first argument is sharded over `axis`, the other arguments and the
    wants replicated."""
    def body(*inputs):
        # Each rank's own count: varying over the axis, one element a rank.
        wrong = count(inputs[:n_args], inputs[n_args:]) + 0 * jax.lax.axis_index(axis)
        return wrong.reshape(1)

    in_specs = (P(axis),) + (P(),) * (n_args - 1) + (P(),) * n_wants
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=P(axis)))


_CUSTOM_CALL = re.compile(r'custom_call_target="jax_ar_')
_ALL_REDUCE = re.compile(r"\ball-reduce(?:-start)?\(")


def count_collectives(hlo_text: str) -> int:
    """jax_ar custom calls plus XLA all-reduces in compiled HLO text."""
    return len(_CUSTOM_CALL.findall(hlo_text)) + len(_ALL_REDUCE.findall(hlo_text))


def calibrate(run, warmup: int) -> float:
    """Seconds one launch of `run()` takes after `warmup` launches."""
    out = None
    for _ in range(max(1, warmup)):
        out = run()
    jax.block_until_ready(out)
    start = time.perf_counter()
    jax.block_until_ready(run())
    return time.perf_counter() - start


def measure(run, chain: int, launches: int, repeats: int):
    """(median us per call, samples, last result): `repeats` samples of
    `launches` back-to-back launches of `run()`, a program of `chain` calls.
    Every rank must pass the same numbers: each launch is collective."""
    samples, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(launches):
            out = run()
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) * 1e6 / (launches * chain))
    return statistics.median(samples), samples, out


def device_time_per_call(run, chain: int, launches: int = 3):
    """(GPU kernel seconds per call, kernels per call) over `launches`
    launches of `run()`, a program of `chain` calls, from a jax.profiler
    trace: the durations of the kernels on the GPU's stream lines, summed.
    Host work and the gaps between kernels are not in it, so it compares
    what the kernels themselves cost. (None, 0) where the trace holds no GPU
    kernels (CPU devices)."""
    jax.block_until_ready(run())
    with tempfile.TemporaryDirectory() as folder:
        jax.profiler.start_trace(folder)
        try:
            out = None
            for _ in range(launches):
                out = run()
            jax.block_until_ready(out)
        finally:
            jax.profiler.stop_trace()
        files = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
        if not files:
            return None, 0
        profile = jax.profiler.ProfileData.from_file(files[0])
    total_ns, kernels = 0, 0
    for plane in profile.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if "Stream" not in line.name:  # not the derived "XLA Ops"-style lines
                continue
            for event in line.events:
                total_ns += event.duration_ns
                kernels += 1
    if not kernels:
        return None, 0
    calls = launches * chain
    return total_ns * 1e-9 / calls, kernels / calls


def launches_for(launch_s: float, min_launches: int, min_sample_s: float,
                 max_launches: int = 1000) -> int:
    """Launches per sample so that a sample lasts at least `min_sample_s`:
    short samples are at the mercy of the OS scheduler."""
    wanted = int(min_sample_s / max(launch_s, 1e-7)) + 1
    return max(min_launches, min(max_launches, wanted))


def gather(run_id: str, name: str, value, timeout_s: float):
    """Every process's `value` (JSON-able), by process index, through the
    jax.distributed key-value store: how ranks agree on a launch count
    without a collective (NCCL refuses ranks that share a GPU)."""
    client = _compat.distributed_client()
    me = jax.process_index()
    if client is None or jax.process_count() == 1:
        return [value]
    client.key_value_set(f"jax_ar_bench/{run_id}/{name}/{me}", json.dumps(value))
    return [json.loads(client.blocking_key_value_get(f"jax_ar_bench/{run_id}/{name}/{p}",
                                                     int(timeout_s * 1000)))
            for p in range(jax.process_count())]


def typical_spread(results) -> float | None:
    """Median over timed cases of (75th - 25th percentile) / median of their
    samples: how much the machine disturbed the timing. None where no case
    has the 3 samples a spread needs (--repeats 1 or 2): not estimated,
    which is not the same as no noise."""
    spreads = []
    for r in results:
        samples = sorted(r.get("samples") or [])
        if r["status"] == "ok" and len(samples) >= 3:
            q25, q50, q75 = (statistics.quantiles(samples, n=4, method="inclusive"))
            spreads.append((q75 - q25) / q50)
    return statistics.median(spreads) if spreads else None
