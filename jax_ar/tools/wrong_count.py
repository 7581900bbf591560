"""Counts of wrong elements taken on the device, by bench_data's rules.

bench and tune time a program whose only output is each rank's count of
wrong elements (timing.chained_to_count), so the rules of the host checks
(bench_data.count_wrong, bench_data.rms_norm_wrong) are written again here
in jnp, with their constants; tests/test_tools_bench.py holds the two to
the same counts. rms_norm_of is the reference of a chain's last
all_reduce_rms_norm call (timing.chained_to_count_ends), from that call's
own inputs.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .bench_data import ROUNDING, ROUNDINGS, UNSIGNED

__all__ = ["bits_differ", "off_tolerance", "rms_norm_of"]


def bits_differ(got, want):
    """Elements that differ bit for bit (bench_data.count_wrong): an int32
    scalar; every element when shapes or dtypes differ."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return jnp.int32(max(got.size, want.size))
    unsigned = UNSIGNED[jnp.dtype(got.dtype).itemsize]
    differ = (jax.lax.bitcast_convert_type(got, unsigned)
              != jax.lax.bitcast_convert_type(want, unsigned))
    return jnp.sum(differ, dtype=jnp.int32)


def off_tolerance(got, want):
    """Elements off the host's float64 emulation `want` by more than a few
    roundings of its dtype (bench_data.rms_norm_wrong), NaN included: an
    int32 scalar. Taken in float32, where 16-bit values and their
    differences are exact; for float32 data the difference rounds by at
    most 2**-24 of the values, far inside the 8 * 2**-20 tolerance."""
    got32, want32 = got.astype(jnp.float32), want.astype(jnp.float32)
    tolerance = ROUNDINGS * ROUNDING[jnp.dtype(want.dtype).itemsize] * (jnp.abs(want32) + 1.0)
    return jnp.sum(~(jnp.abs(got32 - want32) <= tolerance), dtype=jnp.int32)


def rms_norm_of(x, residual, gamma, eps: float, world: int):
    """(out, residual_out) of one all_reduce_rms_norm call whose x is the
    same on every rank (a chain's later calls take the previous out), in
    float32 on the device: bench_data.rms_norm_reference's one call, with
    the sum over ranks as world * x. The residual_out is exact where the
    sum is (16-bit data: world * x + residual fits float32's 24 bits); out
    differs from a kernel's by the inverse RMS's rounding, far inside
    off_tolerance. Should the ranks' x differ (a kernel that left them
    apart), each rank's reference is its own x's, which the call's sum over
    ranks does not match."""
    dtype = residual.dtype
    res = (world * x.astype(jnp.float32) + residual.astype(jnp.float32)).astype(dtype)
    wide = res.astype(jnp.float32)
    inverse_rms = jax.lax.rsqrt(jnp.mean(wide * wide, axis=-1, keepdims=True) + eps)
    return (wide * inverse_rms * gamma.astype(jnp.float32)).astype(dtype), res
