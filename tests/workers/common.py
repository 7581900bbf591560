"""Helpers shared by the test workers (each runs as one rank of a launch).

References are computed on the host in numpy. `emulate_all_reduce` follows
jax_ar's documented arithmetic exactly (rank order 0..N-1, float32
accumulation for 16-bit floats, one rounding at the end, wrapping int32
sums), so results can be compared bit for bit; `reference_float64` is the
independent float64 reference every result must also be close to.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys

import jax
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding

DTYPES = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
    "int32": np.dtype(np.int32),
}
OPS = ("sum", "avg", "max", "min")


def log(*args):
    print(f"[process {jax.process_index()}]", *args, flush=True)


@contextlib.contextmanager
def environment(name: str, value: str | None):
    """The environment variable `name` set to `value` (None: unset) inside
    the block, and as it was after it."""
    saved = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


class Records(logging.Handler):
    """Collects the messages of the log records it handles (added to the
    "jax_ar" logger by the workers that check what jax_ar logs)."""

    def __init__(self, level=logging.NOTSET):
        super().__init__(level)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def global_array(x: np.ndarray, mesh, spec) -> jax.Array:
    """The global array `x` laid out over `mesh` by `spec`, from host data
    every process holds (a process may hold none of it: a submesh of other
    processes' devices, hence the dtype)."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda idx: x[idx],
                                        dtype=x.dtype)


def norm_auto_takes_pair(comm, shape, dtype, residual_dtype, plain=True) -> bool:
    """Whether all_reduce_rms_norm(algorithm="auto") over `comm` runs x of
    `shape` and `dtype` as jax_ar.all_reduce then jax_ar.rms_norm (the pair,
    whose sum is rounded to x's dtype before the residual is added): where
    the fused kernel and the pair both could serve it (`plain`: no FP8
    output, post-norm or bias), the cost table's choice."""
    import jax_ar
    from jax_ar import selection

    dtype, residual_dtype = np.dtype(dtype), np.dtype(residual_dtype)
    limits = jax_ar._native.limits(comm.platform)
    hidden = shape[-1]
    vector = limits["vector_bytes"] // dtype.itemsize
    fused = (limits["fused_min_hidden"] <= hidden <= limits["fused_max_hidden"]
             and hidden % vector == 0 and residual_dtype in (dtype, np.float32))
    # A row must fit one round of the workspace (a float32 residual beside
    # 16-bit x takes twice x's bytes), else the general path serves the call.
    wide = residual_dtype == np.float32 and dtype != np.float32
    fused = fused and hidden * dtype.itemsize <= comm.capacity_bytes(
        "max_fused_row_bytes_f32_residual" if wide else "max_fused_row_bytes")
    if not (fused and plain) or not int(np.prod(shape)) or dtype == np.float16:
        return False  # (float16: the pair's rounded sum could overflow)
    return selection.choose_norm_path(comm, int(np.prod(shape)) * dtype.itemsize) == "composed"


def ffi_all_reduce(comm, algorithm: str, op: str = "sum"):
    """v -> the FFI target jax_ar_all_reduce on v with the kernel `algorithm`
    names (the compiled module's numbering), whatever the cost model would
    pick: for use inside shard_map (check_vma=False)."""
    from jax_ar import _native

    attrs = dict(comm_id=np.int64(comm.comm_id), op=np.int32(_native.OP_CODES[op]),
                 algorithm=np.int32(_native.ALGORITHM_CODES[algorithm]))
    return lambda v: jax.ffi.ffi_call("jax_ar_all_reduce",
                                      jax.ShapeDtypeStruct(v.shape, v.dtype))(v, **attrs)


def local_shards(y: jax.Array):
    """[(device, index, numpy data)] of this process's shards of `y`."""
    return [(s.device, s.index, np.asarray(s.data)) for s in y.addressable_shards]


def random_values(rng, shape, dtype, integer_valued=True) -> np.ndarray:
    """Data that exercises rounding; integer-valued small numbers make sums
    exact in float32 so every dtype can also be checked against float64."""
    dtype = np.dtype(dtype)
    if dtype == np.int32:
        return rng.integers(-1000, 1000, size=shape, dtype=np.int32)
    if integer_valued:
        return rng.integers(-8, 9, size=shape).astype(dtype)
    return rng.standard_normal(size=shape).astype(np.float32).astype(dtype)


def _combine(op, a, b):
    if op in ("sum", "avg"):
        return a + b
    if np.issubdtype(a.dtype, np.integer):
        return np.maximum(a, b) if op == "max" else np.minimum(a, b)
    nan = np.isnan(a) | np.isnan(b)
    pick = np.where(np.isnan(a), a, b)
    if op == "max":
        best = np.where(a > b, a, np.where(b > a, b, np.where(np.signbit(a), b, a)))
    else:
        best = np.where(a < b, a, np.where(b < a, b, np.where(np.signbit(a), a, b)))
    return np.where(nan, pick, best)


def emulate_all_reduce(parts, op) -> np.ndarray:
    """jax_ar's exact arithmetic over `parts` (one array per rank, rank order)."""
    dtype = parts[0].dtype
    if dtype == np.int32:
        acc = parts[0].astype(np.int64)
        for p in parts[1:]:
            acc = _combine(op, acc, p.astype(np.int64))
            acc = ((acc + 2**31) % 2**32) - 2**31  # int32 wraps
        acc = acc.astype(np.int32)
        if op == "avg":
            return acc.astype(np.float32) / np.float32(len(parts))
        return acc
    with np.errstate(all="ignore"):
        acc = parts[0].astype(np.float32)
        for p in parts[1:]:
            acc = _combine(op, acc, p.astype(np.float32))
        if op == "avg":
            acc = acc / np.float32(len(parts))
        return acc.astype(dtype)


