"""One rank of the load test. Usage: ops_load.py ITERATIONS

One jitted program makes ITERATIONS x len(CALLS) back-to-back all-reduces of
mixed sizes, dtypes, ops and algorithms (a lax.scan whose body makes one of
each). Every rank's input to every call is a function of the rank, the call
and the running state, and the running state is a function of the previous
results, so calls depend on each other and no two consecutive calls of one
kind carry the same data (a stale buffer would show).

Every result is checked inside the program against a reduction written in
plain XLA ops over all ranks' inputs in rank order (jax_ar's arithmetic);
the program counts mismatches and keeps the first. It also folds every
result into a digest, which must be equal on all processes and equal to the
digest of the same sequence simulated in numpy on the host.
"""
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

import jax_ar
from common import emulate_all_reduce, log, main_guard, same_on_all_processes
from comm_fault_checks import tp_mesh

# (elements, dtype, op, algorithm) of each call of one iteration.
CALLS = [
    (3, np.float32, "sum", "oneshot"),
    (1000, jnp.bfloat16, "sum", "twoshot"),
    (64, np.int32, "max", "auto"),
    (257, np.float16, "avg", "oneshot"),
    (4099, np.float32, "min", "twoshot"),
]
DIGEST_MULTIPLIER = 1000003


def bases(n):
    """[rank, elements] integer-valued base data of each call."""
    rng = np.random.default_rng(2024)
    return [rng.integers(-8, 9, size=(n, size)).astype(np.float32) for size, *_ in CALLS]


def as_bits(y):
    """The bits of `y` as uint32 (16-bit types zero-extended)."""
    if y.dtype.itemsize == 2:
        return lax.bitcast_convert_type(y, jnp.uint16).astype(jnp.uint32)
    return lax.bitcast_convert_type(y, jnp.uint32)


def reference(inputs, op, n):
    """jax_ar's arithmetic in plain XLA ops: rank order, float32 accumulation
    for 16-bit floats and one rounding, wrapping int32 sums."""
    dtype = inputs[0].dtype
    wide = jnp.int32 if dtype == jnp.int32 else jnp.float32
    acc = inputs[0].astype(wide)
    for x in inputs[1:]:
        x = x.astype(wide)
        acc = acc + x if op in ("sum", "avg") else (jnp.maximum(acc, x) if op == "max"
                                                      else jnp.minimum(acc, x))
    if op == "avg":
        acc = acc.astype(jnp.float32) / jnp.float32(n)
        return acc if dtype == jnp.int32 else acc.astype(dtype)
    return acc.astype(dtype)


def rank_inputs(base, state, call, dtype):
    """Every rank's input to `call` given the running state: [n, elements]."""
    shift = (state.astype(jnp.int32) + call) % 5 - 2  # changes every iteration
    return (jnp.asarray(base) + shift.astype(jnp.float32)).astype(dtype)


def make_program(mesh, iterations):
    n = jax.device_count()
    base_data = bases(n)

    def body(carry, _):
        state, digest, mismatches, first_bad, step = carry
        rank = lax.axis_index("tp")
        for c, (size, dtype, op, algorithm) in enumerate(CALLS):
            everyone = rank_inputs(base_data[c], state, c, dtype)
            y = jax_ar.all_reduce(everyone[rank], "tp", op=op, algorithm=algorithm)
            want = reference([everyone[r] for r in range(n)], op, n)
            bad = jnp.any(as_bits(y) != as_bits(want))
            first_bad = jnp.where(bad & (first_bad < 0), step * len(CALLS) + c, first_bad)
            mismatches = mismatches + bad.astype(jnp.int32)
            digest = digest * jnp.uint32(DIGEST_MULTIPLIER) + jnp.sum(as_bits(y))
            # The next inputs depend on this result.
            state = (state + as_bits(y)[0] % 1000) % 1000
        return (state, digest, mismatches, first_bad, step + 1), None

    def program():
        init = (jnp.uint32(0), jnp.uint32(0), jnp.int32(0), jnp.int32(-1), jnp.int32(0))
        out, _ = lax.scan(body, init, None, length=iterations)
        state, digest, mismatches, first_bad, _ = out
        return state, digest, mismatches, first_bad

    return jax.jit(jax.shard_map(program, mesh=mesh, in_specs=(), out_specs=P(),
                                 check_vma=False))


def simulate(n, iterations):
    """The same sequence in numpy (common.emulate_all_reduce): final state
    and digest."""
    base_data = bases(n)
    state, digest = 0, 0
    for _ in range(iterations):
        for c, (size, dtype, op, _) in enumerate(CALLS):
            shift = (state + c) % 5 - 2
            everyone = (base_data[c] + np.float32(shift)).astype(dtype)
            y = np.asarray(emulate_all_reduce(list(everyone), op))
            bits = y.view(np.uint16 if y.dtype.itemsize == 2 else np.uint32).astype(np.uint64)
            digest = (digest * DIGEST_MULTIPLIER + int(bits.sum())) % 2**32
            state = (state + int(bits[0]) % 1000) % 1000
    return state, digest


def main(argv):
    iterations = int(argv[0])
    mesh = tp_mesh()
    comm = jax_ar.setup(mesh, "tp")
    n = jax.device_count()
    program = make_program(mesh, iterations)
    start = time.monotonic()
    compiled = program.lower().compile()
    compiled_at = time.monotonic()
    calls = iterations * len(CALLS)
    want_state, want_digest = simulate(n, iterations)
    # Twice: the second run starts where the first left the epochs, and must
    # give the same bits (determinism across runs).
    for run in range(2):
        run_start = time.monotonic()
        state, digest, mismatches, first_bad = (np.asarray(v) for v in compiled())
        took = time.monotonic() - run_start
        log(f"run {run}: {calls} all-reduces over {n} ranks in {took:.2f} s "
            f"({took / calls * 1e6:.0f} us per call; compile {compiled_at - start:.1f} s)")
        assert int(mismatches) == 0, \
            f"{int(mismatches)} of {calls} results wrong; the first is call {int(first_bad)}"
        same_on_all_processes(f"load/{run}", [digest, state])
        assert (int(state), int(digest)) == (want_state, want_digest), \
            f"digest {int(digest)} / state {int(state)}, numpy says {want_digest} / {want_state}"
    comm.check()
    comm.close()
    log(f"load-check ok: {calls} results exact and equal on every rank")
    sys.stdout.flush()


if __name__ == "__main__":
    main_guard(main)
