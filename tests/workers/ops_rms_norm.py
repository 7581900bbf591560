"""One rank of the jax_ar.rms_norm tests. Usage: ops_rms_norm.py [SUITE...]

Suites: values, mixed_dtypes, sharded, sharded_unplaced, shard_map, grad,
mixed_grad, vmap, bad_input. Values are checked against numpy (residual_out
bit for bit, out against float64); the derivatives against jax's derivative
of the plain jnp formula.
"""
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_ar
from common import (assert_equal_nan_aware, expect_error, global_array, local_shards, log,
                    main_guard, run_suites, suites_in)
from norm_checks import (FLOAT_DTYPES, add_residual, assert_norm_close,
                         norm_float64, random_normal, scale_vector)

SEED = int(os.environ.get("JAX_AR_TEST_SEED", "0"))


def numpy_rms_norm(x, gamma, eps, residual=None, offset=0.0):
    """(float64 out reference, residual_out or None) from numpy alone."""
    gamma = scale_vector(gamma, offset)
    if residual is None:
        return norm_float64(x, gamma, eps), None
    residual_out = add_residual(x.astype(np.float32), residual)
    return norm_float64(residual_out, gamma, eps), residual_out


def random_cases(rng):
    """(shape, dtype name, eps, with residual) covering one token, 1-D and
    3-D inputs, hidden sizes the CUDA kernel takes (multiples of 8 up to
    8192) and ones it does not (XLA's ops serve those)."""
    cases = [((1, 128), "bfloat16", 1e-6, True), ((128,), "float32", 1e-5, False),
             ((2, 3, 1024), "float16", 1e-6, True), ((5, 8192), "bfloat16", 1e-6, True),
             ((3, 100), "float32", 1e-6, True), ((4, 12), "float16", 0.5, False)]
    for _ in range(6):
        tokens = int(rng.integers(1, 70))
        hidden = 8 * int(rng.integers(1, 520))
        cases.append(((tokens, hidden), str(rng.choice(list(FLOAT_DTYPES))),
                      float(rng.choice([1e-6, 1e-5])), bool(rng.integers(0, 2))))
    return cases


def suite_values(mesh):
    """Every case in one jitted program, then each output against numpy."""
    rng = np.random.default_rng(SEED + 11)
    cases = random_cases(rng)
    inputs = []
    for shape, dt, eps, with_residual in cases:
        dtype = FLOAT_DTYPES[dt]
        x = random_normal(rng, shape, dtype, scale=3.0)
        gamma = random_normal(rng, shape[-1:], dtype)
        residual = random_normal(rng, shape, dtype) if with_residual else None
        inputs.append((x, gamma, residual))

    def program(*flat):
        outs, it = [], iter(flat)
        for (shape, dt, eps, with_residual) in cases:
            x, gamma = next(it), next(it)
            residual = next(it) if with_residual else None
            outs.append(jax_ar.rms_norm(x, gamma, eps=eps, residual=residual))
        return outs

    flat = [a for case in inputs for a in case if a is not None]
    results = jax.jit(program)(*flat)
    for (shape, dt, eps, with_residual), (x, gamma, residual), result in zip(cases, inputs, results):
        what = f"rms_norm {dt}{shape} eps={eps} residual={with_residual}"
        want_out, want_residual = numpy_rms_norm(x, gamma, eps, residual)
        if with_residual:
            out, residual_out = (np.asarray(r) for r in result)
            assert_equal_nan_aware(residual_out, want_residual, what + " residual_out")
        else:
            out = np.asarray(result)
        assert out.dtype == x.dtype and out.shape == x.shape, (what, out.dtype, out.shape)
        assert_norm_close(out, want_out, what)
    # Eager calls (outside jit) and special values: a NaN poisons only its
    # row; inf makes its row NaN except where the norm is well defined.
    x = np.ones((3, 64), np.float32)
    x[1, 5] = np.nan
    x[2] *= 1e-20  # tiny rows are scaled back up, not flushed
    gamma = np.linspace(-2, 2, 64).astype(np.float32)
    out = np.asarray(jax_ar.rms_norm(x, gamma, eps=1e-30))
    assert_norm_close(out, norm_float64(x, gamma, 1e-30), "specials (eager)")
    log(f"values: {len(cases)} cases ok")


