"""One rank of the all_reduce tests. Usage: ops_all_reduce.py SUITE [SUITE...]

Suites: values, specials, pytree, grad, vmap, repeat, bad_input. Every
result is compared bit for bit with the emulated reduction order, checked
against a float64 reference, and compared across processes.
"""
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_ar
from common import (DTYPES, OPS, assert_bitwise_equal, assert_close_to_float64, expect_error,
                    assert_equal_nan_aware, emulate_all_reduce, global_array, local_shards, log,
                    main_guard, suites_in, random_values, run_communicator_suites,
                    same_on_all_processes)

ON_GPU = os.environ.get("JAX_AR_TEST_PLATFORM", "cpu") == "gpu"
SEED = int(os.environ.get("JAX_AR_TEST_SEED", "0"))


def reduce_all(mesh, arrays, op, algorithm):
    """all_reduce of every array (sharded along dim 0 over "tp") in one
    jitted program; returns the invariant results."""
    def body(*xs):
        return tuple(jax_ar.all_reduce(x, "tp", op=op, algorithm=algorithm) for x in xs)

    specs = tuple(P("tp") for _ in arrays)
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=tuple(P() for _ in arrays)))
    return f(*[global_array(a, mesh, P("tp")) for a in arrays])


def check_results(name, outs, parts_list, op, exact=True):
    digests = []
    for out, parts in zip(outs, parts_list):
        want = emulate_all_reduce(parts, op)
        for device, _, data in local_shards(out):
            what = f"{name} on {device}"
            if exact:
                assert_bitwise_equal(data, want, what)
            else:
                assert_equal_nan_aware(data, want, what)
            if exact:
                assert_close_to_float64(data, parts, op, what)
        digests.append(local_shards(out)[0][2])
    same_on_all_processes(name, digests)


def suite_values(mesh, comm):
    n = comm.world_size
    rng = np.random.default_rng(SEED + 1)
    # Odd sizes, sizes that are not a multiple of 16 bytes, 2-D/3-D shapes,
    # and one large enough to need several rounds through the workspace.
    shapes = [(1,), (7,), (33,), (1000,), (3, 5, 7), (4099,)]
    big = comm.capacity_bytes("oneshot") // 4 * 3 + 5
    for algorithm in ("oneshot", "twoshot"):
        for shape in shapes + [(big,)]:
            arrays = {dt: random_values(rng, (n * shape[0],) + shape[1:], DTYPES[dt])
                      for dt in DTYPES}
            if shape == (big,):
                arrays = {"float32": arrays["float32"], "bfloat16": arrays["bfloat16"]}
            for op in OPS:
                names = list(arrays)
                outs = reduce_all(mesh, [arrays[k] for k in names], op, algorithm)
                for k, out in zip(names, outs):
                    parts = np.split(arrays[k], n)
                    check_results(f"{algorithm}/{op}/{k}{shape}", [out], [parts], op)
        log(f"values {algorithm}: ok")
    # Random (non-integer) data: exact against the emulated order.
    for algorithm in ("oneshot", "twoshot"):
        for dt in ("float32", "bfloat16", "float16"):
            x = random_values(rng, (n * 513,), DTYPES[dt], integer_valued=False)
            for op in OPS:
                out, = reduce_all(mesh, [x], op, algorithm)
                check_results(f"random/{algorithm}/{op}/{dt}", [out], [np.split(x, n)], op,
                              exact=False)
    # auto picks some algorithm for each size; results stay exact.
    for size in (8, 5000, 300_000):
        x = random_values(rng, (n * size,), np.float32)
        out, = reduce_all(mesh, [x], "sum", "auto")
        check_results(f"auto/{size}", [out], [np.split(x, n)], "sum")
    log("values: ok")


def suite_specials(mesh, comm):
    n = comm.world_size
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38,
                         3.4e38, -3.4e38, 1.0, -1.0], dtype=np.float32)
    payload_nan = np.array([0x7fc12345, 0xffc00001, 0x7f800001], dtype=np.uint32).view(np.float32)
    base = np.concatenate([specials, payload_nan])
    for dt in ("float32", "bfloat16", "float16"):
        rows = []
        for r in range(n):
            rows.append(np.roll(base, r).astype(DTYPES[dt]))
        # Every rank -0.0 everywhere: the sum must be -0.0, bit for bit.
        rows_negzero = [np.full(base.shape, -0.0, dtype=DTYPES[dt]) for _ in range(n)]
        for algorithm in ("oneshot", "twoshot"):
            for op in OPS:
                for label, parts in (("mixed", rows), ("negzero", rows_negzero)):
                    x = np.concatenate(parts)
                    out, = reduce_all(mesh, [x], op, algorithm)
                    check_results(f"specials/{label}/{algorithm}/{op}/{dt}", [out], [parts], op,
                                  exact=False)
    log("specials: ok")


