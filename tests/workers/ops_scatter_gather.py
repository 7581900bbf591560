"""One rank of the reduce_scatter / all_gather tests.
Usage: ops_scatter_gather.py [SUITE...]

Suites: values, specials, rounds, grad, vmap, pytree, bad_input. Results are
compared bit for bit with host references (jax_ar's arithmetic: rank order,
float32 accumulation, one rounding) and, on CPU, with jax.lax.psum_scatter /
jax.lax.all_gather: bitwise where the data make every order agree, and in
shapes and varying-axes types always. On the GPU machine (ranks sharing a
GPU, where XLA's collectives cannot run) only the host references are used.
"""
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.extend.core import Literal
from jax.sharding import Mesh, PartitionSpec as P

import jax_ar
from jax_ar import _compat
from axes_cases import run_cases
from lax_forms import compare_with_lax, run_tree_cases
from common import (DTYPES, assert_bitwise_equal, assert_equal_nan_aware, emulate_all_reduce,
                    expect_error, global_array, log, SuiteSkipped, main_guard, suites_in, random_values,
                    run_communicator_suites, same_on_all_processes)

ON_GPU = os.environ.get("JAX_AR_TEST_PLATFORM", "cpu") == "gpu"
SEED = int(os.environ.get("JAX_AR_TEST_SEED", "0"))
GATHER_ONLY_DTYPES = {"int8": np.dtype(np.int8), "bool": np.dtype(np.bool_),
                      "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn)}


def scatter_reference(parts, d, tiled):
    """Rank j's psum_scatter result, in jax_ar's arithmetic."""
    n = len(parts)
    total = emulate_all_reduce(parts, "sum")
    if tiled:
        k = total.shape[d] // n
        return [np.take(total, np.arange(j * k, (j + 1) * k), axis=d) for j in range(n)]
    return [np.take(total, j, axis=d) for j in range(n)]


def gather_reference(parts, axis, tiled):
    return np.concatenate(parts, axis=axis) if tiled else np.stack(parts, axis=axis)


def typed(fn, types, name):
    """fn, recording its result's (shape, dtype, varying axes) at trace time."""
    def wrapped(*xs):
        y = fn(*xs)
        a = jax.typeof(y)
        types[name] = (a.shape, a.dtype, _compat.varying_axes(a))
        return y
    return wrapped


def run_with_lax(mesh, cases, lax_cases, expected, exact_lax):
    """Runs jax_ar's cases and, on CPU, lax's in a separate program (XLA:CPU
    does not order XLA's collectives with jax_ar's calls, and ranks would
    meet in different ones). Checks values against `expected`, lax's where
    `exact_lax` says the data make every order agree, and every type against
    lax's."""
    types = {}
    ours = {k: (typed(fn, types, k), args) for k, (fn, args) in cases.items()}
    results = run_cases(mesh, ours)
    for name, per_rank in results.items():
        check(per_rank, expected[name], name)
    if ON_GPU:
        return results
    theirs = {k: (typed(lax_cases[k], types, k + "/lax"), cases[k][1]) for k in cases}
    lax_results = run_cases(mesh, theirs)
    for name in cases:
        assert types[name] == types[name + "/lax"], \
            f"{name}: jax_ar gives {types[name]}, lax {types[name + '/lax']}"
        if exact_lax(name):
            check(lax_results[name], expected[name], name + " (lax)")
    return results


def check(results, expected, what, nan_aware=False):
    for rank, got in results.items():
        compare = assert_equal_nan_aware if nan_aware else assert_bitwise_equal
        compare(got, expected[rank], f"{what} on rank {rank}")


def suite_values(mesh, comm):
    n = comm.world_size
    rng = np.random.default_rng(SEED + 1)
    # (local shape, scatter dimension, tiled): odd sizes, rows that are not
    # 16-byte multiples, every position of the dimension.
    scatter_forms = [((n,), 0, False), ((n, 7), 0, False), ((3, n, 2), 1, False),
                     ((2, 3, n), -1, False), ((2 * n, 3), 0, True), ((3, 3 * n), 1, True),
                     ((5 * n + 0, 33), 0, True)]
    gather_forms = [((5,), 0, False), ((5,), -1, False), ((3, 4), 1, False), ((3, 4), 0, True),
                    ((3, 4), 1, True), ((7,), 0, True), ((2, 3, 5), 3, False),
                    ((2, 3, 5), 2, True)]
    cases, lax_cases, expected = {}, {}, {}
    for dt, dtype in DTYPES.items():
        for shape, d, tiled in scatter_forms:
            # Integer-valued data make every summation order agree (lax too);
            # random data check jax_ar's own order and rounding.
            for kind in ("int", "random"):
                parts = [random_values(rng, shape, dtype, integer_valued=kind == "int")
                         for _ in range(n)]
                name = f"reduce_scatter/{dt}{shape}/d={d}/tiled={tiled}/{kind}"
                cases[name] = (lambda x, d=d, t=tiled: jax_ar.reduce_scatter(x, "tp", d, t),
                               [parts])
                # lax's lowering rejects negative dimensions: give it d >= 0.
                lax_cases[name] = lambda x, d=d % len(shape), t=tiled: jax.lax.psum_scatter(
                    x, "tp", scatter_dimension=d, tiled=t)
                expected[name] = scatter_reference(parts, d % len(shape), tiled)
    for dt, dtype in {**DTYPES, **GATHER_ONLY_DTYPES}.items():
        for shape, axis, tiled in gather_forms:
            for to in ("varying", "invarying"):
                parts = [random_values(rng, shape, np.float32, integer_valued=False).astype(dtype)
                         for _ in range(n)]
                name = f"all_gather/{dt}{shape}/axis={axis}/tiled={tiled}/{to}"
                cases[name] = (lambda x, a=axis, t=tiled, to=to: jax_ar.all_gather(
                    x, "tp", a, t, to=to), [parts])
                lax_cases[name] = lambda x, a=axis, t=tiled, to=to: jax.lax.all_gather(
                    x, "tp", axis=a, tiled=t, to=to)
                want = gather_reference(parts, axis % (len(shape) + (0 if tiled else 1)), tiled)
                expected[name] = [want] * n
    results = run_with_lax(mesh, cases, lax_cases, expected,
                           exact_lax=lambda name: not name.endswith("/random"))
    same_on_all_processes("values", [r for name in sorted(results)
                                     for _, r in sorted(results[name].items())
                                     if name.startswith("all_gather")])
    log(f"values: {len(cases)} cases ok")


def suite_specials(mesh, comm):
    n = comm.world_size
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38,
                         3.4e38, -3.4e38, 1.0, -1.0], dtype=np.float32)
    payload_nan = np.array([0x7fc12345, 0xffc00001], dtype=np.uint32).view(np.float32)
    base = np.concatenate([specials, payload_nan])
    cases, expected, nan_aware = {}, {}, set()
    for dt in ("float32", "bfloat16", "float16"):
        with np.errstate(over="ignore"):  # 3.4e38 becomes inf in float16, as intended
            mixed = [np.stack([np.roll(base, r + j) for j in range(n)]).astype(DTYPES[dt])
                     for r in range(n)]
        negzero = [np.full((n, base.size), -0.0, DTYPES[dt]) for _ in range(n)]
        for label, parts in (("mixed", mixed), ("negzero", negzero)):
            name = f"reduce_scatter/{label}/{dt}"
            cases[name] = (lambda x: jax_ar.reduce_scatter(x, "tp"), [parts])
            expected[name] = scatter_reference(parts, 0, False)
            nan_aware.add(name)
        # NaN payloads, -0.0 and subnormals travel through all_gather untouched.
        name = f"all_gather/{dt}"
        cases[name] = (lambda x: jax_ar.all_gather(x, "tp"), [[p[0] for p in mixed]])
        expected[name] = [gather_reference([p[0] for p in mixed], 0, False)] * n
    results = run_cases(mesh, cases)
    for name, per_rank in results.items():
        check(per_rank, expected[name], name, nan_aware=name in nan_aware)
    log("specials: ok")


