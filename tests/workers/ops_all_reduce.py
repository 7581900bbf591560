"""One rank of the all_reduce tests. Usage: ops_all_reduce.py SUITE [SUITE...]

Suites: values, specials, pytree, grad, vmap, repeat, the forms jax.lax
takes (lax_scalars, lax_forms, vmap_axes), donate, error_names, bad_input,
fallback_warnings, kernel_codes.
Every result is compared bit for bit with the emulated reduction order (or
a numpy reference), checked against a float64 reference, and compared
across processes; the lax forms also against jax.lax's results (CPU) and
types.
"""
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_ar
from common import (DTYPES, OPS, SuiteSkipped, assert_bitwise_equal, assert_close_to_float64,
                    expect_error, assert_equal_nan_aware, emulate_all_reduce, ffi_all_reduce,
                    global_array, local_shards, log, main_guard, suites_in, random_values,
                    run_communicator_suites, same_on_all_processes)
from lax_forms import compare_with_lax, leaf_type, run_tree_cases

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


LAX = {"sum": jax.lax.psum, "avg": jax.lax.pmean, "max": jax.lax.pmax, "min": jax.lax.pmin}


def numpy_reduce(parts, op):
    """The reduction of integer-valued per-rank arrays in float64 (exact),
    as every rank's expected result."""
    wide = lambda p: np.asarray(p).astype(
        np.complex128 if np.iscomplexobj(p) else np.float64)
    stack = np.stack([wide(p) for p in parts])
    out = {"sum": stack.sum(0), "avg": stack.sum(0) / len(parts), "max": stack.max(0),
           "min": stack.min(0)}[op]
    return [out] * len(parts)


def suite_lax_scalars(mesh, comm):
    """Python and numpy scalars, 0-d numpy and concrete jax arrays, traced 0-d
    arrays: the results and types jax.lax gives (psum(1, axis) is the axis
    size: jax.lax multiplies constants, nothing is exchanged)."""
    n = comm.world_size
    rng = np.random.default_rng(SEED + 6)
    constants = {"1": 1, "1.5": 1.5, "True": True, "-2": -2, "np.float32": np.float32(2.5),
                 "np.int32": np.int32(-3), "np.float64": np.float64(0.25),
                 "np.uint8": np.uint8(7), "numpy 0-d int8": np.array(5, np.int8),
                 "numpy f16[3]": np.arange(3, dtype=np.float16), "jax f32[]": jnp.float32(1.75),
                 "complex": 1 + 2j}
    dummy = [np.zeros((), np.float32)] * n
    traced = {dt: [random_values(rng, (), DTYPES[dt]) for _ in range(n)] for dt in DTYPES}
    for check_vma in (True, False):
        cases, expected = {}, {}
        for op in OPS:
            for label, c in constants.items():
                if label == "complex" and op in ("max", "min"):
                    continue  # jax.lax has no order on complex numbers either
                if ON_GPU and op in ("max", "min") and np.asarray(c).dtype.itemsize == 1:
                    continue  # bool, int8, uint8: jax.lax's (NCCL refuses ranks sharing a GPU)
                name = f"{op}({label})"
                cases[name] = (lambda v, c=c, op=op: jax_ar.all_reduce(c, "tp", op=op),
                               lambda v, c=c, op=op: LAX[op](c, "tp"), [dummy])
                expected[name] = [numpy_reduce([np.asarray(c)] * n, op)]
            for dt, parts in traced.items():
                name = f"{op}(0-d {dt})"
                cases[name] = (lambda v, op=op: jax_ar.all_reduce(v, "tp", op=op),
                               lambda v, op=op: LAX[op](v, "tp"), [parts])
                expected[name] = [[emulate_all_reduce(parts, op)] * n]
        # A psum of a constant is the axis size times it, also mixed with data.
        cases["axis size idiom"] = (lambda v: v / jax_ar.all_reduce(1, "tp"),
                                    lambda v: v / jax.lax.psum(1, "tp"), [traced["float32"]])
        compare_with_lax(mesh, cases, expected, check_vma=check_vma)
    # Sums of constants move nothing, also where jax.lax exchanges them
    # (bools, concrete jax arrays): ranks sharing a GPU cannot run XLA's
    # all-reduce (NCCL), and there is nothing to exchange.
    spec = P("tp")
    for label in ("True", "jax f32[]", "1"):
        for op in ("sum", "avg"):
            f = jax.jit(jax.shard_map(
                lambda v, c=constants[label], op=op: v + jax_ar.all_reduce(c, "tp", op=op),
                mesh=mesh, in_specs=spec, out_specs=spec))
            text = f.lower(global_array(np.zeros(n, np.float32), mesh, spec)).as_text()
            assert "all_reduce" not in text, f"{op}({label}) exchanges a constant:\n{text}"
    log(f"lax_scalars: {len(cases)} forms ok")