def suite_pytree(mesh, comm):
    n = comm.world_size
    rng = np.random.default_rng(SEED + 2)
    tree = {
        "w": random_values(rng, (n * 3, 5), DTYPES["float32"]),
        "b": [random_values(rng, (n * 17,), DTYPES["bfloat16"]),
              random_values(rng, (n * 2, 2), DTYPES["int32"])],
        "e": np.zeros((n * 0,), np.float32),
        "h": random_values(rng, (n,), DTYPES["float16"]),
    }
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    for op in OPS:
        for algorithm in ("auto", "oneshot", "twoshot", "psum"):
            if algorithm == "psum" and ON_GPU:
                continue  # NCCL refuses ranks that share a GPU
            def body(t):
                return jax_ar.all_reduce(t, "tp", op=op, algorithm=algorithm)
            specs = jax.tree_util.tree_map(lambda _: P("tp"), tree)
            out_specs = jax.tree_util.tree_map(lambda _: P(), tree)
            f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(specs,), out_specs=out_specs))
            out = f(jax.tree_util.tree_map(lambda a: global_array(a, mesh, P("tp")), tree))
            out_leaves, out_def = jax.tree_util.tree_flatten(out)
            assert out_def == treedef, (out_def, treedef)
            for leaf, result in zip(leaves, out_leaves):
                parts = np.split(leaf, n)
                for device, _, data in local_shards(result):
                    if algorithm == "psum":  # XLA's own order: close, not bitwise
                        assert_close_to_float64(data, parts, op, f"pytree/psum/{op}")
                    else:
                        assert_bitwise_equal(data, emulate_all_reduce(parts, op),
                                             f"pytree/{algorithm}/{op}/{leaf.dtype} on {device}")
    log("pytree: ok")


def suite_grad(mesh, comm):
    n = comm.world_size
    rng = np.random.default_rng(SEED + 3)
    x = random_values(rng, (n * 6, 4), np.float32, integer_valued=False)
    parts = np.split(x, n)
    total = np.sum(np.stack(parts), axis=0)
    for op in ("sum", "avg"):
        reduced_ref = total if op == "sum" else total / n
        scale = 1.0 if op == "sum" else 1.0 / n

        def inner_grad(reduce):
            def body(v):
                return jax.grad(lambda u: jnp.sum(jnp.sin(reduce(u))))(v)
            return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))

        def outer_grad(reduce):
            f = jax.shard_map(reduce, mesh=mesh, in_specs=P("tp"), out_specs=P())
            return jax.jit(jax.grad(lambda v: jnp.sum(jnp.sin(f(v)))))

        ours = lambda u: jax_ar.all_reduce(u, "tp", op=op)
        lax_ref = (lambda u: jax.lax.psum(u, "tp")) if op == "sum" else \
                  (lambda u: jax.lax.pmean(u, "tp"))
        # Analytic: d/dx_r sum(sin(S)) = cos(S) * scale, the same for every rank.
        want = np.tile(np.cos(reduced_ref) * scale, (n, 1)).astype(np.float32)
        xs = global_array(x, mesh, P("tp"))
        for name, make in (("inner", inner_grad), ("outer", outer_grad)):
            got = make(ours)(xs)
            for device, index, data in local_shards(got):
                np.testing.assert_allclose(data, want[index], rtol=1e-5, atol=1e-6,
                                           err_msg=f"grad/{name}/{op} on {device}")
                if not ON_GPU:
                    ref = make(lax_ref)(xs)
                    ref_data = [d for dv, _, d in local_shards(ref) if dv == device][0]
                    np.testing.assert_allclose(data, ref_data, rtol=1e-5, atol=2e-6,
                                               err_msg=f"grad vs psum/{name}/{op}")
    # max/min are not differentiable, as with pmax/pmin: a clear error.
    try:
        jax.jit(jax.shard_map(lambda v: jax.grad(lambda u: jnp.sum(
            jax_ar.all_reduce(u, "tp", op="max")))(v), mesh=mesh, in_specs=P("tp"),
            out_specs=P("tp")))(global_array(x, mesh, P("tp")))
    except NotImplementedError as e:
        assert "not differentiable" in str(e)
    else:
        raise AssertionError("grad of op='max' should raise NotImplementedError")
    log("grad: ok")


