"""One rank of the jax_ar.matmul_all_reduce tests.
Usage: ops_matmul_all_reduce.py [SUITE...]

Suites: shard_map, jit, jit_2d, jit_unplaced, independent_calls, grad, vmap, fallback,
bad_input; `before_setup`, alone, runs without jax_ar.setup. The data are
small integers, so every partial product and sum is exact in every dtype
and order: results are compared bit for bit with
numpy's x @ w, with jnp + psum inside shard_map and with XLA's own
partitioning of x @ w in plain jit. Where XLA's collectives cannot run
(ranks sharing a GPU: NCCL refuses them) the comparisons with psum and
XLA are left out and numpy's stays.
"""
import contextlib
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_ar
from common import (Records, SuiteSkipped, assert_bitwise_equal, expect_error, global_array, local_shards,
                    log, main_guard, run_suites, suites_in)
from norm_checks import FLOAT_DTYPES

SEED = int(os.environ.get("JAX_AR_TEST_SEED", "0"))
DTYPES = dict(FLOAT_DTYPES, int32=np.dtype(np.int32))


def xla_collectives(comms) -> bool:
    """Whether XLA's own collectives (psum, XLA's partitioning) can run here."""
    return comms[0].psum_unavailable is None


def small_integers(rng, shape, dtype):
    """Values in [-3, 3]: sums of up to 2**11 products stay exact in float16."""
    return rng.integers(-3, 4, size=shape).astype(dtype)


def exact_product(x, w):
    return (x.astype(np.float64) @ w.astype(np.float64)).astype(np.result_type(x, w))


def check_shards(y, want, what):
    for device, index, data in local_shards(y):
        assert_bitwise_equal(data, want[index], f"{what} on {device}")