def outside_subnormals(got, want64, dtype):
    """`want64`, with the outputs that are subnormal in `dtype` replaced by
    what was got, where that is as small: next to a huge value the other
    outputs of a row underflow, and XLA:CPU flushes subnormals to zero."""
    tiny = float(np.finfo(np.dtype(dtype)).tiny) if np.dtype(dtype) != FLOAT_DTYPES["bfloat16"] \
        else 1.1754944e-38
    got64 = np.asarray(got).astype(np.float64)
    small = (np.abs(want64) < tiny) & (np.abs(got64) <= tiny)
    return np.where(small, got64, want64)


def suite_large_values(mesh):
    """Rows whose squares overflow float32 (values up to 3e38, float16's
    6e4): the sum of squares must not become inf, which turned such rows
    into zeros on the GPU (found on the H200; the kernels now sum in double
    and the jnp path scales the row)."""
    big = {"float32": 3e38, "bfloat16": 3e38, "float16": 6e4}
    rng = np.random.default_rng(SEED + 17)
    for dt, value in big.items():
        dtype = FLOAT_DTYPES[dt]
        for hidden in (16, 256, 4096):
            x = random_normal(rng, (4, hidden), dtype)
            x[0, 3] = value
            x[2, :] = -value if dt != "float16" else value  # a whole row of them
            gamma = random_normal(rng, (hidden,), dtype)
            out = np.asarray(jax.jit(lambda a, g: jax_ar.rms_norm(a, g, eps=1e-6))(x, gamma))
            assert np.isfinite(out.astype(np.float32)).all(), f"{dt} hidden {hidden}: {out}"
            assert_norm_close(out, outside_subnormals(out, norm_float64(x, gamma, 1e-6), dtype),
                              f"large values {dt}[{hidden}]")
    log("large_values: ok")


def suite_mixed_dtypes(mesh):
    """Every (x, residual) dtype pair, gammas of other dtypes and Gemma's
    scale_offset: out in x's dtype, residual_out in the residual's, both
    against numpy (a float32 residual beside 16-bit x runs in the kernel;
    other pairs in XLA's ops, the same arithmetic)."""
    rng = np.random.default_rng(SEED + 16)
    cases = []
    for x_dt in FLOAT_DTYPES:
        for r_dt in FLOAT_DTYPES:
            g_dt = ("float32", "bfloat16", "float16")[len(cases) % 3]
            cases.append((x_dt, r_dt, g_dt, (0.0, 1.0)[len(cases) % 2], (3, 512)))
    cases += [("bfloat16", "float32", "float32", 1.0, (2, 5, 1024)),
              ("float16", "float32", "bfloat16", 0.0, (1, 8192)), ("float32", None, "bfloat16",
                                                                   1.0, (4, 256))]
    inputs = []
    for x_dt, r_dt, g_dt, offset, shape in cases:
        x = random_normal(rng, shape, FLOAT_DTYPES[x_dt], scale=2.0)
        gamma = random_normal(rng, shape[-1:], FLOAT_DTYPES[g_dt], scale=0.3)
        residual = None if r_dt is None else random_normal(rng, shape, FLOAT_DTYPES[r_dt])
        inputs.append((x, gamma, residual))

    def program(*flat):
        outs, it = [], iter(flat)
        for x_dt, r_dt, g_dt, offset, shape in cases:
            x, gamma = next(it), next(it)
            residual = next(it) if r_dt is not None else None
            outs.append(jax_ar.rms_norm(x, gamma, residual=residual, scale_offset=offset))
        return outs

    results = jax.jit(program)(*[a for case in inputs for a in case if a is not None])
    for (x_dt, r_dt, g_dt, offset, shape), (x, gamma, residual), result in zip(cases, inputs,
                                                                            results):
        what = f"rms_norm x={x_dt} residual={r_dt} gamma={g_dt} offset={offset} {shape}"
        want_out, want_residual = numpy_rms_norm(x, gamma, 1e-6, residual, offset)
        out = np.asarray(result[0] if r_dt is not None else result)
        assert out.dtype == x.dtype, (what, out.dtype)
        if r_dt is not None:
            residual_out = np.asarray(result[1])
            assert residual_out.dtype == residual.dtype, (what, residual_out.dtype)
            assert_equal_nan_aware(residual_out, want_residual, what + " residual_out")
        assert_norm_close(out, want_out, what)
    # The kernel serves the float32 residual (no XLA fallback in the program).
    x = jnp.ones((2, 256), jnp.bfloat16)
    hlo = jax.jit(lambda a, b, c: jax_ar.rms_norm(a, c, residual=b)).lower(
        x, jnp.ones((2, 256), jnp.float32), jnp.ones(256, jnp.float32)).as_text()
    assert "jax_ar_add_rms_norm" in hlo, hlo[-1500:]
    # XLA's ops serve a bfloat16 residual beside float32 x; the norm must read
    # residual_out as rounded, which XLA:GPU's excess-precision rewrite would
    # undo without a barrier between the conversions (norm_math.widen). Only
    # the GPU run shows the values; here the barrier is checked in place.
    hlo = jax.jit(lambda a, b, c: jax_ar.rms_norm(a, c, residual=b)).lower(
        jnp.ones((2, 256), jnp.float32), x, jnp.ones(256, jnp.float32)).as_text()
    assert "optimization_barrier" in hlo, hlo[-1500:]
    log(f"mixed_dtypes: {len(cases)} cases ok")


