"""References and comparisons for the norm tests (rms_norm, all_reduce_rms_norm).

Every reference is numpy, independent of jax_ar and of jax:

* the residual stream is checked bit for bit: float32 sums (numpy float32
  adds round to nearest even, as the kernels do), rounded once to the dtype;
* the normalized output is checked against float64 arithmetic on the same
  (rounded) residual stream, within the tolerance `norm_tolerance` derives.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

FLOAT_DTYPES = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
FP8_MAX = 448.0

# Explicit mantissa bits and the spacing of the smallest subnormals.
_MANTISSA_BITS = {np.dtype(np.float32): 23, FLOAT_DTYPES["bfloat16"]: 7,
                  np.dtype(np.float16): 10, FP8: 3}
_SUBNORMAL_STEP = {np.dtype(np.float32): 2.0**-149, FLOAT_DTYPES["bfloat16"]: 2.0**-133,
                   np.dtype(np.float16): 2.0**-24, FP8: 2.0**-9}

# float32 evaluation error of v * rsqrt(mean(v^2) + eps) * gamma, relative:
# the GPU's rsqrtf (<= 2 ulp), a float32 tree sum over up to 16384 terms
# (<= 15 roundings of 2^-24 each, halved by the square root), the mean's
# scaling and the two products: about 1.5e-6 all told; 1e-5 leaves margin
# and is still far below what any real bug (a wrong eps, gamma, row or
# dtype) produces.
FLOAT32_EVALUATION = 1e-5


def scale_vector(gamma, offset=0.0) -> np.ndarray:
    """What the kernels multiply by: float32(gamma) + float32(offset), added
    in float32 (Gemma's 1 + scale is offset 1.0)."""
    g = np.asarray(gamma).astype(np.float32)
    return g + np.float32(offset) if offset else g


def post_norm_float64(total: np.ndarray, post_gamma32: np.ndarray, eps: float) -> np.ndarray:
    """The post-norm of the float32 sum over ranks, in float64."""
    return norm_float64(total, post_gamma32, eps)


def assert_within(got, reference64, bound, what):
    """|got - reference| <= bound elementwise (NaN where the reference is)."""
    got64 = np.asarray(got).astype(np.float64)
    ref = np.asarray(reference64, np.float64)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got64), nan), f"{what}: NaN in other places"
    error = np.abs(got64 - ref)[~nan]
    bound = np.broadcast_to(bound, ref.shape)[~nan]
    if (error > bound).any():
        i = int(np.argmax(error - bound))
        raise AssertionError(f"{what}: {(error > bound).sum()} of {error.size} elements off "
                             f"(worst: off by {error[i]:.3g}, bound {bound[i]:.3g})")


def sum_in_rank_order(parts) -> np.ndarray:
    """float32 sum of the ranks' parts, rank 0 first (the kernels' order)."""
    acc = parts[0].astype(np.float32)
    for p in parts[1:]:
        acc = acc + p.astype(np.float32)
    return acc


def add_residual(total32: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """residual_out: float32 total + float32 residual, rounded to residual's dtype."""
    with np.errstate(all="ignore"):
        return (total32 + residual.astype(np.float32)).astype(residual.dtype)


def norm_float64(v: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """v * rsqrt(mean(v^2) + eps) * gamma in float64 (v: the stored values)."""
    v = v.astype(np.float64)
    with np.errstate(all="ignore"):
        return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps) * gamma.astype(np.float64)


def norm_tolerance(reference: np.ndarray, dtype) -> np.ndarray:
    """What separates a correct result in `dtype` from the float64 value:
    float32 evaluation error, which may carry the value across a rounding
    boundary, so one unit in the last place of the dtype, not half; plus the
    subnormal spacing for results that small."""
    dtype = np.dtype(dtype)
    magnitude = np.abs(reference)
    return (magnitude * (2.0 ** -_MANTISSA_BITS[dtype] + FLOAT32_EVALUATION)
            + _SUBNORMAL_STEP[dtype])


def assert_norm_close(got, reference64, what, quant_scale=None):
    """`got` (x's dtype, or float8_e4m3fn with quant_scale) against the
    float64 reference: NaN where the reference is NaN, saturated to +-448
    where the scaled reference is beyond it, otherwise within tolerance."""
    got = np.asarray(got)
    ref = np.asarray(reference64, np.float64)
    if quant_scale is not None:
        assert got.dtype == FP8, f"{what}: expected float8_e4m3fn, got {got.dtype}"
        with np.errstate(all="ignore"):
            ref = ref / np.float64(np.float32(quant_scale))
        ref = np.where(np.isnan(ref), np.nan, np.clip(ref, -FP8_MAX, FP8_MAX))
    got64 = got.astype(np.float64)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got64), nan), \
        f"{what}: NaN in {np.isnan(got64).sum()} places, expected {nan.sum()}"
    ref, got64 = ref[~nan], got64[~nan]
    tol = norm_tolerance(ref, got.dtype)
    bad = np.abs(got64 - ref) > tol
    if bad.any():
        i = np.flatnonzero(bad)[0]
        raise AssertionError(f"{what}: {bad.sum()} of {ref.size} elements off the float64 "
                             f"reference (first: got {got64[i]!r}, want {ref[i]!r}, tolerance "
                             f"{tol[i]:.3g})")


def random_normal(rng, shape, dtype, scale=1.0) -> np.ndarray:
    return (rng.standard_normal(size=shape) * scale).astype(np.float32).astype(dtype)