def meshes():
    """A 1-D "tp" mesh of every device, and ("dp", "tp") over 2 x n/2 when
    there are 4 or more; Explicit axes (jax's default) and Auto ones."""
    n = jax.device_count()
    out = [jax.make_mesh((n,), ("tp",)),
           jax.make_mesh((n,), ("tp",), axis_types=(AxisType.Auto,))]
    if n >= 4 and n % 2 == 0:
        out.append(jax.make_mesh((2, n // 2), ("dp", "tp")))
    return out


def one_axis_meshes(comms):
    """(mesh, devices, axis type, whether Explicit) of the 1-D "tp" meshes
    (meshes()'s first two: Explicit axes, then Auto ones)."""
    for comm in comms[:2]:
        kind = comm.mesh.axis_types[0]
        yield comm.mesh, comm.mesh.devices.size, kind, kind == AxisType.Explicit


def suite_shard_map(comms):
    """Inside shard_map: the local product and jax_ar's all-reduce equal
    numpy's product and jnp.dot + psum, every dtype, 2-D and 3-D x."""
    rng = np.random.default_rng(SEED + 41)
    mesh = comms[0].mesh
    n = mesh.devices.size
    for name, dtype in DTYPES.items():
        for x_shape in ((4, 16 * n), (2, 3, 8 * n)):
            x = small_integers(rng, x_shape, dtype)
            w = small_integers(rng, (x_shape[-1], 24), dtype)
            lead = (None,) * (len(x_shape) - 1)
            specs = (P(*lead, "tp"), P("tp", None))
            for check_vma in (True, False):
                f = jax.jit(jax.shard_map(lambda a, b: jax_ar.matmul_all_reduce(a, b, "tp"),
                                          mesh=mesh, in_specs=specs, out_specs=P(),
                                          check_vma=check_vma))
                ref = jax.jit(jax.shard_map(lambda a, b: jax.lax.psum(a @ b, "tp"), mesh=mesh,
                                            in_specs=specs, out_specs=P(), check_vma=check_vma))
                args = (global_array(x, mesh, specs[0]), global_array(w, mesh, specs[1]))
                y = f(*args)
                what = f"shard_map {name} {x_shape} check_vma={check_vma}"
                check_shards(y, exact_product(x, w), what)
                if xla_collectives(comms):
                    check_shards(y, np.asarray(ref(*args).addressable_shards[0].data),
                                 what + " vs psum")
                assert "jax_ar_all_reduce" in f.lower(*args).as_text(), what
    log("shard_map: ok")


def check_jit(mesh, x, w, x_spec, w_spec, what, out_spec=None, xla=True):
    """jit of matmul_all_reduce on arrays laid out by the specs: bit for bit
    x @ w, the same as XLA's partitioning of x @ w, jax_ar's all-reduce in
    the compiled program and no XLA all-reduce; returns the result."""
    args = (global_array(x, mesh, x_spec), global_array(w, mesh, w_spec))
    f = jax.jit(lambda a, b: jax_ar.matmul_all_reduce(a, b, "tp"))
    y = f(*args)
    want = exact_product(x, w)
    check_shards(y, want, what)
    if xla:
        out_sharding = None if out_spec is None else NamedSharding(mesh, out_spec)
        theirs = jax.jit(lambda a, b: jnp.matmul(a, b, out_sharding=out_sharding))(*args)
        theirs = {device: data for device, _, data in local_shards(theirs)}
        for device, _, data in local_shards(y):
            assert_bitwise_equal(data, theirs[device], f"{what} vs XLA on {device}")
    hlo = f.lower(*args).compile().as_text()
    assert "jax_ar_all_reduce" in hlo, f"{what}: no jax_ar all-reduce\n{hlo[-3000:]}"
    assert "all-reduce(" not in hlo and "all-reduce-start" not in hlo, \
        f"{what}: XLA reduces too\n{hlo[-3000:]}"
    return y


def suite_jit(comms):
    """Plain jit on sharded arrays over the 1-D mesh, Explicit axes under
    jax.set_mesh (as models run) and Auto axes without: K sharded (the
    row-parallel layout), or x and w replicated (the call asks for K sharded
    itself); every dtype."""
    rng = np.random.default_rng(SEED + 42)
    for mesh, n, kind, explicit in one_axis_meshes(comms):
        out_spec = P() if explicit else None
        with jax.set_mesh(mesh) if explicit else contextlib.nullcontext():
            for name, dtype in DTYPES.items():
                x = small_integers(rng, (6, 16 * n), dtype)
                w = small_integers(rng, (16 * n, 40), dtype)
                for x_spec, w_spec in ((P(None, "tp"), P("tp", None)), (P(), P())):
                    y = check_jit(mesh, x, w, x_spec, w_spec, f"jit {kind} {name} {x_spec}",
                                  out_spec, xla_collectives(comms))
                    assert y.sharding.is_equivalent_to(NamedSharding(mesh, P()), 2), y.sharding
            # Three leading dimensions.
            x = small_integers(rng, (2, 3, 8 * n), np.float32)
            w = small_integers(rng, (8 * n, 16), np.float32)
            check_jit(mesh, x, w, P(None, None, "tp"), P("tp", None), f"jit {kind} 3-D",
                      out_spec, xla_collectives(comms))
    log("jit: ok")


def suite_jit_2d(comms):
    """A ("dp", "tp") mesh: the batch sharded over dp keeps its sharding, K
    over tp is summed by jax_ar within each dp group."""
    if len(comms) < 3:
        raise SuiteSkipped("needs 4 or more devices for a 2 x n/2 mesh")
    rng = np.random.default_rng(SEED + 43)
    mesh = comms[2].mesh
    tp = mesh.shape["tp"]
    x = small_integers(rng, (8, 32 * tp), np.dtype(FLOAT_DTYPES["bfloat16"]))
    w = small_integers(rng, (32 * tp, 24), np.dtype(FLOAT_DTYPES["bfloat16"]))
    y = check_jit(mesh, x, w, P("dp", "tp"), P("tp", None), "jit 2-D", P("dp", None),
                  xla_collectives(comms))
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, P("dp", None)), 2), y.sharding
    log("jit_2d: ok")


def suite_jit_unplaced(comms):
    """Under jax.set_mesh, operands that carry no mesh: numpy arrays, a bare
    PartitionSpec constraint (reshard where the axes are Explicit) and
    arrays made inside jit. XLA's partitioner then names no mesh; the call
    still partitions over the set_mesh mesh and sums with jax_ar's kernel."""
    rng = np.random.default_rng(SEED + 48)
    for mesh, n, kind, explicit in one_axis_meshes(comms):
        place = jax.sharding.reshard if explicit else jax.lax.with_sharding_constraint
        x = small_integers(rng, (4, 8 * n), np.float32)
        w = small_integers(rng, (8 * n, 12), np.float32)
        cases = {
            "numpy operands": (lambda a, b: jax_ar.matmul_all_reduce(a, b, "tp"), (x, w)),
            "bare PartitionSpec": (lambda a, b: jax_ar.matmul_all_reduce(
                place(a, P(None, "tp")), place(b, P("tp", None)), "tp"), (x, w)),
            "made inside jit": (lambda: jax_ar.matmul_all_reduce(
                jnp.asarray(x) * 2, jnp.asarray(w), "tp"), ()),
        }
        for name, (fn, args) in cases.items():
            what = f"jit {kind} {name}"
            with jax.set_mesh(mesh):
                f = jax.jit(fn)
                y = f(*args)
                hlo = f.lower(*args).compile().as_text()
            scale = 2 if name == "made inside jit" else 1
            check_shards(y, exact_product(x * scale, w), what)
            assert "jax_ar_all_reduce" in hlo, f"{what}: no jax_ar all-reduce\n{hlo[-3000:]}"
    log("jit_unplaced: ok")


def suite_independent_calls(comms):
    """Two calls that share no data in one jitted program (a parallel
    attention + MLP block): on CPU devices they are chained, so every rank
    meets them in the same order; same shapes, so swapped calls would show
    as wrong values, not as an error."""
    rng = np.random.default_rng(SEED + 44)
    mesh = comms[0].mesh
    n = mesh.devices.size
    x = small_integers(rng, (4, 16 * n), np.float32)
    w1, w2, w3 = (small_integers(rng, (16 * n, 32), np.float32) for _ in range(3))
    args = [global_array(x, mesh, P(None, "tp"))] + [global_array(w, mesh, P("tp", None))
                                                    for w in (w1, w2, w3)]
    f = jax.jit(lambda a, b, c, d: [jax_ar.matmul_all_reduce(a, v, "tp") for v in (b, c, d)])
    for _ in range(3):
        for y, w in zip(f(*args), (w1, w2, w3)):
            check_shards(y, exact_product(x, w), "independent calls")
    hlo = f.lower(*args).compile().as_text()
    if jax.devices()[0].platform == "cpu":
        assert hlo.count("jax_ar_order") >= 2, "independent calls are not chained on CPU"
    log("independent_calls: ok")


def suite_grad(comms):
    """Derivatives in both modes against the plain product's: jax.grad of a
    loss through matmul_all_reduce (jit on sharded arrays; inside shard_map
    with and without check_vma) equals that of jnp.matmul (+ psum)."""
    rng = np.random.default_rng(SEED + 45)
    mesh = comms[0].mesh
    n = mesh.devices.size
    x = rng.standard_normal((4, 16 * n)).astype(np.float32)
    w = rng.standard_normal((16 * n, 24)).astype(np.float32)
    weights = jnp.asarray(rng.standard_normal((4, 24)).astype(np.float32))
    args = (global_array(x, mesh, P(None, "tp")), global_array(w, mesh, P("tp", None)))
    loss = lambda y: jnp.sum(jnp.sin(y) * weights)  # noqa: E731
    got = jax.jit(jax.grad(lambda a, b: loss(jax_ar.matmul_all_reduce(a, b, "tp")),
                           argnums=(0, 1)))(*args)
    want = jax.grad(lambda a, b: loss(a @ b), argnums=(0, 1))(jnp.asarray(x), jnp.asarray(w))
    for name, g, wg in zip(("x", "w"), got, want):
        for device, index, data in local_shards(g):
            # The sums over K run in another order: float32 rounding apart.
            np.testing.assert_allclose(data, np.asarray(wg)[index], rtol=1e-4,
                                       atol=1e-5 * float(np.abs(wg).max()),
                                       err_msg=f"jit grad wrt {name} on {device}")
    specs = (P(None, "tp"), P("tp", None))
    if not xla_collectives(comms):  # the twin and shard_map's transposes use psum
        log("grad: jit only (XLA's collectives cannot run here)")
        return
    for check_vma in (True, False):
        def grads(product):
            sm = jax.shard_map(product, mesh=mesh, in_specs=specs, out_specs=P(),
                               check_vma=check_vma)
            return jax.jit(jax.grad(lambda a, b: loss(sm(a, b)), argnums=(0, 1)))(*args)
        got = grads(lambda a, b: jax_ar.matmul_all_reduce(a, b, "tp"))
        want = grads(lambda a, b: jax.lax.psum(a @ b, "tp"))
        for name, g, wg in zip(("x", "w"), got, want):
            for (device, _, data), (_, _, ref) in zip(local_shards(g), local_shards(wg)):
                np.testing.assert_allclose(data, ref, rtol=1e-5, atol=1e-5,
                                           err_msg=f"shard_map grad wrt {name} "
                                                   f"check_vma={check_vma} on {device}")
    log("grad: ok")


def suite_vmap(comms):
    """vmap over a batch of x (more leading dimensions) in both modes; a
    weight per batch member takes XLA's own ops."""
    rng = np.random.default_rng(SEED + 46)
    mesh = comms[0].mesh
    n = mesh.devices.size
    x = small_integers(rng, (3, 4, 16 * n), np.float32)
    w = small_integers(rng, (16 * n, 8), np.float32)
    ws = small_integers(rng, (3, 16 * n, 8), np.float32)
    want = np.stack([exact_product(x[b], w) for b in range(3)])
    xs = global_array(x, mesh, P(None, None, "tp"))
    y = jax.jit(jax.vmap(lambda a, b: jax_ar.matmul_all_reduce(a, b, "tp"),
                         in_axes=(0, None)))(xs, global_array(w, mesh, P("tp", None)))
    check_shards(y, want, "jit vmap")
    y = jax.jit(jax.shard_map(jax.vmap(lambda a, b: jax_ar.matmul_all_reduce(a, b, "tp"),
                                       in_axes=(0, None)),
                              mesh=mesh, in_specs=(P(None, None, "tp"), P("tp", None)),
                              out_specs=P()))(xs, global_array(w, mesh, P("tp", None)))
    check_shards(y, want, "shard_map vmap")
    if not xla_collectives(comms):  # a weight per member is XLA's to partition
        log("vmap: ok (no weight per member: XLA's collectives cannot run here)")
        return
    y = jax.jit(jax.vmap(lambda a, b: jax_ar.matmul_all_reduce(a, b, "tp")))(
        xs, global_array(ws, mesh, P(None, "tp", None)))
    check_shards(y, np.stack([exact_product(x[b], ws[b]) for b in range(3)]), "vmap over w")
    log("vmap: ok")


def suite_fallback(comms):
    """No communicator for the axis (a mesh jax_ar.setup never saw): jit
    still computes the product, summed by psum, and says so once."""
    if not xla_collectives(comms):
        raise SuiteSkipped(comms[0].psum_unavailable)
    rng = np.random.default_rng(SEED + 47)
    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("other",))
    x = small_integers(rng, (4, 16 * n), np.float32)
    w = small_integers(rng, (16 * n, 8), np.float32)
    records = Records()
    jax_ar.config.logger.addHandler(records)
    level = jax_ar.config.logger.level
    jax_ar.config.logger.setLevel(logging.INFO)
    try:
        args = (global_array(x, mesh, P(None, "other")), global_array(w, mesh, P("other", None)))
        y = jax.jit(lambda a, b: jax_ar.matmul_all_reduce(a, b, "other"))(*args)
    finally:
        jax_ar.config.logger.removeHandler(records)
        jax_ar.config.logger.setLevel(level)
    check_shards(y, exact_product(x, w), "fallback")
    assert any("matmul_all_reduce over 'other' lowers to jax.lax.psum" in m
               for m in records.messages), \
        records.messages
    # psum inside the partitioned body under jax.set_mesh (as models run):
    # its reduction must not carry the mesh's sharding annotations.
    for mesh, _, kind, _ in one_axis_meshes(comms):
        args = (global_array(x, mesh, P(None, "tp")), global_array(w, mesh, P("tp", None)))
        with jax.set_mesh(mesh):
            y = jax.jit(lambda a, b: jax_ar.matmul_all_reduce(a, b, "tp", algorithm="psum"))(*args)
        check_shards(y, exact_product(x, w), f"psum under jax.set_mesh, {kind}")
    log("fallback: ok")


