"""Fuzz cases of jax_ar.rms_norm and jax_ar.all_reduce_rms_norm (run by
ops_fuzz.py when the build has them).

References are numpy: the sum of the ranks' parts in float32 in rank order
plus the residual, rounded once (bitwise), and the norm in float64 (close
within the output dtype's rounding; float8 within its own).
"""
import jax
import ml_dtypes
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_ar
from common import assert_equal_nan_aware, global_array, local_shards, norm_auto_takes_pair
from comm_fault_checks import ON_GPU

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
# Relative error of one rounding to the dtype, with room for float32 math.
RTOL = {"float32": 1e-5, "bfloat16": 2**-7, "float16": 2**-9}
FP8_MAX = 448.0
BAD_EPS = [(0.0, ValueError), (-1.0, ValueError), (float("nan"), ValueError),
           (float("inf"), ValueError), (1e-50, ValueError), ("1e-6", TypeError),
           (None, TypeError), (True, TypeError)]
BAD_SCALES = [(0.0, ValueError), (-1.0, ValueError), (float("nan"), ValueError),
              (float("inf"), ValueError), ("2", TypeError), (np.ones(2, np.float32), ValueError),
              (np.int32(2), TypeError), (True, TypeError)]


def norm_reference(v, gamma, eps):
    """float64 RMSNorm of float32 values v over the last axis."""
    v = v.astype(np.float64)
    with np.errstate(all="ignore"):
        rms = np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps)
        return v / rms * gamma.astype(np.float64)


def assert_norm_close(got, want64, dtype_name, what, quant_scale=None):
    """Rows whose inputs are all finite must match; others may be anything
    (but must have the right shape and dtype, checked by the caller)."""
    got = np.asarray(got).astype(np.float64)
    finite_rows = np.isfinite(want64).all(axis=-1) if want64.ndim else np.isfinite(want64)
    if quant_scale is not None:
        want = np.clip(want64 / quant_scale, -FP8_MAX, FP8_MAX)
        rtol, atol = 2**-3, 2**-9  # e4m3: 3 mantissa bits, subnormals from 2^-9
    else:
        want, rtol, atol = want64, RTOL[dtype_name], 1e-6
    bad = ~np.isclose(got, want, rtol=rtol, atol=atol) & finite_rows[..., None]
    assert not bad.any(), f"{what}: {bad.sum()} elements off (first: got {got[bad][0]}, " \
                          f"want {want[bad][0]})"


def run(fz):
    rng = np.random.default_rng(7)
    data = fz.data
    for dtype in DTYPES:
        for shape in [(16,), (4, 16), (2, 3, 32), (0, 16), (4, 0), (5, 1)]:
            for with_residual in (False, True):
                special = shape == (4, 16)
                x = data(rng, shape, dtype, special=special)
                r = data(rng, shape, dtype) if with_residual else None
                g = data(rng, shape[-1:], dtype)
                fz.case(f"rms_norm {dtype} {shape} residual={with_residual} special={special}",
                        lambda: check_rms_norm(x, g, r, dtype))
    x, g = data(rng, (4, 16), "float32"), data(rng, (16,), "float32")
    for eps, error in BAD_EPS:
        fz.case(f"rms_norm eps={eps!r}", lambda: jax_ar.rms_norm(x, g, eps=eps), error, ("eps",))
    fz.case("rms_norm int32 x", lambda: jax_ar.rms_norm(x.astype(np.int32), g.astype(np.int32)),
            TypeError, ("dtype",))
    fz.case("rms_norm gamma of another float dtype",
            lambda: check_rms_norm(x, g.astype(np.float16), None, "float32"))
    fz.case("rms_norm gamma of an integer dtype",
            lambda: jax_ar.rms_norm(x, g.astype(np.int32)), TypeError, ("gamma",))
    fz.case("rms_norm residual of an integer dtype",
            lambda: jax_ar.rms_norm(x, g, residual=x.astype(np.int32)), TypeError,
            ("residual",))
    fz.case("rms_norm scalar x", lambda: jax_ar.rms_norm(np.float32(1), g), ValueError)
    fz.case("rms_norm gamma of the wrong size", lambda: jax_ar.rms_norm(x, g[:8]), ValueError,
            ("gamma",))
    fz.case("rms_norm residual of the wrong shape",
            lambda: jax_ar.rms_norm(x, g, residual=x[:2]), ValueError, ("residual",))

    algorithms = ("auto", "oneshot", "twoshot") + (() if ON_GPU else ("psum",))
    for dtype in DTYPES:
        for tokens, hidden in [(2, 64), (1, 8), (3, 1000), (0, 64), (2, 0)]:
            for algorithm in algorithms:
                for scale in (None, 0.5):
                    special = (tokens, hidden) == (2, 64) and algorithm == "oneshot"
                    xs = data(rng, (fz.n * tokens, hidden), dtype, special=special)
                    r = data(rng, (tokens, hidden), dtype)
                    g = data(rng, (hidden,), dtype)
                    fz.case(f"all_reduce_rms_norm {dtype} [{tokens}, {hidden}] {algorithm} "
                            f"quant_scale={scale} special={special}",
                            lambda: check_all_reduce_rms_norm(fz, xs, r, g, dtype, algorithm,
                                                              scale))
    xs, r, g = (data(rng, (fz.n * 2, 64), "float32"), data(rng, (2, 64), "float32"),
                data(rng, (64,), "float32"))
    call = lambda **kw: fused(fz, xs, r, g, **kw)  # noqa: E731
    for eps, error in BAD_EPS:
        fz.case(f"all_reduce_rms_norm eps={eps!r}", lambda: call(eps=eps), error, ("eps",))
    for scale, error in BAD_SCALES:
        fz.case(f"all_reduce_rms_norm quant_scale={scale!r}", lambda: call(quant_scale=scale),
                error, ("quant_scale",))
    fz.case("all_reduce_rms_norm algorithm='ring'", lambda: call(algorithm="ring"), ValueError,
            ("algorithm",))
    fz.case("all_reduce_rms_norm axis 'nope'", lambda: call(axis="nope"), ValueError)
    fz.case("all_reduce_rms_norm residual=None", lambda: call(residual_none=True), TypeError,
            ("residual",))