def suite_sharded(mesh):
    """Plain jit on NamedSharding arrays: rows keep their sharding, results
    are right whatever the sharding of the hidden dimension."""
    rng = np.random.default_rng(SEED + 12)
    n = mesh.devices.size
    rows, hidden = 4 * n, 256
    dtype = FLOAT_DTYPES["bfloat16"]
    x = random_normal(rng, (rows, hidden), dtype)
    residual = random_normal(rng, (rows, hidden), dtype)
    gamma = random_normal(rng, (hidden,), dtype)
    want_out, want_residual = numpy_rms_norm(x, gamma, 1e-6, residual)
    axes = mesh.axis_names
    specs = [P(axes), P(None, axes[-1]), P()]
    if len(axes) == 2:
        specs += [P(axes[0]), P(axes[0], axes[-1])]
    f = jax.jit(lambda a, b, c: jax_ar.rms_norm(a, c, residual=b))
    for spec in specs:
        xs, rs = global_array(x, mesh, spec), global_array(residual, mesh, spec)
        g = global_array(gamma, mesh, P())
        out, residual_out = f(xs, rs, g)
        for result in (out, residual_out):
            assert isinstance(result.sharding, NamedSharding), result.sharding
            got_rows = tuple(result.sharding.spec)[:1] or (None,)
            assert got_rows == (tuple(spec)[:1] or (None,)), \
                f"rows of {spec} came back as {result.sharding.spec}"
        for device, index, data in local_shards(out):
            assert_norm_close(data, want_out[index], f"sharded {spec} out on {device}")
        for device, index, data in local_shards(residual_out):
            assert_equal_nan_aware(data, want_residual[index], f"sharded {spec} residual_out")
        # With the result's sharding fixed to the rows' own, it is kept.
        row_spec = P(*tuple(spec)[:1])
        g_fixed = jax.jit(lambda a, c: jax_ar.rms_norm(a, c),
                          out_shardings=NamedSharding(mesh, row_spec))
        out = g_fixed(xs, g)
        assert out.sharding.is_equivalent_to(NamedSharding(mesh, row_spec), 2), out.sharding
        for device, index, data in local_shards(out):
            assert_norm_close(data, norm_float64(x, gamma, 1e-6)[index], f"rows {spec}")
    # The kernel runs once per shard of rows: no all-gather of x when only
    # rows are sharded.
    hlo = f.lower(global_array(x, mesh, P(axes)), global_array(residual, mesh, P(axes)),
                  global_array(gamma, mesh, P())).compile().as_text()
    assert "jax_ar_add_rms_norm" in hlo or jax.devices()[0].platform != "cpu", hlo[-2000:]
    if n > 1:
        assert "all-gather" not in hlo, "rows sharded: nothing to gather"
    log("sharded: ok")


