"""One rank of the fuzz test. Usage: ops_fuzz.py RANDOM_CASES SEED

Feeds the public API (setup, all_reduce, Communicator, and rms_norm /
all_reduce_rms_norm when they exist) good and bad input: shapes, dtypes,
axis names, ops, algorithms, pytrees, NaN/inf/-0/subnormal data, huge sizes,
bad setup arguments, then RANDOM_CASES random combinations. Every case must
either return the right result or raise a clear Python exception (TypeError,
ValueError, NotImplementedError or jax_ar.JaxArError, naming jax_ar or the
bad argument). Cases run one after the other in this process; each is
logged before it starts, so a crash (which the launcher reports as a failed
rank) points at its case. All failing cases are listed at the end.
"""
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_ar
from common import (assert_close_to_float64, assert_equal_nan_aware, emulate_all_reduce,
                    environment, global_array, local_shards, log, main_guard)
from comm_fault_checks import ON_GPU, tp_mesh

CLEAR_ERRORS = (TypeError, ValueError, NotImplementedError, jax_ar.JaxArError)
SUPPORTED = ("float32", "bfloat16", "float16", "int32")
# Dtypes jax_ar's kernels do not reduce: jax.lax's collective serves them
# (logged), with jax.lax's result; here on zeros, so the result is zeros of
# jax.lax's result dtype (bool sums count in int32; averages of integers are
# float32; max / min of complex numbers are an error, as in XLA).
# Not on the GPU machine: its ranks share one GPU, where NCCL refuses to run.
LAX_DTYPES = () if ON_GPU else ("int8", "uint8", "int16", "uint32", "bool", "float8_e4m3fn",
                                "complex64")
ALGORITHMS = ("auto", "oneshot", "twoshot") + (() if ON_GPU else ("psum",))  # NCCL: no shared GPU
GOOD_OPS = ("sum", "avg", "max", "min")
BAD_OPS = ("prod", "SUM", "", None, 0, ("sum",))
BAD_ALGORITHMS = ("ring", "ONESHOT", None, 1, "")
BAD_AXES = ("nope", "", None, 3, ("tp", "tp"), ("tp", "nope"))