def suite_lax_forms(mesh, comm):
    """axis_name=() and lists, axis_index_groups, bool sums (int32, as in
    lax), dtypes the kernels do not take (jax.lax, logged), pytrees mixing
    all of them; jax_ar's results and types are lax's."""
    if ON_GPU:  # forms served by jax.lax's collectives: NCCL refuses ranks sharing a GPU
        raise SuiteSkipped("jax.lax's collectives cannot run between ranks sharing a GPU")
    n = comm.world_size
    rng = np.random.default_rng(SEED + 7)
    f32 = [random_values(rng, (2, 3), np.float32) for _ in range(n)]
    others = {name: [np.abs(random_values(rng, (5,), np.float32)).astype(name) for _ in range(n)]
              for name in ("int8", "uint8", "int16", "uint32")}
    others["complex64"] = [(random_values(rng, (3,), np.float32) + 1j).astype(np.complex64)
                           for _ in range(n)]
    flags = [rng.random((6,)) < 0.5 for _ in range(n)]
    tree = [{"f32": random_values(rng, (4,), np.float32),
             "bf16": random_values(rng, (2, 2), DTYPES["bfloat16"]),
             "i32": random_values(rng, (3,), np.int32),
             "i8": random_values(rng, (3,), np.int8),
             "0-d f16": random_values(rng, (), np.float16)} for _ in range(n)]
    leaves = {k: [t[k] for t in tree] for k in tree[0]}
    for check_vma in (True, False):
        cases, expected = {}, {}
        for op in OPS:
            # (jax.lax's pmax / pmin take a tuple only; jax_ar a list for every op.)
            cases[f"{op} list axes"] = (lambda v, op=op: jax_ar.all_reduce(v, ["tp"], op=op),
                                        lambda v, op=op: LAX[op](v, ("tp",)), [f32])
            expected[f"{op} list axes"] = [numpy_reduce(f32, op)]
            cases[f"{op} one group of all"] = (
                lambda v, op=op: jax_ar.all_reduce(v, "tp", op=op,
                                                   axis_index_groups=[list(range(n))]),
                lambda v, op=op: LAX[op](v, "tp"), [f32])
            expected[f"{op} one group of all"] = [numpy_reduce(f32, op)]
            for dt, parts in others.items():
                if dt == "complex64" and op in ("max", "min"):
                    continue
                cases[f"{op} {dt}"] = (lambda v, op=op: jax_ar.all_reduce(v, "tp", op=op),
                                       lambda v, op=op: LAX[op](v, "tp"), [parts])
                if dt != "complex64":
                    expected[f"{op} {dt}"] = [numpy_reduce(parts, op)]
            # bool: sums and averages count (int32, as in jax.lax); max / min stay bool.
            cases[f"{op} bool"] = (lambda v, op=op: jax_ar.all_reduce(v, "tp", op=op),
                                   lambda v, op=op: LAX[op](v, "tp"), [flags])
            expected[f"{op} bool"] = [[w.astype(bool) if op in ("max", "min") else w for w in
                                       numpy_reduce([f.astype(np.int32) for f in flags], op)]]
            names = list(leaves)
            cases[f"{op} pytree"] = (
                lambda *vs, op=op, names=names: jax_ar.all_reduce(
                    {"tree": dict(zip(names, vs)), "scalar": 2, "flag": vs[0] > 0}, "tp", op=op),
                lambda *vs, op=op, names=names: LAX[op](
                    {"tree": dict(zip(names, vs)), "scalar": 2, "flag": vs[0] > 0}, "tp"),
                [leaves[k] for k in names])
        cases["empty axes"] = (lambda v: jax_ar.all_reduce(v, ()),
                               lambda v: jax.lax.psum(v, ()), [f32])
        expected["empty axes"] = [f32]
        results = compare_with_lax(mesh, cases, expected, check_vma=check_vma)
        for op in OPS:  # the pytree's leaves, in tree order (flag, scalar, tree by key)
            got = results[f"{op} pytree"]
            want = [numpy_reduce([(p > 0) for p in leaves["f32"]], op), numpy_reduce([2] * n, op)]
            want += [numpy_reduce(leaves[k], op) for k in sorted(leaves)]
            for i, (per_rank, w) in enumerate(zip(got, want)):
                for rank, value in per_rank.items():
                    if i == 0 and op in ("max", "min"):  # bool stays bool
                        w_value = np.asarray(w[rank]).astype(bool)
                    else:
                        w_value = np.asarray(w[rank]).astype(value.dtype)
                    assert_bitwise_equal(value, w_value.reshape(value.shape),
                                         f"{op} pytree leaf {i} on rank {rank}")
    # Groups within the axis: jax.lax's psum refuses them under check_vma,
    # jax_ar serves both (a result per group, varying over the axis).
    if n >= 2:
        groups = [list(range(n // 2)), list(range(n // 2, n))] if n > 2 else [[1], [0]]
        for check_vma in (True, False):
            cases = {op: (lambda v, op=op: jax_ar.all_reduce(v, "tp", op=op,
                                                             axis_index_groups=groups),
                          [f32]) for op in OPS}
            results, types = run_tree_cases(mesh, cases, check_vma=check_vma)
            for op in OPS:
                assert types[op][0][3] == (frozenset({"tp"}) if check_vma else frozenset()), \
                    types[op]
                for rank, got in results[op][0].items():
                    group = next(g for g in groups if rank in g)
                    want = numpy_reduce([f32[r] for r in group], op)[0].astype(np.float32)
                    assert_bitwise_equal(got, want, f"{op} axis_index_groups={groups} rank {rank}")
            if not check_vma and not ON_GPU:
                theirs = {op: (lambda v, op=op: LAX[op](v, "tp", axis_index_groups=groups),
                               [f32]) for op in OPS}
                lax_results, _ = run_tree_cases(mesh, theirs, check_vma=False)
                for op in OPS:
                    for rank, got in results[op][0].items():
                        assert_bitwise_equal(got, lax_results[op][0][rank], f"{op} groups vs lax")
    log("lax_forms: ok")


def suite_vmap_axes(mesh, comm):
    """jax.vmap(axis_name="b") inside shard_map: all_reduce over "b", and
    over ("tp", "b") and ("b", "tp"), equals jax.lax's reduction over the
    vmapped axis (which itself fails under check_vma in jax 0.10: there
    the numpy reference decides); and under vmap alone, outside shard_map."""
    n = comm.world_size
    rng = np.random.default_rng(SEED + 8)
    batch = 4  # with n a power of two, averages of integers are exact too
    xs = {dt: [random_values(rng, (batch, 4), DTYPES[dt]) for _ in range(n)]
          for dt in ("float32", "int32", "bfloat16")}

    def under_vmap(reduce):
        return lambda v: jax.vmap(reduce, axis_name="b")(v)

    for check_vma in (True, False):
        cases, expected = {}, {}
        for op in OPS:
            for dt, parts in xs.items():
                for axes in ("b", ("tp", "b"), ("b", "tp")):
                    name = f"{op} {dt} over {axes}"
                    cases[name] = (under_vmap(lambda r, axes=axes, op=op: jax_ar.all_reduce(
                        r, axes, op=op)), under_vmap(lambda r, axes=axes, op=op: LAX[op](r, axes)),
                        [parts])
                    if axes == "b":  # each rank: over its own batch
                        want = [np.broadcast_to(numpy_reduce(list(p), op)[0], p.shape)
                                for p in parts]
                    else:  # over every rank's batch
                        every = [row for p in parts for row in p]
                        want = [np.broadcast_to(numpy_reduce(every, op)[0], parts[0].shape)] * n
                    expected[name] = [want]
        if check_vma:  # jax.lax.psum over a vmap axis fails here: values and types only
            results, types = run_tree_cases(mesh, {k: (fn, a) for k, (fn, _, a) in cases.items()})
            for name, per_leaf in results.items():
                vary = frozenset() if "tp" in name else frozenset({"tp"})
                assert types[name][0][3] == vary, (name, types[name])
                for rank, got in per_leaf[0].items():
                    assert_bitwise_equal(got, expected[name][0][rank].astype(got.dtype),
                                         f"{name} rank {rank}")
        else:
            compare_with_lax(mesh, cases, expected, check_vma=False)
    # vmap alone (no shard_map): exactly jax.lax's batched reduction.
    y = random_values(rng, (batch, 5), np.float32)
    for op in OPS:
        ours = jax.vmap(lambda r, op=op: jax_ar.all_reduce(r, "b", op=op), axis_name="b")(y)
        theirs = jax.vmap(lambda r, op=op: LAX[op](r, "b"), axis_name="b")(y)
        assert_bitwise_equal(np.asarray(ours), np.asarray(theirs), f"vmap alone {op}")
        assert leaf_type(ours) == leaf_type(theirs), (leaf_type(ours), leaf_type(theirs))
    log("vmap_axes: ok")


def suite_donate(mesh, comm):
    """A donated input: the all-reduce's result reuses its buffer (the custom
    call aliases its output to its operand), and results stay exact; an
    input that is not donated stays valid (XLA copies where needed)."""
    n = comm.world_size
    rng = np.random.default_rng(SEED + 9)
    a = random_values(rng, (n * 1024,), np.float32)
    b = random_values(rng, (n * 7, 3), DTYPES["bfloat16"])

    def body(u, v):
        return jax_ar.all_reduce((u, v), "tp")

    specs = (P("tp"), P("tp"))
    for donate in (True, False):
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=specs),
                    donate_argnums=(0, 1) if donate else ())
        ins = [global_array(a, mesh, P("tp")), global_array(b, mesh, P("tp"))]
        compiled = f.lower(*ins).compile()
        calls = [line for line in compiled.as_text().splitlines()
                 if "custom_call_target=\"jax_ar_all_reduce\"" in line]
        assert calls and all("output_to_operand_aliasing" in c for c in calls), calls
        if donate:
            stats = compiled.memory_analysis()
            assert stats.alias_size_in_bytes >= a.nbytes // n, stats
        outs = f(*ins)
        for x, out in zip((a, b), outs):
            want = emulate_all_reduce(np.split(x, n), "sum")
            for device, _, data in local_shards(out):
                assert_bitwise_equal(data, want, f"donate={donate} on {device}")
        assert all(i.is_deleted() for i in ins) == donate, [i.is_deleted() for i in ins]
        if not donate:  # the inputs are intact
            for x, i in zip((a, b), ins):
                for s in i.addressable_shards:
                    assert_bitwise_equal(np.asarray(s.data), x[s.index], "input after the call")
    log("donate: ok")


def suite_error_names(mesh, comm):
    """Every error names the public function the user called, also where the
    call's lax collective raised it."""
    n = comm.world_size
    x = global_array(np.ones((n * 2, 128), np.float32), mesh, P("tp"))
    g = jnp.ones(128, jnp.float32)
    calls = {  # over axis `a`
        "jax_ar.all_reduce": lambda v, a: jax_ar.all_reduce(v, a),
        "jax_ar.reduce_scatter": lambda v, a: jax_ar.reduce_scatter(v, a, 1, tiled=True),
        "jax_ar.all_gather": lambda v, a: jax_ar.all_gather(v, a),
        "jax_ar.all_reduce_rms_norm": lambda v, a: jax_ar.all_reduce_rms_norm(v, v, g, a)[0],
    }
    for what, fn in calls.items():
        expect_error(ValueError, f"{what} called outside jax.shard_map",
                     lambda: jax.jit(lambda v: fn(v, "tp"))(x))
        expect_error(ValueError, f"{what} called outside jax.shard_map", lambda: fn(x, "tp"))
        expect_error(ValueError, f"{what} called over axis 'nope'",
                     lambda: jax.jit(jax.shard_map(lambda v: fn(v, "nope"), mesh=mesh,
                                                   in_specs=P("tp"), out_specs=P("tp"),
                                                   check_vma=False))(x))
    expect_error(ValueError, "jax_ar.rms_norm: eps", lambda: jax_ar.rms_norm(x, g, eps=-1.0))

    def run(fn):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("tp"), out_specs=P("tp"),
                                     check_vma=False))(x)

    for groups in ([[0]], [[0, 0]] + [[i] for i in range(1, n)], [list(range(n + 1))]):
        expect_error(ValueError, "jax_ar.all_reduce: axis_index_groups must cover",
                     lambda: run(lambda v: jax_ar.all_reduce(v, "tp", axis_index_groups=groups)))
    # jax.lax rejects these too (a sum of bool when lowered, a tiled gather of
    # a scalar when traced); the messages name jax_ar's function.
    expect_error(TypeError, "jax_ar.reduce_scatter: cannot sum bool",
                 lambda: run(lambda v: jax_ar.reduce_scatter(v > 0, "tp", 1, tiled=True)))
    expect_error(ValueError, "jax_ar.all_gather: axis 0 is out of range",
                 lambda: run(lambda v: jax_ar.all_gather(v[0, 0], "tp", tiled=True)[None]))
    # to="reduced" without check_vma: jax.lax refuses it up to jax 0.12.0 and
    # takes it from 0.12.0.1; jax_ar does what jax.lax does, naming itself.
    def local(out):
        return np.stack([np.asarray(s.data) for s in out.addressable_shards])

    try:
        lax_gathered = local(run(lambda v: jax.lax.all_gather(v, "tp", to="reduced")))
    except ValueError:
        expect_error(ValueError, "jax_ar.all_gather (served by jax.lax.all_gather)",
                     lambda: run(lambda v: jax_ar.all_gather(v, "tp", to="reduced")))
    else:
        assert_bitwise_equal(local(run(lambda v: jax_ar.all_gather(v, "tp", to="reduced"))),
                             lax_gathered, "all_gather to='reduced' vs jax.lax")
    expect_error(TypeError, "jax_ar.all_reduce: a leaf of type str",
                 lambda: run(lambda v: jax_ar.all_reduce({"a": v, "b": "text"}, "tp")["a"]))
    log("error_names: ok")