def suite_sharded_unplaced(mesh):
    """Under jax.set_mesh, numpy operands whose rows a bare PartitionSpec
    shards inside jit (reshard where the axes are Explicit): XLA's
    partitioner names no mesh there, yet the rows keep their sharding (no
    all-gather) and the values are right."""
    rng = np.random.default_rng(SEED + 13)
    axes = mesh.axis_names
    x = random_normal(rng, (4 * mesh.devices.size, 128), FLOAT_DTYPES["bfloat16"])
    gamma = random_normal(rng, (128,), FLOAT_DTYPES["bfloat16"])
    want = norm_float64(x, gamma, 1e-6)
    auto = jax.sharding.Mesh(mesh.devices, axes, axis_types=(AxisType.Auto,) * len(axes))
    for kind_mesh, place in ((mesh, jax.sharding.reshard),
                             (auto, jax.lax.with_sharding_constraint)):
        what = f"unplaced {kind_mesh.axis_types[0]}"
        with jax.set_mesh(kind_mesh):
            f = jax.jit(lambda a, c: jax_ar.rms_norm(place(a, P(axes)), c))
            out = f(x, gamma)
            hlo = f.lower(x, gamma).compile().as_text()
        for device, index, data in local_shards(out):
            assert_norm_close(data, want[index], f"{what} on {device}")
        if mesh.devices.size > 1:
            assert "all-gather" not in hlo, f"{what}: rows gathered\n{hlo[-2000:]}"
    log("sharded_unplaced: ok")


def suite_shard_map(mesh):
    rng = np.random.default_rng(SEED + 13)
    n = mesh.devices.size
    x = random_normal(rng, (2 * n, 512), np.float32)
    residual = random_normal(rng, (2 * n, 512), np.float32)
    gamma = random_normal(rng, (512,), np.float32)
    axes = mesh.axis_names
    f = jax.jit(jax.shard_map(lambda a, b, c: jax_ar.rms_norm(a, c, eps=1e-5, residual=b),
                              mesh=mesh, in_specs=(P(axes), P(axes), P()),
                              out_specs=(P(axes), P(axes))))
    out, residual_out = f(global_array(x, mesh, P(axes)), global_array(residual, mesh, P(axes)),
                          global_array(gamma, mesh, P()))
    want_out, want_residual = numpy_rms_norm(x, gamma, 1e-5, residual)
    for device, index, data in local_shards(out):
        assert_norm_close(data, want_out[index], f"shard_map out on {device}")
    for device, index, data in local_shards(residual_out):
        assert_equal_nan_aware(data, want_residual[index], f"shard_map residual_out on {device}")
    log("shard_map: ok")


def jnp_rms_norm(x, gamma, eps, residual=None):
    """The plain jnp formula the derivatives are checked against."""
    f32 = jnp.float32
    v = x.astype(f32)
    residual_out = None
    if residual is not None:
        residual_out = (v + residual.astype(f32)).astype(x.dtype)
        v = residual_out.astype(f32)
    out = (v * jax.lax.rsqrt(jnp.mean(v * v, -1, keepdims=True) + eps) * gamma.astype(f32))
    out = out.astype(x.dtype)
    return out if residual is None else (out, residual_out)


