"""One rank of a diagnostic: large all_reduce calls whose wrong elements say
where their values came from. Run it under the launcher:

    python -m jax_ar launch -n 2 experiments/big_all_reduce.py [MIB] [CALLS] [ALGORITHMS]

(defaults 128 MiB per rank, 5 calls, "oneshot,twoshot"). Written after the
2026-12-07 suite run, where tests/test_ops_fuzz.py's 128 MiB one-shot sum
came back wrong on both ranks with no error (docs/latency_log.md
"forty-third push"): that case's random data says only that values are
wrong. Here rank r holds x[i] = i % 2^16 + r * 2^17 (exact in float32 for
up to 8 ranks), so the right sum is world * (i % 2^16) + 2^17 * (0 + 1 +
... + world - 1), and a wrong value is decoded as the right sum of
another element, one rank's own value, or neither. Each rank prints, per
call, how many elements are wrong, the first few with their decoding, and
the runs of wrong elements (first and last index, in MiB of the rank's
data), and what the communicator recorded (`comm.check()`: a deadline
that passed, for instance, leaves its call's outputs undefined and fills
later calls' with all-ones bits, docs/guarantees.md); it exits 1 if any
call was wrong.
"""
import sys

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_ar

PERIOD = 1 << 16
RANK_STEP = 1 << 17
SHOWN = 5


def rank_values(rank, elements):
    return (np.arange(elements, dtype=np.int64) % PERIOD + rank * RANK_STEP).astype(np.float32)


def ranks_offset(world):
    """What the ranks' offsets add to every element's sum: RANK_STEP * (0 +
    1 + ... + world - 1)."""
    return RANK_STEP * world * (world - 1) // 2


def right_sums(elements, world):
    """The right sum of each of `elements` elements, as float32."""
    index = np.arange(elements, dtype=np.int64)
    return (world * (index % PERIOD) + ranks_offset(world)).astype(np.float32)


def decode(value, world):
    """What a wrong float32 `value` looks like, in words: not finite, not an
    integer, the right sum of an element j (j % 2^16 named), one rank's own
    value of an element j, or neither."""
    if not np.isfinite(value):
        return "not finite (a launch that did not run fills all-ones bits)"
    if not float(value).is_integer():
        return "not an integer: no rank's value or sum"
    v = int(value)
    base = ranks_offset(world)
    if (v - base) % world == 0 and 0 <= (v - base) // world < PERIOD:
        return f"the sum of an element j with j % 2^16 = {(v - base) // world}"
    if 0 <= v % RANK_STEP < PERIOD and 0 <= v // RANK_STEP < world:
        return f"rank {v // RANK_STEP}'s own value of an element j with j % 2^16 = {v % RANK_STEP}"
    return "neither a sum nor one rank's value"


def runs_of(wrong_index, limit=8):
    """([(first, last)] of the first `limit` runs of consecutive indices in
    the non-empty `wrong_index`, how many runs there are)."""
    breaks = np.nonzero(np.diff(wrong_index) != 1)[0]
    firsts = np.concatenate([[wrong_index[0]], wrong_index[breaks + 1]])
    lasts = np.concatenate([wrong_index[breaks], [wrong_index[-1]]])
    return list(zip(firsts[:limit], lasts[:limit])), len(firsts)


def failure_of(comm):
    """The first line of what `comm` recorded as its failure, or None."""
    try:
        comm.check()
    except jax_ar.JaxArError as e:
        return str(e).splitlines()[0]
    return None


def main(argv):
    mib = int(argv[0]) if len(argv) > 0 else 128
    calls = int(argv[1]) if len(argv) > 1 else 5
    algorithms = (argv[2] if len(argv) > 2 else "oneshot,twoshot").split(",")
    world = jax.device_count()
    rank = jax.process_index()
    mesh = jax.make_mesh((world,), ("tp",))
    comm = jax_ar.setup(mesh, "tp")
    elements = (mib << 20) // 4
    local = rank_values(rank, elements)
    (device,) = jax.local_devices()
    x = jax.make_array_from_single_device_arrays(
        (world * elements,), NamedSharding(mesh, P("tp")), [jax.device_put(local, device)])
    want = right_sums(elements, world)
    bad_calls = 0
    for algorithm in algorithms:
        f = jax.jit(jax.shard_map(lambda v: jax_ar.all_reduce(v, "tp", algorithm=algorithm),
                                  mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))
        for call in range(calls):
            label = f"rank {rank} {algorithm} {mib} MiB call {call}"
            try:
                got = np.asarray(f(x).addressable_shards[0].data)
            except Exception as e:  # a failed communicator's later calls raise
                bad_calls += 1
                print(f"{label}: raised {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
                continue
            wrong = np.nonzero(got != want)[0]
            if wrong.size == 0:
                print(f"{label}: right", flush=True)
                continue
            bad_calls += 1
            runs, count = runs_of(wrong)
            print(f"{label}: {wrong.size} of {elements} elements wrong, in {count} runs; first "
                  "runs (MiB of this rank's data): " +
                  ", ".join(f"{a * 4 / 2**20:.4f}-{(b + 1) * 4 / 2**20:.4f}" for a, b in runs),
                  flush=True)
            for i in wrong[:SHOWN]:
                print(f"  element {i}: got {got[i]!r}, want {want[i]!r}: "
                      f"{decode(got[i], world)}", flush=True)
            print(f"  communicator: {failure_of(comm) or 'no failure recorded'}", flush=True)
    comm.close()
    if bad_calls:
        print(f"rank {rank}: {bad_calls} wrong calls", flush=True)
        sys.exit(1)
    print(f"rank {rank}: every call right", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