def suite_bad_input(mesh, comm):
    x = global_array(np.ones((jax.device_count() * 2,), np.float32), mesh, P("tp"))

    def run(fn, arg=x):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("tp"), out_specs=P()))(arg)

    expect_error(ValueError, "op must be", lambda: run(lambda v: jax_ar.all_reduce(v, "tp", op="prod")))
    expect_error(ValueError, "algorithm must be",
                 lambda: run(lambda v: jax_ar.all_reduce(v, "tp", algorithm="ring")))
    expect_error(ValueError, "'nope'", lambda: run(lambda v: jax_ar.all_reduce(v, "nope")))
    expect_error(TypeError, "axis_name", lambda: run(lambda v: jax_ar.all_reduce(v, None)))
    # An int is a positional axis for jax.lax.psum, which fails on this one
    # (under check_vma, on any): an error that names jax_ar's function.
    expect_error(NotImplementedError, "jax_ar.all_reduce",
                 lambda: run(lambda v: jax_ar.all_reduce(v, 3)))
    expect_error(ValueError, "names an axis twice",
                 lambda: run(lambda v: jax_ar.all_reduce(v, ("tp", "tp"))))
    expect_error(ValueError, "outside jax.shard_map",
                 lambda: jax.jit(lambda v: jax_ar.all_reduce(v, "tp"))(x))
    # A vmap inside the shard_map that binds the mesh axis's name again:
    # jax.lax reduces over the vmap's axis, jax_ar would over the mesh's.
    shadow = jax.device_count() + 1  # a vmap size other than the axis's
    expect_error(ValueError, "names both a manual axis", lambda: jax.jit(jax.shard_map(
        lambda v: jax.vmap(lambda r: jax_ar.all_reduce(r, "tp"), axis_name="tp")(v),
        mesh=mesh, in_specs=P("tp"), out_specs=P("tp"), check_vma=False))(
            global_array(np.ones((jax.device_count() * shadow, 2), np.float32), mesh, P("tp"))))
    other = jax.make_mesh((jax.device_count(),), ("other",))
    expect_error(ValueError, "jax_ar.setup(mesh, 'other')", lambda: jax.jit(jax.shard_map(
        lambda v: jax_ar.all_reduce(v, "other"), mesh=other, in_specs=P("other"),
        out_specs=P()))(global_array(np.ones(jax.device_count()), other, P("other"))))
    expect_error(TypeError, "Mesh", lambda: jax_ar.setup("mesh", "tp"))
    expect_error(ValueError, "not an axis", lambda: jax_ar.setup(mesh, "dp"))
    expect_error(ValueError, "workspace_bytes", lambda: jax_ar.setup(mesh, "tp", workspace_bytes=10))
    log("bad_input: ok")