def suite_grad(mesh):
    rng = np.random.default_rng(SEED + 14)
    for dt, rtol, atol in (("float32", 2e-5, 2e-6), ("bfloat16", 2e-2, 2e-2)):
        dtype = FLOAT_DTYPES[dt]
        x = jnp.asarray(random_normal(rng, (6, 256), dtype, scale=2.0))
        residual = jnp.asarray(random_normal(rng, (6, 256), dtype))
        gamma = jnp.asarray(random_normal(rng, (256,), dtype))
        weights = jnp.asarray(random_normal(rng, (6, 256), np.float32))

        def loss(norm, a, b, c):
            out, residual_out = norm(a, c, 1e-5, b)
            return (jnp.sum(jnp.sin(out.astype(jnp.float32)) * weights)
                    + jnp.sum(residual_out.astype(jnp.float32) ** 2))

        ours = lambda a, c, eps, b: jax_ar.rms_norm(a, c, eps=eps, residual=b)
        got = jax.jit(jax.grad(lambda *a: loss(ours, *a), argnums=(0, 1, 2)))(x, residual, gamma)
        want = jax.grad(lambda *a: loss(jnp_rms_norm, *a), argnums=(0, 1, 2))(x, residual, gamma)
        for name, g, w in zip(("x", "residual", "gamma"), got, want):
            assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, w.dtype)
            np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                       rtol=rtol, atol=atol * float(jnp.abs(w).max()),
                                       err_msg=f"grad {dt} wrt {name}")
        # Without a residual, and forward mode.
        tangent = (jnp.asarray(random_normal(rng, (6, 256), dtype)),
                   jnp.asarray(random_normal(rng, (256,), dtype)))
        got = jax.jvp(lambda a, c: jax_ar.rms_norm(a, c), (x, gamma), tangent)
        want = jax.jvp(lambda a, c: jnp_rms_norm(a, c, 1e-6), (x, gamma), tangent)
        np.testing.assert_allclose(np.asarray(got[1], np.float32), np.asarray(want[1], np.float32),
                                   rtol=rtol, atol=atol * float(jnp.abs(want[1]).max()),
                                   err_msg=f"jvp {dt}")
    # Inside shard_map too.
    axes = mesh.axis_names
    n = mesh.devices.size
    x = random_normal(rng, (2 * n, 128), np.float32)
    gamma = random_normal(rng, (128,), np.float32)
    def per_shard(norm):
        def body(a, c):
            return jax.grad(lambda u, w: jnp.sum(jnp.cos(norm(u, w))), argnums=(0, 1))(a, c)
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(axes), P()),
                                     out_specs=(P(axes), P(axes)), check_vma=False))
    got = per_shard(lambda u, w: jax_ar.rms_norm(u, w))(global_array(x, mesh, P(axes)),
                                                        global_array(gamma, mesh, P()))
    want = per_shard(lambda u, w: jnp_rms_norm(u, w, 1e-6))(global_array(x, mesh, P(axes)),
                                                            global_array(gamma, mesh, P()))
    for g, w in zip(got, want):
        for (device, index, data), (_, _, ref) in zip(local_shards(g), local_shards(w)):
            np.testing.assert_allclose(data, ref, rtol=2e-5, atol=2e-6,
                                       err_msg=f"shard_map grad on {device}")
    log("grad: ok")


def jnp_mixed_norm(x, gamma, eps, residual, offset):
    """The unfused jnp composition with mixed dtypes and scale_offset."""
    f32 = jnp.float32
    residual_out = (x.astype(f32) + residual.astype(f32)).astype(residual.dtype)
    v = residual_out.astype(f32)
    scale = gamma.astype(f32) + f32(offset)
    out = v * jax.lax.rsqrt(jnp.mean(v * v, -1, keepdims=True) + eps) * scale
    return out.astype(x.dtype), residual_out


def suite_mixed_grad(mesh):
    """Derivatives with a residual of another dtype, gammas of another dtype
    and scale_offset, against jax.grad of the jnp composition."""
    rng = np.random.default_rng(SEED + 17)
    for x_dt, r_dt, g_dt, offset, rtol in (("bfloat16", "float32", "float32", 1.0, 2e-2),
                                           ("float16", "float32", "bfloat16", 0.0, 2e-2),
                                           ("float32", "bfloat16", "float32", 1.0, 2e-2),
                                           ("float32", "float32", "float16", 1.0, 2e-5)):
        x = jnp.asarray(random_normal(rng, (6, 256), FLOAT_DTYPES[x_dt], scale=2.0))
        residual = jnp.asarray(random_normal(rng, (6, 256), FLOAT_DTYPES[r_dt]))
        gamma = jnp.asarray(random_normal(rng, (256,), FLOAT_DTYPES[g_dt], scale=0.3))
        weights = jnp.asarray(random_normal(rng, (6, 256), np.float32))

        def loss(norm, a, b, c):
            out, residual_out = norm(a, c, 1e-5, b, offset)
            return (jnp.sum(jnp.sin(out.astype(jnp.float32)) * weights)
                    + jnp.sum(residual_out.astype(jnp.float32) ** 2))

        ours = lambda a, c, eps, b, o: jax_ar.rms_norm(a, c, eps=eps, residual=b, scale_offset=o)
        got = jax.jit(jax.grad(lambda *a: loss(ours, *a), argnums=(0, 1, 2)))(x, residual, gamma)
        want = jax.grad(lambda *a: loss(jnp_mixed_norm, *a), argnums=(0, 1, 2))(x, residual, gamma)
        for name, g, w in zip(("x", "residual", "gamma"), got, want):
            assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, w.dtype)
            np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                       rtol=rtol, atol=rtol * float(jnp.abs(w).max()),
                                       err_msg=f"grad x={x_dt} residual={r_dt} gamma={g_dt} "
                                               f"wrt {name}")
    log("mixed_grad: ok")