class Fuzzer:
    def __init__(self, mesh):
        self.mesh = mesh
        self.n = jax.device_count()
        self.comm = jax_ar.setup(mesh, "tp")
        self.failures = []
        self.count = 0

    def case(self, name, thunk, error=None, mentions=()):
        """Runs thunk(). error=None: it must succeed (it checks its own
        result). Otherwise it must raise one of CLEAR_ERRORS, and the
        message must name jax_ar and every string of `mentions`."""
        self.count += 1
        log(f"case {self.count}: {name}")
        try:
            thunk()
        except CLEAR_ERRORS as e:
            text = f"{type(e).__name__}: {e}"
            if error is None:
                self.fail(name, f"raised {text}")
            elif not isinstance(e, error):
                self.fail(name, f"raised {text}; expected {error}")
            elif "jax_ar" not in str(e) or not all(m in str(e) for m in mentions):
                self.fail(name, f"unclear message (wants jax_ar and {mentions}): {text}")
            else:
                log(f"  -> {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        except AssertionError as e:
            self.fail(name, f"wrong result: {e}")
        except Exception as e:  # anything else is not a clear error
            self.fail(name, f"raised {type(e).__name__}, not a clear error: {e}")
        else:
            if error is not None:
                self.fail(name, f"returned a result; expected {error}")

    def fail(self, name, why):
        # A GPU failure (a deadline, say) shows in comm.check(), not in the
        # call: its outputs are undefined, later calls' all-ones bits
        # (docs/guarantees.md). Name it beside what the case saw.
        try:
            self.comm.check()
        except jax_ar.JaxArError as e:
            why = f"(comm.check(): {str(e).splitlines()[0]}) {why}"
        self.failures.append(f"{name}: {why}")
        log(f"FAILED {name}: {why[:500]}")
        # The communicator may be broken now; the next case gets a fresh one.
        self.comm.close()
        self.comm = jax_ar.setup(self.mesh, "tp")

    # -- all_reduce ---------------------------------------------------------

    def reduce(self, tree, op="sum", algorithm="auto", axis="tp", spec=P("tp")):
        """all_reduce of a pytree of global numpy arrays laid out by `spec`."""
        specs = jax.tree_util.tree_map(lambda _: spec, tree)
        out_specs = jax.tree_util.tree_map(lambda _: P(), tree)
        f = jax.jit(jax.shard_map(lambda t: jax_ar.all_reduce(t, axis, op=op,
                                                              algorithm=algorithm),
                                  mesh=self.mesh, in_specs=(specs,), out_specs=out_specs))
        return f(jax.tree_util.tree_map(lambda a: global_array(a, self.mesh, spec), tree))

    def check_reduction(self, tree, op, algorithm, spec=P("tp")):
        out = self.reduce(tree, op, algorithm, spec=spec)
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        out_leaves, out_def = jax.tree_util.tree_flatten(out)
        assert out_def == treedef, f"result tree {out_def} != input tree {treedef}"
        for leaf, result in zip(leaves, out_leaves):
            parts = (np.split(leaf, self.n) if spec == P("tp") else [leaf] * self.n)
            want = emulate_all_reduce(parts, op)
            for device, _, data in local_shards(result):
                if algorithm == "psum" and leaf.dtype != np.int32:  # XLA's order: close only
                    if leaf.size and np.isfinite(leaf.astype(np.float64)).all():
                        assert_close_to_float64(data, parts, op, f"psum on {device}")
                else:
                    assert_equal_nan_aware(data, want, f"{op}/{algorithm} on {device}")

    def check_lax_zeros(self, zeros, op):
        """all_reduce of zeros of a dtype jax.lax serves: zeros of lax's
        result dtype (traced with jax.lax itself) on every rank."""
        out = self.reduce(zeros, op=op)
        lax_fn = {"sum": jax.lax.psum, "avg": jax.lax.pmean, "max": jax.lax.pmax,
                  "min": jax.lax.pmin}[op]
        want = jax.eval_shape(jax.shard_map(lambda v: lax_fn(v, "tp"), mesh=self.mesh,
                                            in_specs=P("tp"), out_specs=P()),
                              jax.ShapeDtypeStruct(zeros.shape, zeros.dtype,
                                                   sharding=NamedSharding(self.mesh, P("tp"))))
        assert out.dtype == want.dtype and out.shape == want.shape, (out, want)
        for device, _, data in local_shards(out):
            assert not np.any(data.astype(np.float32) if data.dtype != np.complex64 else data), \
                f"{op} of zeros on {device}: {data}"

    def data(self, rng, shape, dtype, special=False):
        dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
        if dtype == np.int32:
            return rng.integers(-2**31, 2**31, size=shape, dtype=np.int64).astype(np.int32)
        x = rng.integers(-8, 9, size=shape).astype(np.float32)
        if special and x.size:
            pool = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, -1e-40, 3e38, -3e38],
                            np.float32)
            mask = rng.random(shape) < 0.3
            x = np.where(mask, rng.choice(pool, size=shape), x)
        return x.astype(dtype)

    def global_shape(self, local_shape):
        return (self.n * local_shape[0],) + tuple(local_shape[1:])


def lax_zeros(name, shape):
    return np.zeros(shape, ml_dtypes.float8_e4m3fn if name == "float8_e4m3fn" else name)