def suite_vmap(mesh, comm):
    n = comm.world_size
    rng = np.random.default_rng(SEED + 4)
    x = random_values(rng, (n * 3, 4, 5), np.float32)
    def body(v):  # v: [3, 4, 5]; vmap over the leading dim
        return jax.vmap(lambda row: jax_ar.all_reduce(row, "tp"))(v)
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("tp"), out_specs=P()))
    out = f(global_array(x, mesh, P("tp")))
    want = emulate_all_reduce(np.split(x, n), "sum")
    for device, _, data in local_shards(out):
        assert_bitwise_equal(data, want, f"vmap on {device}")
    log("vmap: ok")


def suite_repeat(mesh, comm):
    """Many calls of changing sizes in one program, then the program run
    several times: epochs and buffer parity must keep every result right."""
    n = comm.world_size
    rng = np.random.default_rng(SEED + 5)
    sizes = [5, 64, 1000, 3, 20000, 1, 777]
    arrays = [random_values(rng, (n * s,), np.float32) for s in sizes]

    def body(*xs):
        outs, carry = [], 0.0
        for i, x in enumerate(xs):
            y = jax_ar.all_reduce(x + carry, "tp", algorithm=("oneshot", "twoshot")[i % 2])
            carry = y[0] * 0  # a data dependency between consecutive calls
            outs.append(y)
        return tuple(outs)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=tuple(P("tp") for _ in sizes),
                              out_specs=tuple(P() for _ in sizes)))
    inputs = [global_array(a, mesh, P("tp")) for a in arrays]
    for _ in range(20):
        outs = f(*inputs)
    for a, out in zip(arrays, outs):
        want = emulate_all_reduce(np.split(a, n), "sum")
        for device, _, data in local_shards(out):
            assert_bitwise_equal(data, want, f"repeat size {a.size // n} on {device}")
    log("repeat: ok")


def suite_bad_input(mesh, comm):
    x = global_array(np.ones((jax.device_count() * 2,), np.float32), mesh, P("tp"))

    def run(fn, arg=x):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("tp"), out_specs=P()))(arg)

    expect_error(ValueError, "op must be", lambda: run(lambda v: jax_ar.all_reduce(v, "tp", op="prod")))
    expect_error(ValueError, "algorithm must be",
                 lambda: run(lambda v: jax_ar.all_reduce(v, "tp", algorithm="ring")))
    expect_error(ValueError, "'nope'", lambda: run(lambda v: jax_ar.all_reduce(v, "nope")))
    expect_error(TypeError, "axis_name", lambda: run(lambda v: jax_ar.all_reduce(v, 3)))
    ints8 = global_array(np.ones((jax.device_count() * 2,), np.int8), mesh, P("tp"))
    expect_error(TypeError, "unsupported dtype",
                 lambda: run(lambda v: jax_ar.all_reduce(v, "tp"), ints8))
    expect_error(ValueError, "outside jax.shard_map",
                 lambda: jax.jit(lambda v: jax_ar.all_reduce(v, "tp"))(x))
    other = jax.make_mesh((jax.device_count(),), ("other",))
    expect_error(ValueError, "jax_ar.setup(mesh, 'other')", lambda: jax.jit(jax.shard_map(
        lambda v: jax_ar.all_reduce(v, "other"), mesh=other, in_specs=P("other"),
        out_specs=P()))(global_array(np.ones(jax.device_count()), other, P("other"))))
    expect_error(TypeError, "Mesh", lambda: jax_ar.setup("mesh", "tp"))
    expect_error(ValueError, "not an axis", lambda: jax_ar.setup(mesh, "dp"))
    expect_error(ValueError, "workspace_bytes", lambda: jax_ar.setup(mesh, "tp", workspace_bytes=10))
    log("bad_input: ok")


SUITES = suites_in(globals())


def main(argv):
    run_communicator_suites(SUITES, argv)


if __name__ == "__main__":
    main_guard(main)