def suite_rounds(mesh, comm):
    """Chunks larger than a workspace slot: several protocol rounds, on a
    second communicator with a small workspace."""
    n = comm.world_size
    small_mesh = jax.sharding.Mesh(mesh.devices, ("small",))
    small = jax_ar.setup(small_mesh, "small", workspace_bytes=1 << 20)
    slot = small.capacity_bytes("oneshot")
    rng = np.random.default_rng(SEED + 2)
    elements = 3 * slot // 4 + 5  # float32: 3 rounds and a short last one
    parts = [random_values(rng, (n, elements), np.float32, integer_valued=False)
             for _ in range(n)]
    halves = [random_values(rng, (elements // 2 + 1,), DTYPES["bfloat16"], integer_valued=False)
              for _ in range(n)]
    cases = {
        "reduce_scatter": (lambda x: jax_ar.reduce_scatter(x, "small"), [parts]),
        "all_gather": (lambda x: jax_ar.all_gather(x, "small", tiled=True), [halves]),
    }
    results = run_cases(small_mesh, cases)
    check(results["reduce_scatter"], scatter_reference(parts, 0, False), "rounds/reduce_scatter")
    check(results["all_gather"], [np.concatenate(halves)] * n, "rounds/all_gather")
    small.close()
    log(f"rounds: ok ({elements * 4} bytes per chunk, {slot} bytes per slot)")


def suite_grad(mesh, comm):
    """Gradients of linear losses sum(c * f(x)) with a different c on every
    rank, against the transposes written out in numpy (and lax's on CPU):
    reduce_scatter's is all_gather and the other way round."""
    if comm.psum_unavailable:  # the references and shard_map's transposes use psum
        raise SuiteSkipped(comm.psum_unavailable)
    n = comm.world_size
    rng = np.random.default_rng(SEED + 3)
    x_rs = [random_values(rng, (2, 3 * n), np.float32, integer_valued=False) for _ in range(n)]
    c_rs = [random_values(rng, (2, 3), np.float32, integer_valued=False) for _ in range(n)]
    x_ag = [random_values(rng, (4, 3), np.float32, integer_valued=False) for _ in range(n)]
    c_ag = [random_values(rng, (4, 3 * n), np.float32, integer_valued=False) for _ in range(n)]
    want_rs = [np.concatenate(c_rs, axis=1)] * n  # x_r's block j feeds rank j's output
    want_ag = [sum(c[:, 3 * j:3 * j + 3] for c in c_ag) for j in range(n)]

    def inner(f):
        return lambda x, c: jax.grad(lambda u: jnp.sum(c * f(u)))(x)

    forms = {
        "reduce_scatter": (lambda u: jax_ar.reduce_scatter(u, "tp", 1, True),
                           lambda u: jax.lax.psum_scatter(u, "tp", scatter_dimension=1,
                                                          tiled=True), x_rs, c_rs, want_rs),
        "all_gather": (lambda u: jax_ar.all_gather(u, "tp", 1, True),
                       lambda u: jax.lax.all_gather(u, "tp", axis=1, tiled=True),
                       x_ag, c_ag, want_ag),
        "all_gather_invarying": (lambda u: jax_ar.all_gather(u, "tp", 1, True, to="invarying"),
                                 lambda u: jax.lax.all_gather(u, "tp", axis=1, tiled=True,
                                                              to="invarying"),
                                 x_ag, c_ag, want_ag),
    }
    for check_vma in (True, False):
        for use_lax in (False, True) if not ON_GPU else (False,):
            # jax_ar's and lax's in separate programs (see run_with_lax).
            cases = {name: (inner(theirs if use_lax else ours), [x, c])
                     for name, (ours, theirs, x, c, _) in forms.items()
                     if check_vma or name != "all_gather_invarying"}  # a type needs check_vma
            results = run_cases(mesh, cases, check_vma=check_vma)
            for name, per_rank in results.items():
                for rank, got in per_rank.items():
                    np.testing.assert_allclose(
                        got, forms[name][4][rank], rtol=1e-5, atol=1e-5,
                        err_msg=f"grad {name} check_vma={check_vma} lax={use_lax}")
    # Outside shard_map too: jax.grad of a jitted shard_map.
    spec = P("tp")
    xs = global_array(np.concatenate(x_rs), mesh, spec)
    weights = jnp.asarray(np.concatenate(c_rs))
    f = jax.shard_map(lambda u: jax_ar.reduce_scatter(u, "tp", 1, True), mesh=mesh,
                      in_specs=spec, out_specs=spec)
    got = jax.jit(jax.grad(lambda v: jnp.sum(weights * f(v))))(xs)
    for s in got.addressable_shards:
        np.testing.assert_allclose(np.asarray(s.data), want_rs[0], rtol=1e-6,
                                   err_msg="outer grad of reduce_scatter")
    log("grad: ok")


def suite_vmap(mesh, comm):
    n = comm.world_size
    rng = np.random.default_rng(SEED + 4)
    x = [random_values(rng, (3, n, 5), np.float32) for _ in range(n)]  # vmapped over dim 0
    y = [random_values(rng, (4, 3), np.float32) for _ in range(n)]  # vmapped over dim 1
    cases = {
        "reduce_scatter": (lambda v: jax.vmap(lambda row: jax_ar.reduce_scatter(row, "tp"))(v),
                           [x]),
        "reduce_scatter_axis1": (lambda v: jax.vmap(lambda r: jax_ar.reduce_scatter(r, "tp"),
                                                    in_axes=1)(v), [[p.transpose(1, 0, 2)
                                                                     for p in x]]),
        "all_gather": (lambda v: jax.vmap(lambda col: jax_ar.all_gather(col, "tp"),
                                          in_axes=1)(v), [y]),
    }
    results = run_cases(mesh, cases)
    want_rs = scatter_reference(x, 1, False)  # [3, 5] per rank
    check(results["reduce_scatter"], want_rs, "vmap reduce_scatter")
    check(results["reduce_scatter_axis1"], want_rs, "vmap reduce_scatter in_axes=1")
    stacked = np.stack(y)  # [n, 4, 3]; vmap over the 3 columns: [3, n, 4]
    check(results["all_gather"], [stacked.transpose(2, 0, 1)] * n, "vmap all_gather")
    log("vmap: ok")


def suite_pytree(mesh, comm):
    n = comm.world_size
    rng = np.random.default_rng(SEED + 5)
    a = [random_values(rng, (n, 3), np.float32) for _ in range(n)]
    b = [random_values(rng, (n,), DTYPES["bfloat16"]) for _ in range(n)]
    e = [np.zeros((n, 0), np.float32) for _ in range(n)]
    cases = {
        "reduce_scatter": (lambda u, v, w: jax_ar.reduce_scatter({"a": u, "b": [v], "e": w},
                                                                 "tp"), [a, b, e]),
        "all_gather": (lambda u, v, w: jax_ar.all_gather((u, v, w), "tp"), [a, b, e]),
    }
    # Each case returns a pytree; run_cases wants arrays, so flatten in place.
    flat_cases = {}
    for name, (fn, args) in cases.items():
        for i in range(3):
            flat_cases[f"{name}/{i}"] = (
                lambda *xs, fn=fn, i=i: jax.tree_util.tree_leaves(fn(*xs))[i], args)
    results = run_cases(mesh, flat_cases)
    for i, parts in enumerate((a, b, e)):
        check(results[f"reduce_scatter/{i}"], scatter_reference(parts, 0, False),
              f"pytree reduce_scatter leaf {i}")
        check(results[f"all_gather/{i}"], [np.stack(parts)] * n, f"pytree all_gather leaf {i}")
    log("pytree: ok")


def suite_empty_leaves(mesh, comm):
    """Empty leaves give constants that do not read their input: a zero-size
    parameter kept alive in a program crashed XLA:GPU's compiler (the pytree
    suite above killed every rank there; docs/gpu.md)."""
    n = comm.world_size
    forms = {
        "reduce_scatter": lambda w: jax_ar.reduce_scatter(w, "tp"),
        "reduce_scatter tiled": lambda w: jax_ar.reduce_scatter(w, "tp", tiled=True),
        "all_gather": lambda w: jax_ar.all_gather(w, "tp"),
        "all_gather tiled": lambda w: jax_ar.all_gather(w, "tp", tiled=True),
        "all_gather invarying": lambda w: jax_ar.all_gather(w, "tp", to="invarying"),
    }
    empty = global_array(np.zeros((n * n, 0), np.float32), mesh, P("tp"))
    for name, fn in forms.items():
        out = P() if name.endswith("invarying") else P("tp")
        program = jax.shard_map(fn, mesh=mesh, in_specs=P("tp"), out_specs=out)
        jaxpr = jax.make_jaxpr(program)(empty).jaxpr
        inner = next(e for e in jaxpr.eqns if e.primitive.name == "shard_map").params["jaxpr"]
        assert not _depends_on_inputs(inner), f"{name} of an empty leaf reads its input:\n{inner}"
    log("empty_leaves: ok")


def _depends_on_inputs(jaxpr) -> bool:
    """Whether any output of `jaxpr` is computed from one of its inputs."""
    live = set(jaxpr.invars)
    for eqn in jaxpr.eqns:
        if any(v in live for v in eqn.invars if not isinstance(v, Literal)):
            live.update(eqn.outvars)
    return any(v in live for v in jaxpr.outvars if not isinstance(v, Literal))


# ----------------------------------------------------------------------------
# The forms jax.lax takes: several axes, scalars, other dtypes, groups, vmap.

def ordered_ranks(sizes, axes_order, names):
    """Ranks (row-major positions in a mesh of `sizes` over `names`) sorted
    by their index along the tuple `axes_order`: lax's rank order."""
    coords = list(np.ndindex(*sizes))

    def index(c):
        k = 0
        for a in axes_order:
            k = k * sizes[names.index(a)] + c[names.index(a)]
        return k
    return sorted(range(len(coords)), key=lambda r: index(coords[r])), [index(c) for c in coords]


def scatter_over_reference(parts, d, tiled, order, index):
    """Rank r's psum_scatter over a tuple: block index[r] of the sum."""
    total = np.sum(np.stack([p.astype(np.float64) for p in parts]), axis=0).astype(parts[0].dtype)
    count = len(order)
    if tiled:
        k = total.shape[d] // count
        return [np.take(total, np.arange(index[r] * k, (index[r] + 1) * k), axis=d)
                for r in range(len(parts))]
    return [np.take(total, index[r], axis=d) for r in range(len(parts))]


def gather_over_reference(parts, d, tiled, order):
    ordered = [parts[r] for r in order]
    want = np.concatenate(ordered, axis=d) if tiled else np.stack(ordered, axis=d)
    return [want] * len(parts)


def suite_several_axes(mesh, comm):
    """reduce_scatter and all_gather over two mesh axes, in both tuple
    orders, tiled and not, every dimension: lax's result and types (rank
    order = lax's over the tuple). With communicators for both axes (two
    jax_ar steps), and for one (an XLA step for the other)."""
    n = comm.world_size
    rows = 2 if n % 2 == 0 else n
    sizes, names = (rows, n // rows), ("x", "y")
    grid = Mesh(mesh.devices.reshape(sizes), names)
    rng = np.random.default_rng(SEED + 6)
    variants = [("x", "y"), ("y",) if sizes[1] > 1 else ("x",)]
    if ON_GPU and sizes[1] > 1:  # an XLA step between ranks sharing a GPU: NCCL refuses
        variants = variants[:1]
    for setup_axes in variants:
        comms = [jax_ar.setup(grid, a) for a in setup_axes]
        cases, expected = {}, {}
        for axes in (("x", "y"), ("y", "x")):
            order, index = ordered_ranks(sizes, axes, names)
            for shape, d, tiled in (((n,), 0, False), ((2, n), -1, False), ((2 * n, 3), 0, True),
                                    ((3, 2, n), 2, True), ((2, n, 3), -2, False)):
                for dt in ("float32", "bfloat16", "int32"):
                    parts = [random_values(rng, shape, DTYPES[dt]) for _ in range(n)]
                    name = f"reduce_scatter {axes} {dt}{shape} d={d} tiled={tiled}"
                    cases[name] = (lambda v, axes=axes, d=d, t=tiled: jax_ar.reduce_scatter(
                        v, axes, d, t), lambda v, axes=axes, d=d % len(shape), t=tiled:
                        jax.lax.psum_scatter(v, axes, scatter_dimension=d, tiled=t), [parts])
                    expected[name] = [scatter_over_reference(parts, d % len(shape), tiled,
                                                             order, index)]
            for shape, d, tiled in (((3,), 0, False), ((3,), -1, True), ((2, 3), 1, False),
                                    ((2, 3), -1, True), ((2, 3, 2), 1, True)):
                for to in ("varying", "invarying"):
                    for dt in ("float32", "int8"):
                        parts = [random_values(rng, shape, np.float32).astype(dt)
                                 for _ in range(n)]
                        name = f"all_gather {axes} {dt}{shape} d={d} tiled={tiled} {to}"
                        out_ndim = len(shape) + (0 if tiled else 1)
                        cases[name] = (lambda v, axes=axes, d=d, t=tiled, to=to: jax_ar.all_gather(
                            v, axes, d, t, to=to), lambda v, axes=axes, d=d % out_ndim, t=tiled,
                            to=to: jax.lax.all_gather(v, axes, axis=d, tiled=t, to=to), [parts])
                        expected[name] = [gather_over_reference(parts, d % out_ndim, tiled,
                                                                order)]
        compare_with_lax(grid, cases, expected)
        for c in comms:
            c.close()
        log(f"several_axes with communicators for {setup_axes}: {len(cases)} cases ok")


def suite_lax_forms(mesh, comm):
    """Python and numpy scalars, 0-d arrays, dtypes the kernels do not take
    (jax.lax, logged), axis_name=() and lists, axis_index_groups, pytrees
    mixing dtypes, negative dimensions: lax's results and types."""
    if ON_GPU:  # forms served by jax.lax's collectives: NCCL refuses ranks sharing a GPU
        raise SuiteSkipped("jax.lax's collectives cannot run between ranks sharing a GPU")
    n = comm.world_size
    rng = np.random.default_rng(SEED + 7)
    dummy = [np.zeros((), np.float32)] * n
    constants = {"1": 1, "True": True, "2.5": 2.5, "np.float32": np.float32(-1.5),
                 "numpy 0-d int8": np.array(3, np.int8), "jax f32[2]": jnp.arange(2.0)}
    cases, expected = {}, {}
    for label, c in constants.items():
        for to in ("varying", "invarying"):
            name = f"all_gather({label}) {to}"
            cases[name] = (lambda v, c=c, to=to: jax_ar.all_gather(c, "tp", to=to),
                           lambda v, c=c, to=to: jax.lax.all_gather(c, "tp", to=to), [dummy])
            expected[name] = [[np.stack([np.asarray(c)] * n)] * n]
    for dt in ("float32", "bfloat16", "int32", "bool", "int8", "uint32", "complex64"):
        zero_d = [random_values(rng, (), np.float32).astype(dt) for _ in range(n)]
        for axis in (0, -1):
            name = f"all_gather 0-d {dt} axis={axis}"
            cases[name] = (lambda v, a=axis: jax_ar.all_gather(v, "tp", axis=a),
                           lambda v: jax.lax.all_gather(v, "tp", axis=0), [zero_d])
            expected[name] = [[np.stack(zero_d)] * n]
    for dt in ("int8", "uint8", "int16", "complex64"):  # jax.lax's psum_scatter
        parts = [np.abs(random_values(rng, (n, 2), np.float32)).astype(dt) for _ in range(n)]
        name = f"reduce_scatter {dt}"
        cases[name] = (lambda v: jax_ar.reduce_scatter(v, "tp", -2),
                       lambda v: jax.lax.psum_scatter(v, "tp", scatter_dimension=0), [parts])
        expected[name] = [scatter_reference(parts, 0, False)]
    f32 = [random_values(rng, (n, 4), np.float32) for _ in range(n)]
    cases["reduce_scatter ()"] = (lambda v: jax_ar.reduce_scatter(v, ()),
                                  lambda v: jax.lax.psum_scatter(v, ()), [f32])
    expected["reduce_scatter ()"] = [f32]
    cases["all_gather ()"] = (lambda v: jax_ar.all_gather(v, ()),
                              lambda v: jax.lax.all_gather(v, ()), [f32])
    cases["reduce_scatter list"] = (
        lambda v: jax_ar.reduce_scatter(v, ["tp"], 1, tiled=True),
        lambda v: jax.lax.psum_scatter(v, ("tp",), scatter_dimension=1, tiled=True),
        [[np.tile(p, n) for p in f32]])
    cases["all_gather list"] = (lambda v: jax_ar.all_gather(v, ["tp"], axis=-1, tiled=True),
                                lambda v: jax.lax.all_gather(v, ("tp",), axis=1, tiled=True), [f32])
    whole = [list(range(n))]
    cases["reduce_scatter one group"] = (
        lambda v: jax_ar.reduce_scatter(v, "tp", axis_index_groups=whole),
        lambda v: jax.lax.psum_scatter(v, "tp"), [f32])
    cases["all_gather one group"] = (lambda v: jax_ar.all_gather(v, "tp", axis_index_groups=whole),
                                     lambda v: jax.lax.all_gather(v, "tp"), [f32])
    if n % 2 == 0:
        halves = [list(range(n // 2)), list(range(n // 2, n))]
        wide = [random_values(rng, (2, n // 2), np.float32) for _ in range(n)]
        cases["reduce_scatter halves"] = (
            lambda v: jax_ar.reduce_scatter(v, "tp", 1, tiled=True, axis_index_groups=halves),
            lambda v: jax.lax.psum_scatter(v, "tp", scatter_dimension=1, tiled=True,
                                           axis_index_groups=halves), [wide])
        expected["reduce_scatter halves"] = [[
            scatter_reference([wide[q] for q in g], 1, True)[g.index(r)]
            for r in range(n) for g in halves if r in g]]
        cases["all_gather halves"] = (
            lambda v: jax_ar.all_gather(v, "tp", axis_index_groups=halves),
            lambda v: jax.lax.all_gather(v, "tp", axis_index_groups=halves), [wide])
        expected["all_gather halves"] = [[np.stack([wide[q] for q in g])
                                          for r in range(n) for g in halves if r in g]]
    tree = [{"f32": random_values(rng, (n, 2), np.float32),
             "bf16": random_values(rng, (n,), DTYPES["bfloat16"]),
             "i32": random_values(rng, (n, 1, 2), np.int32),
             "i8": np.abs(random_values(rng, (n,), np.float32)).astype(np.int8)} for _ in range(n)]
    keys = sorted(tree[0])
    cases["reduce_scatter pytree"] = (
        lambda *vs: jax_ar.reduce_scatter(dict(zip(keys, vs)), "tp"),
        lambda *vs: jax.lax.psum_scatter(dict(zip(keys, vs)), "tp"), [[t[k] for t in tree]
                                                                      for k in keys])
    expected["reduce_scatter pytree"] = [scatter_reference([t[k] for t in tree], 0, False)
                                         for k in keys]
    cases["all_gather pytree"] = (
        lambda *vs: jax_ar.all_gather((dict(zip(keys, vs)), vs[0] > 0, 1.5), "tp", axis=-1),
        lambda *vs: jax.lax.all_gather((dict(zip(keys, vs)), vs[0] > 0, 1.5), "tp", axis=-1),
        [[t[k] for t in tree] for k in keys])
    for check_vma in (True, False):
        compare_with_lax(mesh, cases, expected, check_vma=check_vma)
    log(f"lax_forms: {len(cases)} forms ok")


def suite_vmap_axes(mesh, comm):
    """jax.vmap(axis_name="b") inside shard_map: reduce_scatter and
    all_gather over "b", ("tp", "b") and ("b", "tp") (rank order over the
    tuple), against numpy; against jax.lax where it takes them (over "b"
    alone without check_vma: jax 0.10's lax fails on the others)."""
    n = comm.world_size
    rng = np.random.default_rng(SEED + 8)
    batch = 2
    for check_vma in (True, False):
        cases, expected, lax_cases = {}, {}, {}
        for axes in ("b", ("tp", "b"), ("b", "tp")):
            count = batch if axes == "b" else n * batch

            def member_index(t, i, axes=axes):  # rank t, batch member i
                return i if axes == "b" else (t * batch + i if axes[0] == "tp" else i * n + t)
            parts = [random_values(rng, (batch, count, 3), np.float32) for _ in range(n)]
            name = f"reduce_scatter over {axes}"
            cases[name] = (lambda v, axes=axes: jax.vmap(
                lambda r: jax_ar.reduce_scatter(r, axes), axis_name="b")(v), [parts])
            if axes == "b":
                totals = [p.sum(0) for p in parts]
                want = [np.stack([totals[t][member_index(t, i)] for i in range(batch)])
                        for t in range(n)]
            else:
                total = sum(p.sum(0) for p in parts)
                want = [np.stack([total[member_index(t, i)] for i in range(batch)])
                        for t in range(n)]
            expected[name] = [want]
            lax_cases[name] = lambda v, axes=axes: jax.vmap(
                lambda r: jax.lax.psum_scatter(r, axes), axis_name="b")(v)
            rows = [random_values(rng, (batch, 2), np.float32) for _ in range(n)]
            for tiled in (False, True):
                name = f"all_gather over {axes} tiled={tiled}"
                cases[name] = (lambda v, axes=axes, t=tiled: jax.vmap(
                    lambda r: jax_ar.all_gather(r, axes, axis=-1, tiled=t), axis_name="b")(v),
                    [rows])
                members = {member_index(t, i): rows[t][i] for t in range(n) for i in range(batch)}
                groups = [[rows[t][i] for i in range(batch)] if axes == "b" else
                          [members[k] for k in range(count)] for t in range(n)]
                one = [np.concatenate(g, axis=-1) if tiled else np.stack(g, axis=-1)
                       for g in groups]
                stacked = [np.broadcast_to(o, (batch,) + o.shape) for o in one]
                expected[name] = [stacked]
                lax_cases[name] = lambda v, axes=axes, t=tiled: jax.vmap(
                    lambda r: jax.lax.all_gather(r, axes, axis=-1, tiled=t), axis_name="b")(v)
        results, types = run_tree_cases(mesh, cases, check_vma=check_vma)
        for name, per_leaf in results.items():
            for rank, got in per_leaf[0].items():
                assert_bitwise_equal(got, np.asarray(expected[name][0][rank], got.dtype),
                                     f"{name} check_vma={check_vma} rank {rank}")
            assert types[name][0][3] == (frozenset({"tp"}) if check_vma else frozenset()), \
                (name, types[name])
        if not check_vma and not ON_GPU:
            over_b = {k: (lax_cases[k], cases[k][1]) for k in cases if "over b" in k}
            lax_results, lax_types = run_tree_cases(mesh, over_b, check_vma=False)
            for name, per_leaf in lax_results.items():
                assert lax_types[name] == types[name], (name, lax_types[name], types[name])
                for rank, got in results[name][0].items():
                    assert_bitwise_equal(got, per_leaf[0][rank], f"{name} vs lax rank {rank}")
    log("vmap_axes: ok")


def suite_bad_input(mesh, comm):
    n = comm.world_size
    x = global_array(np.ones((n * n, n + 1), np.float32), mesh, P("tp"))  # [n, n + 1] each

    def run(fn, arg=x, out=P("tp")):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("tp"), out_specs=out))(arg)

    expect_error(ValueError, "must equal the size of axis",
                 lambda: run(lambda v: jax_ar.reduce_scatter(v, "tp", 1)))
    expect_error(ValueError, "must be a multiple",
                 lambda: run(lambda v: jax_ar.reduce_scatter(v, "tp", 1, tiled=True)))
    expect_error(ValueError, "out of range",
                 lambda: run(lambda v: jax_ar.reduce_scatter(v, "tp", 2)))
    expect_error(TypeError, "scatter_dimension must be an int",
                 lambda: run(lambda v: jax_ar.reduce_scatter(v, "tp", "0")))
    expect_error(TypeError, "tiled must be a bool",
                 lambda: run(lambda v: jax_ar.reduce_scatter(v, "tp", tiled="yes")))
    expect_error(TypeError, "tiled must be a bool",
                 lambda: run(lambda v: jax_ar.all_gather(v, "tp", tiled=2)))
    # The ints 1 and 0 mean what True and False do, as jax.lax takes them.
    for fn in (jax_ar.reduce_scatter, jax_ar.all_gather):
        for as_int, as_bool in ((1, True), (0, False)):
            got = run(lambda v: fn(v, "tp", 0, tiled=as_int))
            want = run(lambda v: fn(v, "tp", 0, tiled=as_bool))
            for g, w in zip(got.addressable_shards, want.addressable_shards):
                assert_bitwise_equal(np.asarray(g.data), np.asarray(w.data),
                                     f"{fn.__name__} tiled={as_int}")
    expect_error(TypeError, "jax_ar.reduce_scatter: cannot sum bool",
                 lambda: run(lambda v: jax_ar.reduce_scatter(v > 0, "tp")))
    expect_error(ValueError, "to must be one of",
                 lambda: run(lambda v: jax_ar.all_gather(v, "tp", to="unreduced")))
    expect_error(ValueError, "names an axis twice",
                 lambda: run(lambda v: jax_ar.all_gather(v, ("tp", "tp"))))
    grid = Mesh(mesh.devices.reshape(1, n), ("x", "y"))
    expect_error(ValueError, "must equal the size of axes ('x', 'y') (",
                 lambda: jax.jit(jax.shard_map(
                     lambda v: jax_ar.reduce_scatter(v, ("x", "y"), 1), mesh=grid,
                     in_specs=P(("x", "y")), out_specs=P(("x", "y"))))(
                         global_array(np.ones((n * n, n + 1), np.float32), grid, P(("x", "y")))))
    expect_error(ValueError, "out of range",
                 lambda: run(lambda v: jax_ar.all_gather(v, "tp", axis=3)))
    expect_error(ValueError, "out of range",
                 lambda: run(lambda v: jax_ar.all_gather(v, "tp", axis=2, tiled=True)))
    expect_error(TypeError, "axis_name", lambda: run(lambda v: jax_ar.all_gather(v, None)))
    # An int is a positional axis for jax.lax, which rejects it here.
    expect_error(ValueError, "jax_ar.all_gather (served by jax.lax.all_gather)",
                 lambda: run(lambda v: jax_ar.all_gather(v, 0)))
    expect_error(ValueError, "outside jax.shard_map",
                 lambda: jax.jit(lambda v: jax_ar.reduce_scatter(v, "tp"))(x))
    expect_error(ValueError, "outside jax.shard_map",
                 lambda: jax.jit(lambda v: jax_ar.all_gather(v, "tp"))(x))
    log("bad_input: ok")


SUITES = suites_in(globals())


def main(argv):
    run_communicator_suites(SUITES, argv)


if __name__ == "__main__":
    main_guard(main)