def fuzz_all_reduce_fixed(fz):
    rng = np.random.default_rng(1)
    n = fz.n
    x = fz.data(rng, (n * 4,), "float32")
    for op in BAD_OPS:
        fz.case(f"op={op!r}", lambda: fz.reduce(x, op=op), ValueError, ("op",))
    for algorithm in BAD_ALGORITHMS:
        fz.case(f"algorithm={algorithm!r}", lambda: fz.reduce(x, algorithm=algorithm),
                ValueError, ("algorithm",))
    for axis in BAD_AXES:
        fz.case(f"axis={axis!r}", lambda: fz.reduce(x, axis=axis),
                (TypeError, ValueError, NotImplementedError))
    fz.case("axis=('tp',)", lambda: fz.reduce(x, axis=("tp",)))
    fz.case("axis=['tp']", lambda: fz.reduce(x, axis=["tp"]))
    for name in LAX_DTYPES:
        zeros = lax_zeros(name, (n * 3,))
        for op in GOOD_OPS:
            if name == "complex64" and op in ("max", "min"):
                fz.case(f"dtype {name} {op}", lambda: fz.reduce(zeros, op=op), TypeError,
                        ("complex",))
            else:
                fz.case(f"dtype {name} {op}", lambda: fz.check_lax_zeros(zeros, op))
    fz.case("python float leaf", lambda: _assert(float(jax.jit(jax.shard_map(
        lambda v: (v, jax_ar.all_reduce(1.5, "tp")), mesh=fz.mesh, in_specs=P("tp"),
        out_specs=(P("tp"), P())))(global_array(x, fz.mesh, P("tp")))[1]) == 1.5 * n,
        "psum(1.5) is 1.5 times the axis size"))
    fz.case("string leaf", lambda: jax.jit(jax.shard_map(
        lambda v: (v, jax_ar.all_reduce({"a": v, "b": "text"}, "tp")), mesh=fz.mesh,
        in_specs=P("tp"), out_specs=(P("tp"), P())))(global_array(x, fz.mesh, P("tp"))),
        TypeError)
    fz.case("outside shard_map", lambda: jax.jit(lambda v: jax_ar.all_reduce(v, "tp"))(x),
            ValueError, ("shard_map",))
    fz.case("eagerly, outside jit", lambda: jax_ar.all_reduce(jnp.ones(3), "tp"), ValueError)

    # Shapes: a scalar per rank (replicated input), empty, odd, many dims.
    fz.case("scalar per rank", lambda: fz.check_reduction(np.float32(3.0), "sum", "auto",
                                                          spec=P()))
    for local in [(0,), (0, 5), (1,), (7,), (3, 1, 2, 1), (2, 3, 4, 5), (1, 1, 1, 1, 1, 9)]:
        for dtype in SUPPORTED:
            leaf = fz.data(rng, fz.global_shape(local), dtype)
            fz.case(f"shape {local} {dtype}",
                    lambda: fz.check_reduction(leaf, "sum", "oneshot"))
    # Special values in every dtype, op and algorithm.
    for dtype in SUPPORTED[:3]:
        for op in GOOD_OPS:
            for algorithm in ALGORITHMS:
                leaf = fz.data(rng, (n * 33,), dtype, special=True)
                fz.case(f"NaN/inf/-0/subnormal {dtype} {op} {algorithm}",
                        lambda: fz.check_reduction(leaf, op, algorithm))
    # int32 extremes wrap; avg of int32 is float32.
    extremes = np.tile(np.array([2**31 - 1, -2**31, 1, -1], np.int32), n)
    for op in GOOD_OPS:
        fz.case(f"int32 extremes {op}", lambda: fz.check_reduction(extremes, op, "twoshot"))
    # Pytrees: nested, with None and empty leaves, many leaves in one call.
    tree = {"a": [fz.data(rng, (n * 2, 3), "float32"), None,
                  (fz.data(rng, (n,), "bfloat16"), fz.data(rng, (n * 5,), "int32"))],
            "b": np.zeros((0,), np.float16), "c": fz.data(rng, (n * 9,), "float16")}
    fz.case("nested pytree", lambda: fz.check_reduction(tree, "max", "auto"))
    many = [fz.data(rng, (n * (1 + i % 7),), SUPPORTED[i % 4]) for i in range(300)]
    fz.case("300 leaves", lambda: fz.check_reduction(many, "sum", "oneshot"))
    fz.case("empty pytree", lambda: fz.check_reduction([], "sum", "auto"))


def fuzz_huge(fz):
    n = fz.n
    # Lowering only (nothing is allocated): 2^31 + 3 elements per rank.
    huge = jax.ShapeDtypeStruct((n * (2**31 + 3),), jnp.float32,
                                sharding=NamedSharding(fz.mesh, P("tp")))
    for algorithm in ("oneshot", "twoshot", "auto"):
        f = jax.jit(jax.shard_map(lambda v: jax_ar.all_reduce(v, "tp", algorithm=algorithm),
                                  mesh=fz.mesh, in_specs=P("tp"), out_specs=P()))
        fz.case(f"lower 2^31 elements per rank, {algorithm}", lambda: f.lower(huge))
    # Run: 64 MiB per rank, many rounds through the workspace.
    rng = np.random.default_rng(3)
    elements = (16 << 20) if not ON_GPU else (32 << 20)
    big = rng.integers(-8, 9, size=(n * elements,)).astype(np.float32)
    for algorithm in ("oneshot", "twoshot"):
        fz.case(f"{elements * 4 >> 20} MiB per rank, {algorithm}",
                lambda: fz.check_reduction(big, "sum", algorithm))