def reference_float64(parts, op) -> np.ndarray:
    stack = np.stack([p.astype(np.float64) for p in parts])
    return {"sum": stack.sum(0), "avg": stack.mean(0), "max": stack.max(0),
            "min": stack.min(0)}[op]


def assert_bitwise_equal(got: np.ndarray, want: np.ndarray, what: str):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{what}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}"
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[got.itemsize]
    bad = np.flatnonzero(got.reshape(-1).view(unsigned) != want.reshape(-1).view(unsigned))
    if bad.size:
        i = bad[0]
        raise AssertionError(f"{what}: {bad.size} of {got.size} elements differ bitwise; "
                             f"first at {i}: got {got.reshape(-1)[i]!r}, "
                             f"want {want.reshape(-1)[i]!r}")


def assert_equal_nan_aware(got: np.ndarray, want: np.ndarray, what: str):
    """Bitwise equal, except that where `want` is NaN any NaN will do (NaN
    payloads differ between CPUs and GPUs; across ranks they must not)."""
    got, want = np.asarray(got), np.asarray(want)
    nan = np.isnan(want.astype(np.float32)) if want.dtype != np.int32 else np.zeros(want.shape, bool)
    assert np.isnan(got.astype(np.float32))[nan].all(), f"{what}: NaN expected"
    assert_bitwise_equal(np.where(nan, np.zeros_like(got), got), np.where(nan, np.zeros_like(want), want),
                         what)


def assert_close_to_float64(got, parts, op, what):
    """Within the rounding of one cast to the result dtype (plus float32
    accumulation for non-integer data)."""
    ref = reference_float64(parts, op)
    got64 = np.asarray(got).astype(np.float64)
    dtype = np.asarray(got).dtype
    if dtype == np.int32:
        np.testing.assert_array_equal(got64, ref, err_msg=what)
        return
    eps = {np.dtype(np.float32): 2.0**-23, DTYPES["bfloat16"]: 2.0**-8,
           np.dtype(np.float16): 2.0**-11}[np.dtype(dtype)]
    scale = np.max(np.abs(np.stack([p.astype(np.float64) for p in parts])), axis=0) * len(parts)
    tol = 2 * eps * scale + 2 * eps * np.abs(ref) + 1e-30
    bad = np.abs(got64 - ref) > tol
    assert not bad.any(), f"{what}: {bad.sum()} elements off the float64 reference " \
                          f"(first: got {got64[bad][0]}, want {ref[bad][0]})"


def same_on_all_processes(name: str, arrays) -> None:
    """Asserts every process holds bitwise the same `arrays` (digests are
    exchanged through the jax.distributed key-value store)."""
    digest = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        digest.update(str((a.dtype, a.shape)).encode())
        digest.update(a.view(np.uint8).tobytes())
    mine = digest.hexdigest()
    if jax.process_count() == 1:
        return
    from jax_ar import _compat

    client = _compat.distributed_client()
    me = jax.process_index()
    client.key_value_set(f"test/{name}/{me}", json.dumps(mine))
    for p in range(jax.process_count()):
        theirs = json.loads(client.blocking_key_value_get(f"test/{name}/{p}", 60_000))
        assert theirs == mine, f"{name}: process {p} holds different bits than process {me}"


def expect_error(kind, fragment, fn):
    """fn() must raise `kind` whose message contains `fragment`."""
    try:
        fn()
    except kind as e:
        assert fragment in str(e), f"{kind.__name__} without {fragment!r}: {e}"
        return
    raise AssertionError(f"expected {kind.__name__} mentioning {fragment!r}")


class SuiteSkipped(Exception):
    """Raised by a suite that cannot run here (its message says why)."""


def run_suites(suites: dict, names, *args) -> None:
    """Runs suites[name](*args) for each name, in order, with one marker line
    per suite that tests/harness.py turns into that suite's test result. The
    first failure prints its traceback and stops the worker: later suites
    would run on a communicator in an unknown state."""
    names = list(names)
    log(f"@@suites planned: {' '.join(names)}")
    for name in names:
        try:
            suites[name](*args)
        except SuiteSkipped as e:
            log(f"@@suite {name} skipped: {e}")
            continue
        except BaseException:
            import traceback

            traceback.print_exc()
            sys.stdout.flush()
            log(f"@@suite {name} failed")
            raise
        log(f"@@suite {name} ok")


def suites_in(namespace: dict) -> dict:
    """{name: suite_name function} of a worker module, in definition order."""
    return {name[len("suite_"):]: fn for name, fn in namespace.items()
            if name.startswith("suite_")}


def run_communicator_suites(suites: dict, argv, workspace_bytes=None) -> None:
    """Sets up jax_ar on a 1-D "tp" mesh of every device, runs the suites
    named in argv (all by default) as suite(mesh, comm), then closes."""
    import jax_ar

    mesh = jax.make_mesh((jax.device_count(),), ("tp",))
    comm = jax_ar.setup(mesh, "tp", workspace_bytes=workspace_bytes)
    assert comm.serves_calls, comm
    log(f"{jax.device_count()} devices, {jax.process_count()} processes, {comm}")
    run_suites(suites, argv or list(suites), mesh, comm)
    comm.close()


def main_guard(fn):
    """Runs fn(argv) and exits non-zero with the traceback on any failure."""
    try:
        fn(sys.argv[1:])
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        sys.exit(1)
    log("worker done")