def suite_bad_input(comms):
    mesh = comms[0].mesh
    n = mesh.devices.size
    mar = jax_ar.matmul_all_reduce
    x = global_array(np.ones((2, 8 * n), np.float32), mesh, P(None, "tp"))
    w = global_array(np.ones((8 * n, 4), np.float32), mesh, P("tp", None))
    expect_error(ValueError, "w [K, N]", lambda: jax.jit(lambda a: mar(a, a[0], "tp"))(x))
    expect_error(ValueError, "x has 8 features but w has",
                 lambda: jax.jit(lambda a, b: mar(a[:, :8], b, "tp"))(x, w))
    expect_error(TypeError, "the product has dtype int8",
                 lambda: jax.jit(lambda a, b: mar(a.astype(jnp.int8), b.astype(jnp.int8),
                                                  "tp"))(x, w))
    expect_error(ValueError, "algorithm must be", lambda: mar(x, w, "tp", algorithm="ring"))
    expect_error(TypeError, "axis_name must be", lambda: mar(x, w, ("tp",)))
    expect_error(ValueError, "axis 'dp' is not an axis of the call's mesh ('tp',)",
                 lambda: jax.jit(lambda a, b: mar(a, b, "dp"))(x, w))
    if len(comms) >= 3:
        mesh2 = comms[2].mesh
        f = jax.shard_map(lambda a, b: mar(a, b, "tp"), mesh=mesh2, in_specs=(P("dp"), P()),
                          out_specs=P("dp"), axis_names={"dp"})
        expect_error(ValueError, "do not include 'tp'", lambda: jax.jit(f)(
            global_array(np.ones((4, 8), np.float32), mesh2, P("dp")),
            global_array(np.ones((8, 4), np.float32), mesh2, P())))
    log("bad_input: ok")