def fuzz_setup_and_communicator(fz):
    mesh = fz.mesh
    for value in (-1, 0, 1000, 1.5, "8M", True, object()):
        fz.case(f"setup workspace_bytes={value!r}",
                lambda: jax_ar.setup(mesh, "tp", workspace_bytes=value), (TypeError, ValueError),
                ("workspace_bytes",))
    for value in (2**41, 2**70):
        fz.case(f"setup workspace_bytes={value}", lambda: jax_ar.setup(
            mesh, "tp", workspace_bytes=value), ValueError, ("workspace_bytes",))
    # More than /dev/shm (or the GPU) holds, within the limit: an error from
    # every process (each fails to allocate), naming the workspace.
    fz.case("setup workspace_bytes=2**39", lambda: jax_ar.setup(jax.make_mesh(
        (fz.n,), ("wide",)), "wide", workspace_bytes=2**39), jax_ar.JaxArError,
        ("workspace_bytes",))
    for value in (0, -1, float("nan"), float("inf"), "5", True, [1]):
        fz.case(f"setup timeout_s={value!r}",
                lambda: jax_ar.setup(jax.make_mesh((fz.n,), ("t2",)), "t2", timeout_s=value),
                (TypeError, ValueError), ("timeout_s",))
    fz.case("setup on a non-mesh", lambda: jax_ar.setup("mesh", "tp"), TypeError, ("Mesh",))
    fz.case("setup on a device list", lambda: jax_ar.setup(jax.devices(), "tp"), TypeError,
            ("Mesh",))
    for axis in ("dp", "", None, 3, ("tp",)):
        fz.case(f"setup axis={axis!r}", lambda: jax_ar.setup(mesh, axis), (TypeError, ValueError))
    fz.case("setup twice returns the same communicator",
            lambda: _assert(jax_ar.setup(mesh, "tp") is fz.comm, "not idempotent"))
    fz.case("setup twice with another workspace size",
            lambda: jax_ar.setup(mesh, "tp", workspace_bytes=fz.comm.workspace_bytes * 2),
            ValueError, ("workspace_bytes",))
    fz.case("setup twice with the workspace size and deadline it has",
            lambda: _assert(jax_ar.setup(mesh, "tp", workspace_bytes=fz.comm.workspace_bytes,
                                         timeout_s=fz.comm.timeout_s) is fz.comm,
                            "not idempotent"))
    fz.case("setup twice with another deadline",
            lambda: jax_ar.setup(mesh, "tp", timeout_s=fz.comm.timeout_s + 1), ValueError,
            ("timeout_s",))

    def custom_workspace_then_defaults():
        # None means "as it is set up", not the default size.
        comm = jax_ar.setup(jax.make_mesh((fz.n,), ("ws",)), "ws", workspace_bytes=2 << 20)
        try:
            _assert(jax_ar.setup(jax.make_mesh((fz.n,), ("ws",)), "ws") is comm,
                    "setup(mesh, axis) after a custom workspace size is not the same one")
        finally:
            comm.close()

    fz.case("setup with a custom workspace, then without one", custom_workspace_then_defaults)

    def malformed_table():
        # A cost table that cannot be used is an error from setup, which
        # reads it (docs/benchmarks.md), never replaced by the defaults.
        path = os.path.join(tempfile.mkdtemp(), "table.json")
        with open(path, "w") as f:
            f.write("{not json")
        with environment("JAX_AR_TABLE", path):
            jax_ar.selection.clear_cache()
            try:
                jax_ar.setup(jax.make_mesh((fz.n,), ("bad_table",)), "bad_table")
            finally:
                jax_ar.selection.clear_cache()

    fz.case("setup with a malformed cost table", malformed_table, jax_ar.selection.TableError,
            ("table.json",))

    def bad_algorithm_variable():
        with environment("JAX_AR_ALGO", "fastest"):
            jax_ar.setup(jax.make_mesh((fz.n,), ("bad_algo",)), "bad_algo")

    fz.case("setup with JAX_AR_ALGO=fastest", bad_algorithm_variable, ValueError,
            ("JAX_AR_ALGO", "fastest"))

    def closed_communicator():
        comm = jax_ar.setup(jax.make_mesh((fz.n,), ("c",)), "c")
        comm.close()
        comm.close()  # twice: a no-op
        try:
            comm.check()
        except jax_ar.JaxArError as e:
            assert "closed" in str(e), e
        else:
            raise AssertionError("check() on a closed communicator passed")
        mesh_c = comm.mesh
        jax.jit(jax.shard_map(lambda v: jax_ar.all_reduce(v, "c"), mesh=mesh_c,
                              in_specs=P("c"), out_specs=P()))(
            global_array(np.ones(fz.n, np.float32), mesh_c, P("c")))

    # Tracing on a closed communicator: jax_ar's own run-time type, naming setup (README: Errors).
    fz.case("all_reduce after close()", closed_communicator, jax_ar.JaxArError, ("closed", "setup"))
    with jax_ar.setup(jax.make_mesh((fz.n,), ("w",)), "w") as comm:
        fz.case("communicator as a context manager", lambda: _assert(comm.serves_calls, comm))
    fz.case("closed by the with block", lambda: _assert(comm.closed, comm))