def suite_vmap(mesh):
    rng = np.random.default_rng(SEED + 15)
    dtype = FLOAT_DTYPES["float16"]
    x = random_normal(rng, (3, 4, 256), dtype)
    residual = random_normal(rng, (4, 256), dtype)  # shared by the batch
    gammas = random_normal(rng, (3, 256), dtype)
    out, residual_out = jax.jit(jax.vmap(
        lambda a: jax_ar.rms_norm(a, jnp.asarray(gammas[0]), residual=jnp.asarray(residual))))(x)
    for b in range(3):
        want_out, want_residual = numpy_rms_norm(x[b], gammas[0], 1e-6, residual)
        assert_equal_nan_aware(np.asarray(residual_out[b]), want_residual, f"vmap residual_out {b}")
        assert_norm_close(np.asarray(out[b]), want_out, f"vmap out {b}")
    # A batch of gammas as well (served by XLA's ops).
    out = jax.jit(jax.vmap(lambda a, c: jax_ar.rms_norm(a, c), in_axes=(1, 0)))(
        np.swapaxes(x, 0, 1), gammas)
    for b in range(3):
        assert_norm_close(np.asarray(out[b]), norm_float64(x[b], gammas[b], 1e-6), f"vmap gamma {b}")
    log("vmap: ok")


def suite_bad_input(mesh):
    x = jnp.ones((2, 64), jnp.float32)
    g = jnp.ones((64,), jnp.float32)
    norm = jax_ar.rms_norm
    expect_error(ValueError, "gamma has shape (32,)", lambda: norm(x, jnp.ones((32,))))
    expect_error(ValueError, "gamma has shape (2, 64)", lambda: norm(x, jnp.ones((2, 64))))
    expect_error(ValueError, "residual has shape (3, 64)",
                 lambda: norm(x, g, residual=jnp.ones((3, 64))))
    expect_error(TypeError, "residual has dtype int32",
                 lambda: norm(x, g, residual=x.astype(jnp.int32)))
    expect_error(TypeError, "gamma has dtype int32", lambda: norm(x, g.astype(jnp.int32)))
    expect_error(TypeError, "x has dtype int32", lambda: norm(x.astype(jnp.int32), g))
    expect_error(TypeError, "scale_offset must be a Python float",
                 lambda: norm(x, g, scale_offset="1"))
    expect_error(ValueError, "scale_offset must be finite",
                 lambda: norm(x, g, scale_offset=float("inf")))
    expect_error(TypeError, "gamma is required", lambda: norm(x, None))
    expect_error(ValueError, "eps must be positive", lambda: norm(x, g, eps=0.0))
    expect_error(ValueError, "eps must be positive", lambda: norm(x, g, eps=-1e-6))
    expect_error(ValueError, "eps must be positive", lambda: norm(x, g, eps=float("nan")))
    for eps in (1e-40, 1e-46):  # subnormal, and zero, in float32
        expect_error(ValueError, "below float32's smallest normal number",
                     lambda: norm(x, g, eps=eps))
    expect_error(TypeError, "eps must be a Python float", lambda: norm(x, g, eps="1e-6"))
    expect_error(ValueError, "at least one dimension", lambda: norm(jnp.float32(1), g[:1]))
    expect_error(ValueError, "gamma has shape", lambda: jax.jit(norm)(x, g[:3]))
    log("bad_input: ok")


SUITES = suites_in(globals())


def main(argv):
    devices = np.array(jax.devices())
    shape = (2, devices.size // 2) if devices.size % 2 == 0 and devices.size > 2 else (devices.size,)
    mesh = jax.make_mesh(shape, ("dp", "tp")[-len(shape):] if len(shape) == 2 else ("dp",))
    log(f"{jax.device_count()} devices, {jax.process_count()} processes, mesh {mesh.shape}")
    run_suites(SUITES, argv or list(SUITES), mesh)


if __name__ == "__main__":
    main_guard(main)