SUITES = suites_in(globals())


def before_setup(_):
    """In a process where jax_ar.setup never ran, calls that need no
    communicator still run: plain jit's product, summed by psum, and
    all-reduces over a vmap axis (the CPU lowering's call-order links need
    jax_ar's CPU targets, which setup would otherwise have registered)."""
    rng = np.random.default_rng(SEED + 53)
    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("tp",))
    x = small_integers(rng, (4, 16 * n), np.float32)
    w = small_integers(rng, (16 * n, 8), np.float32)
    args = (global_array(x, mesh, P(None, "tp")), global_array(w, mesh, P("tp", None)))
    y = jax.jit(lambda a, b: jax_ar.matmul_all_reduce(a, b, "tp"))(*args)
    check_shards(y, exact_product(x, w), "before setup")
    # Two all-reduces over a vmap axis (served without a communicator),
    # ordered on CPU as every pair of jax_ar calls is.
    v = small_integers(rng, (3, 4), np.float32)
    def two_calls(a):
        return jax_ar.all_reduce(a, "i") + jax_ar.all_reduce(a, "i", op="max")

    both = jax.jit(jax.vmap(two_calls, axis_name="i"))(v)
    assert_bitwise_equal(np.asarray(both), np.broadcast_to(v.sum(0) + v.max(0), v.shape),
                         "two vmap all-reduces before setup")
    log("before_setup: ok")


def main(argv):
    if argv == ["before_setup"]:  # its own launch: no communicator anywhere
        run_suites({"before_setup": before_setup}, argv, None)
        return
    comms = [jax_ar.setup(mesh, "tp") for mesh in meshes()]
    log(f"{jax.device_count()} devices, {jax.process_count()} processes, "
        f"meshes {[dict(c.mesh.shape) for c in comms]}")
    run_suites(SUITES, argv or list(SUITES), comms)
    for comm in comms:
        comm.close()


if __name__ == "__main__":
    main_guard(main)
