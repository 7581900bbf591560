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
blocks once: per call = wall time / (L * K). Warm-up launches come first and
are not timed; the reported figure is the median of the samples.
"""
from __future__ import annotations

import re
import statistics
import time

import jax
from jax.sharding import PartitionSpec as P

from . import _compat

__all__ = ["chained", "count_collectives", "measure", "psum_like"]


def psum_like(x, axis: str, op: str):
    reduce = {"sum": jax.lax.psum, "avg": jax.lax.pmean, "max": jax.lax.pmax,
              "min": jax.lax.pmin}[op]
    return reduce(x, axis)


def chained(step, mesh, axis: str, chain: int, n_args: int = 1):
    """jit(shard_map) of `chain` calls of step(*args) -> args', each call's
    (invariant) results marked varying again and fed to the next one.
    Inputs are sharded over `axis` except where step needs them replicated:
    every argument after the first is replicated (residual, gamma)."""
    def body(*args):
        for k in range(chain):
            if k:
                args = (_compat.pcast_to_varying(args[0], (axis,)),) + tuple(args[1:])
            args = step(*args)
        return args

    in_specs = (P(axis),) + (P(),) * (n_args - 1)
    out_specs = (P(),) * n_args
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs))


_CUSTOM_CALL = re.compile(r'custom_call_target="jax_ar_')
_ALL_REDUCE = re.compile(r"\ball-reduce(?:-start)?\(")


def count_collectives(hlo_text: str) -> int:
    """jax_ar custom calls plus XLA all-reduces in compiled HLO text."""
    return len(_CUSTOM_CALL.findall(hlo_text)) + len(_ALL_REDUCE.findall(hlo_text))


def measure(run, chain: int, warmup: int, repeats: int, launches: int):
    """(median us per call, samples, last result) of `run()`, a launch of a
    program that chains `chain` calls."""
    out = None
    for _ in range(max(1, warmup)):
        out = run()
    jax.block_until_ready(out)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(launches):
            out = run()
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) * 1e6 / (launches * chain))
    return statistics.median(samples), samples, out
