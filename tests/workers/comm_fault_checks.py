"""Helpers of the fault workers: run a call that is expected to fail, and
check what every rank sees.

On CPU devices a failing call raises itself. On GPUs a kernel that fails
records the failure in host-mapped memory and the error comes from the next
call or from comm.check(), so `attempt` always asks comm.check() too.
"""
from __future__ import annotations

import os
import time

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_ar
from common import assert_bitwise_equal, emulate_all_reduce, global_array, local_shards, log

ON_GPU = os.environ.get("JAX_AR_TEST_PLATFORM", "cpu") == "gpu"
# A failure that jax_ar propagates (a peer that disagrees, failed, closed or
# died) must reach every rank well before any deadline; on GPUs a closed or
# dead peer is noticed only at the kernel's deadline.
PROMPT_S = 3.0
# How every failure message of both backends ends (cuda/common/failure_text.h).
ADVICE = "The communicator is unusable until close() and a new setup()."


def me() -> int:
    return jax.process_index()


def last_process() -> int:
    return jax.process_count() - 1


def tp_mesh():
    return jax.make_mesh((jax.device_count(),), ("tp",))


def reducer(mesh, op="sum", algorithm="auto", leaves=1):
    """jit(shard_map(all_reduce)) over "tp" of `leaves` arrays sharded on dim
    0, reduced together in one call (a tuple pytree)."""
    def body(*xs):
        return tuple(jax_ar.all_reduce(xs, "tp", op=op, algorithm=algorithm))

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=tuple(P("tp") for _ in range(leaves)),
                                 out_specs=tuple(P() for _ in range(leaves))))


def sharded(mesh, rows_per_rank, dtype=np.float32, seed=0):
    """A global array of integer-valued data, `rows_per_rank` elements per rank."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-8, 9, size=(jax.device_count() * rows_per_rank,)).astype(dtype)
    return x, global_array(x, mesh, P("tp"))


def attempt(comm, fn):
    """Runs fn() to completion, then comm.check(). Returns (exception or
    None, seconds taken)."""
    start = time.monotonic()
    try:
        jax.block_until_ready(fn())
        comm.check()
    except Exception as e:  # jax's runtime error, JaxArError, ...
        return e, time.monotonic() - start
    return None, time.monotonic() - start


def expect_failure(comm, fn, what, must_name=(), within_s=PROMPT_S, at_least_s=0.0):
    """fn() (plus comm.check()) must fail with a message naming jax_ar,
    ending with what to do (ADVICE), and naming every string of `must_name`,
    within `within_s` seconds (and not before `at_least_s`). Returns the
    message."""
    error, took = attempt(comm, fn)
    assert error is not None, f"{what}: returned a result; expected an error"
    text = str(error)
    assert "jax_ar" in text, f"{what}: error does not name jax_ar: {text}"
    for fragment in (ADVICE, *must_name):
        assert fragment in text, f"{what}: error does not mention {fragment!r}: {text}"
    assert at_least_s <= took <= within_s, \
        f"{what}: error after {took:.2f} s, expected within [{at_least_s}, {within_s}] s: {text}"
    log(f"{what}: failed as expected after {took:.2f} s: {text.splitlines()[0][:300]}")
    return text


def expect_check_fails(comm, what, must_name=()):
    try:
        comm.check()
    except jax_ar.JaxArError as e:
        for fragment in must_name:
            assert fragment in str(e), f"{what}: check() does not mention {fragment!r}: {e}"
        return
    raise AssertionError(f"{what}: comm.check() passed on a failed communicator")


def check_fresh_results(mesh, seed, what, op="sum", rows_per_rank=37):
    """After close() + setup(): a call on new data returns exactly the new
    reduction (old data from a failed call would not match)."""
    x, xs = sharded(mesh, rows_per_rank, seed=seed)
    out, = reducer(mesh, op=op)(xs)
    want = emulate_all_reduce(np.split(x, jax.device_count()), op)
    for device, _, data in local_shards(out):
        assert_bitwise_equal(data, want, f"{what} on {device}")
    log(f"{what}: correct results")