def _assert(condition, what):
    assert condition, what


def fuzz_norm(fz):
    """rms_norm and all_reduce_rms_norm."""
    import ops_fuzz_norm_cases as fuzz_norm_cases

    fuzz_norm_cases.run(fz)


def fuzz_random(fz, count, seed):
    """Random combinations; the expected outcome follows from the rules."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        op = _pick(rng, GOOD_OPS, BAD_OPS, 0.1)
        algorithm = _pick(rng, ALGORITHMS, BAD_ALGORITHMS, 0.1)
        axis = _pick(rng, ("tp",), BAD_AXES, 0.1)
        leaves = []
        for _ in range(int(rng.integers(1, 4))):
            dtype = _pick(rng, SUPPORTED, LAX_DTYPES or SUPPORTED, 0.1)
            local = tuple(int(d) for d in rng.integers(0, 6, size=int(rng.integers(1, 4))))
            shape = fz.global_shape(local)
            if dtype in LAX_DTYPES:
                leaves.append(lax_zeros(dtype, shape))
            else:
                leaves.append(fz.data(rng, shape, dtype, special=rng.random() < 0.3))
        tree = leaves if len(leaves) > 1 else leaves[0]
        name = (f"random {i}: op={op!r} algorithm={algorithm!r} axis={axis!r} "
                f"leaves={[(str(l.dtype), l.shape) for l in leaves]}")
        bad = (op not in GOOD_OPS or algorithm not in ALGORITHMS or axis != "tp"
               or (op in ("max", "min") and any(l.dtype == np.complex64 for l in leaves)))
        if bad:
            fz.case(name, lambda: fz.reduce(tree, op=op, algorithm=algorithm, axis=axis),
                    CLEAR_ERRORS)
        elif any(str(l.dtype) in LAX_DTYPES for l in leaves):
            fz.case(name, lambda: [fz.check_lax_zeros(l, op) if str(l.dtype) in LAX_DTYPES
                                   else fz.check_reduction(l, op, algorithm) for l in leaves])
        else:
            fz.case(name, lambda: fz.check_reduction(tree, op, algorithm))


def _pick(rng, good, bad, bad_fraction):
    pool = bad if rng.random() < bad_fraction else good
    return pool[int(rng.integers(len(pool)))]


def main(argv):
    count, seed = int(argv[0]), int(argv[1])
    fz = Fuzzer(tp_mesh())
    fuzz_all_reduce_fixed(fz)
    fuzz_huge(fz)
    fuzz_setup_and_communicator(fz)
    fuzz_norm(fz)
    fuzz_random(fz, count, seed)
    fz.comm.close()
    if fz.failures:
        raise AssertionError(f"{len(fz.failures)} of {fz.count} fuzz cases failed:\n" +
                             "\n".join(fz.failures))
    log(f"fuzz-check ok: {fz.count} cases")
    sys.stdout.flush()


if __name__ == "__main__":
    main_guard(main)
