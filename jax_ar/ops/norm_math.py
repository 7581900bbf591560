"""The arithmetic of jax_ar's norms in jnp: the reference the kernels
follow (and the path shapes the kernels do not take), the float32 scale
vectors the kernels take, the tangent of the norm, and the FP8 output. The
tools' XLA baselines use it too.

Math (float32 inside, one rounding per output): v = f32(x); with a residual,
residual_out = round(v + f32(residual)) in the residual's dtype and v =
f32(residual_out); out = round(v * rsqrt(mean(v * v, -1) + eps) * gamma) in
x's dtype, gamma = f32(scale) + f32(scale_offset) (`scale_vector`).
"""
from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

__all__ = ["FP8_DTYPE", "FP8_MAX", "fused_reference", "norm_tangent", "normalize",
           "quantize_fp8", "reference", "scale_vector", "widen"]

FP8_DTYPE = np.dtype(jnp.float8_e4m3fn)
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def widen(a):
    """float32 of `a`, whose values are exactly those `a` holds. XLA:GPU's
    excess-precision rewrite (SimplifyFPConversions, on by default) drops a
    float32 -> bfloat16 -> float32 round trip, so a residual_out rounded to
    bfloat16 and read back would reach the norm unrounded, and a parameter
    cast to the module's dtype would act at full precision (seen on an H200:
    outputs 0.2% off the kernels' arithmetic, never on CPU). An
    optimization barrier between the two conversions keeps the rounding; the
    narrow value is in memory anyway (an operand or an output)."""
    a = jnp.asarray(a)
    if a.dtype == jnp.float32 or np.dtype(a.dtype).itemsize >= 4:
        return a.astype(jnp.float32)
    return jax.lax.optimization_barrier(a).astype(jnp.float32)


def normalize(v, eps):
    """(v * rsqrt(mean(v * v, -1) + eps), the inverse RMS) for float32 rows v.

    A row whose largest magnitude is above 2^50 would overflow v * v in
    float32 (the kernels sum squares in float64 and never do): it is scaled
    by a power of two s first, which changes no bit of the quotient:
    (v s) rsqrt(mean((v s)^2) + eps s^2) = v rsqrt(mean(v^2) + eps). Other
    rows take the plain formula."""
    # initial=0: a row of no elements (hidden size 0) has largest 0 and an
    # empty result, as jnp's formula gives, where max would have no identity.
    largest = jnp.max(jnp.abs(v), axis=-1, keepdims=True, initial=0.0)
    exponent = jnp.where(jnp.isfinite(largest) & (largest > 2.0**50),
                         jnp.frexp(largest)[1] - 2, 0)
    scale = jnp.ldexp(jnp.ones_like(largest), -exponent)  # >= 2^-126: no subnormal
    w = v * scale
    r = jax.lax.rsqrt(jnp.mean(w * w, axis=-1, keepdims=True) + jnp.float32(eps) * scale * scale)
    return w * r, r * scale


def scale_vector(scale, offset: float):
    """The float32 vector the kernels multiply by: f32(scale) + f32(offset),
    the addition the kernels would do (Gemma's 1 + scale is offset 1.0). No
    addition for offset 0, which would turn a -0.0 scale into +0.0."""
    vector = widen(scale)
    return vector + jnp.float32(offset) if offset != 0.0 else vector


def reference(x, gamma, eps, residual=None):
    """The jnp form of the rms_norm kernels' arithmetic (also their path for
    shapes and dtype pairs the kernels do not take): [out] or [out,
    residual_out]; out in x's dtype, residual_out in the residual's."""
    v = widen(x)
    outs = []
    if residual is not None:
        residual_out = (v + widen(residual)).astype(residual.dtype)
        v = widen(residual_out)
        outs.append(residual_out)
    normalized, _ = normalize(v, eps)
    out = (normalized * widen(gamma)).astype(x.dtype)
    return [out] + outs


def fused_reference(total, residual, gamma, eps, post_gamma=None, bias=None):
    """all_reduce_rms_norm's arithmetic after the sum over ranks, in jnp:
    (the float32 normalized output before its rounding, residual_out).
    `total` is the float32 sum; gamma, post_gamma and bias are float32."""
    t = total if bias is None else total + bias
    if post_gamma is not None:
        t = normalize(t, eps)[0] * post_gamma
    residual_out = (t + widen(residual)).astype(residual.dtype)
    y = normalize(widen(residual_out), eps)[0] * gamma
    return y, residual_out


def norm_tangent(v, gamma, dv, dgamma, eps):
    """Tangent of v * rsqrt(mean(v^2) + eps) * gamma (all float32), linear in
    (dv, dgamma): with n = v * r, dr = -r * mean(n * dv) * r."""
    normalized, inv_rms = normalize(v, eps)
    dnormalized = (dv - normalized * jnp.mean(normalized * dv, axis=-1, keepdims=True)) * inv_rms
    return dnormalized * gamma + normalized * dgamma


def quantize_fp8(y, scale):
    """float8_e4m3fn(saturate(y / scale)); NaN stays NaN (clip keeps it)."""
    return jnp.clip(y / scale, -FP8_MAX, FP8_MAX).astype(jnp.float8_e4m3fn)
