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
from jax.sharding import PartitionSpec as P

import jax_ar
from jax_ar import _compat
from axes_cases import run_cases
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
    expect_error(TypeError, "unsupported dtype",
                 lambda: run(lambda v: jax_ar.reduce_scatter(v.astype(jnp.int8), "tp")))
    expect_error(ValueError, "to must be one of",
                 lambda: run(lambda v: jax_ar.all_gather(v, "tp", to="reduced")))
    expect_error(ValueError, "out of range",
                 lambda: run(lambda v: jax_ar.all_gather(v, "tp", axis=3)))
    expect_error(ValueError, "out of range",
                 lambda: run(lambda v: jax_ar.all_gather(v, "tp", axis=2, tiled=True)))
    expect_error(TypeError, "axis_name", lambda: run(lambda v: jax_ar.all_gather(v, 0)))
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