def flushed_where_xla_flushes(got, want):
    """`want`, with subnormals replaced by zero of the same sign where `got`
    has that zero. The residual add of all_reduce_rms_norm's general path is
    XLA arithmetic, and XLA:CPU flushes subnormals (its fused host kernel and
    the GPU keep them): both are accepted, nothing else."""
    want = np.array(want)
    w32, g32 = want.astype(np.float32), np.asarray(got).astype(np.float32)
    tiny = float(ml_dtypes.finfo(want.dtype).tiny)
    flushed = (np.abs(w32) < tiny) & (w32 != 0) & (g32 == 0) & \
        (np.signbit(w32) == np.signbit(g32))
    want[flushed] = np.asarray(got)[flushed]
    return want


def check_rms_norm(x, gamma, residual, dtype):
    outs = jax.jit(lambda a, g, r: jax_ar.rms_norm(a, g, eps=1e-6, residual=r))(x, gamma,
                                                                                residual)
    if residual is None:
        out, v = outs, x.astype(np.float32)
    else:
        out, residual_out = outs
        want_residual = (x.astype(np.float32) + residual.astype(np.float32)).astype(x.dtype)
        assert_equal_nan_aware(np.asarray(residual_out),
                               flushed_where_xla_flushes(residual_out, want_residual),
                               "rms_norm residual_out")
        v = want_residual.astype(np.float32)
    out = np.asarray(out)
    assert out.shape == x.shape and out.dtype == x.dtype, (out.shape, out.dtype)
    assert_norm_close(out, norm_reference(v, gamma, 1e-6), dtype, "rms_norm out")


def fused(fz, xs, r, g, eps=1e-6, algorithm="auto", quant_scale=None, axis="tp",
          residual_none=False):
    def body(x, residual, gamma):
        return jax_ar.all_reduce_rms_norm(x, None if residual_none else residual, gamma, axis,
                                          eps=eps, algorithm=algorithm, quant_scale=quant_scale)

    f = jax.jit(jax.shard_map(body, mesh=fz.mesh, in_specs=(P("tp"), P(), P()),
                              out_specs=(P(), P())))
    return f(global_array(xs, fz.mesh, P("tp")), r, g)


def check_all_reduce_rms_norm(fz, xs, r, g, dtype, algorithm, scale):
    out, residual_out = fused(fz, xs, r, g, algorithm=algorithm, quant_scale=scale)
    parts = np.split(xs.astype(np.float32), fz.n)
    with np.errstate(all="ignore"):
        total = parts[0]
        for p in parts[1:]:
            total = total + p  # float32, rank order
        if algorithm == "auto" and norm_auto_takes_pair(fz.comm, r.shape, xs.dtype, r.dtype,
                                                        plain=scale is None):
            total = total.astype(xs.dtype).astype(np.float32)  # the pair rounds the sum first
        want_residual = (total + r.astype(np.float32)).astype(xs.dtype)
    want_out = norm_reference(want_residual.astype(np.float32), g, 1e-6)
    want_dtype = ml_dtypes.float8_e4m3fn if scale is not None else xs.dtype
    for device, _, data in local_shards(residual_out):
        if algorithm == "psum":
            assert_norm_close(data, want_residual.astype(np.float64), dtype, "psum residual_out")
        else:
            assert_equal_nan_aware(data, flushed_where_xla_flushes(data, want_residual),
                                   f"residual_out on {device}")
    for device, _, data in local_shards(out):
        assert data.shape == xs.shape[1:] or data.shape == r.shape, data.shape
        assert data.dtype == want_dtype, (data.dtype, want_dtype)
        assert_norm_close(data, want_out, dtype, f"out on {device}", quant_scale=scale)