class _Levels(logging.Handler):
    """(level, message) of every record of the "jax_ar" logger."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.seen = []

    def emit(self, record):
        self.seen.append((record.levelno, record.getMessage()))


def suite_fallback_warnings(mesh, comm):
    """A fallback that costs speed warns once per reason and call site,
    naming the reason and what to do; an axis of size 1 and constants stay
    quiet (DEBUG); JAX_AR_LOG=error (the logger's level) silences warnings."""
    n = comm.world_size
    handler, logger = _Levels(), jax_ar.config.logger
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)

    # Warnings come from the plan, at trace time: the programs are lowered,
    # never run, since the fallbacks are jax.lax's collectives and NCCL
    # refuses ranks that share a GPU (on jax 0.11.2 each refused run then
    # waited 60 s for a peer that had given up: a hung GPU test).
    def lower(fn, x):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("tp"),
                                     out_specs=P())).lower(global_array(x, mesh, P("tp")))

    def warnings(fragment):
        return [m for lv, m in handler.seen if lv == logging.WARNING and fragment in m]

    try:
        for size in (4, 5, 6):  # three traces of one call site
            x = np.ones((n * size,), np.int8)
            lower(lambda v: jax_ar.all_reduce(v, "tp"), x)
        found = warnings("do not take int8")
        assert len(found) == 1, handler.seen
        assert "jax.lax.psum" in found[0] and "cast to" in found[0] and \
            "ops_all_reduce.py:" in found[0], found
        # Another call site of the same fallback says so again, once.
        lower(lambda v: jax_ar.all_reduce(v, "tp", op="max"), np.ones((n * 4,), np.int8))
        assert len(warnings("do not take int8")) == 2, handler.seen

        # Nothing exchanged: a size-1 axis, a constant, an empty array.
        before = len(handler.seen)
        wide = jax.sharding.Mesh(mesh.devices.reshape(1, n), ("one", "tp"))
        x = np.arange(n * 4, dtype=np.float32)
        jax.jit(jax.shard_map(
            lambda v: (jax_ar.all_reduce(v, "one"), jax_ar.all_reduce(3.0, "tp"),
                       jax_ar.all_reduce(v[:0], "tp")),
            mesh=wide, in_specs=P("tp"), out_specs=(P("tp"), P(), P()))).lower(
                global_array(x, wide, P("tp")))
        quiet = handler.seen[before:]
        assert quiet and all(lv == logging.DEBUG for lv, _ in quiet), quiet
        assert any("size-1" in m for _, m in quiet) and any("not traced" in m for _, m in quiet)

        # JAX_AR_LOG=error: the logger's level drops the warnings.
        logger.setLevel(logging.ERROR)
        before = len(handler.seen)
        lower(lambda v: jax_ar.all_reduce(v, "tp"), np.ones((n * 4,), np.uint32))
        assert len(handler.seen) == before, handler.seen[before:]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    log("fallback_warnings: ok")


def suite_kernel_codes(mesh, comm):
    """The algorithm attribute names the kernel the handler runs, in the
    compiled module's numbering; the CPU module has no LL two-shot and says
    so (its plans never send it)."""
    assert jax_ar._native.ALGORITHM_CODES == {"oneshot": 1, "twoshot": 2, "twoshot_ll": 3}
    if ON_GPU:
        raise SuiteSkipped("the CUDA handler runs every code")
    x = global_array(np.ones((comm.world_size * 4,), np.float32), mesh, P("tp"))
    expect_error(Exception, "algorithm 3 (twoshot_ll", lambda: jax.block_until_ready(jax.jit(
        jax.shard_map(ffi_all_reduce(comm, "twoshot_ll"), mesh=mesh, in_specs=P("tp"),
                      out_specs=P("tp"), check_vma=False))(x)))
    log("kernel_codes: ok")


SUITES = suites_in(globals())


def main(argv):
    run_communicator_suites(SUITES, argv)


if __name__ == "__main__":
    main_guard(main)
