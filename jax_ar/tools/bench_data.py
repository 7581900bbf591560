"""Inputs and host references for bench/tune: exact for every algorithm.

The timed program chains K all-reduces, each consuming the previous result
(see timing.py), so after the first call every rank reduces the same
values. The data make every partial sum exactly representable whatever the
order and precision of the reduction (jax_ar's rank order, NCCL's ring,
gloo), so psum is checked bit for bit as strictly as jax_ar:

  rank r holds x_r = v + s_r * w, with v in +-{4, 8, 12} and w in {1, 2, 3}
  the same on every rank, s_r = +1 on even ranks and -1 on odd ones (0 on
  the last rank when the world size is odd). So sum = n*v, avg = v,
  max = v + w, min = v - w, and no element is ever zero.

avg, max and min give back their own input on the next call, so any chain
length stays exact. sum multiplies by n per call; `chain_length` shortens
the chain where that would leave the dtype's exact range (float16 data are
scaled by 2**-14 to make room; int32 sums wrap, which is exact).
"""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np

__all__ = ["DTYPES", "ROUNDING", "ROUNDINGS", "UNSIGNED", "chain_length", "count_wrong",
           "rank_values", "reference", "rms_norm_calls", "rms_norm_inputs", "rms_norm_reference",
           "rms_norm_wrong"]

DTYPES = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
    "int32": np.dtype(np.int32),
}
_BASE = (4, 8, 12)  # significands 1 and 3: at most two bits
_SCALE = {"float16": 2.0**-14}  # float16 sums need the room below 1


def _base_and_step(dtype_name: str, count: int, seed: int):
    rng = np.random.default_rng([seed, count])
    v = np.asarray(_BASE, np.int16)[rng.integers(0, len(_BASE), count, dtype=np.int8)]
    v = np.where(rng.integers(0, 2, count, dtype=np.int8) == 1, v, -v)
    w = rng.integers(1, 4, count, dtype=np.int8).astype(np.int16)
    return v, w


def _sign(rank: int, world: int) -> int:
    if world % 2 == 1 and rank == world - 1:
        return 0
    return 1 if rank % 2 == 0 else -1


def rank_values(dtype_name: str, count: int, rank: int, world: int, seed: int = 0) -> np.ndarray:
    """This rank's input of `count` elements."""
    v, w = _base_and_step(dtype_name, count, seed)
    x = (v + _sign(rank, world) * w).astype(np.float64) * _SCALE.get(dtype_name, 1.0)
    return x.astype(DTYPES[dtype_name])


def _exact(values: np.ndarray, dtype: np.dtype) -> bool:
    if dtype == np.int32:
        return True
    with np.errstate(over="ignore"):
        cast = values.astype(dtype).astype(np.float64)
    return bool(np.all(np.isfinite(cast)) and np.array_equal(cast, values))


def chain_length(op: str, dtype_name: str, world: int, requested: int) -> int:
    """The longest chain, up to `requested`, whose every call stays exact."""
    if op in ("max", "min"):
        return requested
    if op == "avg":
        # int32 averages come back as float32 (pmean's rule): no chain.
        return 1 if dtype_name == "int32" else requested
    dtype = DTYPES[dtype_name]
    if dtype == np.int32:
        return requested
    scale = _SCALE.get(dtype_name, 1.0)
    partial = np.arange(1, world + 1, dtype=np.float64)  # m copies summed so far
    length = 1  # the first call's partial sums are at most 16 * 15 < 256: exact
    for k in range(1, requested):
        # Call k reduces n**k * v on every rank: partial sums m * n**k * v.
        values = np.outer(partial * float(world) ** k, np.asarray(_BASE) * scale).ravel()
        if not _exact(values, dtype):
            break
        length = k + 1
    return length


def reference(op: str, dtype_name: str, count: int, world: int, chain: int,
              seed: int = 0) -> np.ndarray:
    """The result of `chain` chained all-reduces, computed on the host."""
    v, w = _base_and_step(dtype_name, count, seed)
    dtype = DTYPES[dtype_name]
    if dtype == np.int32 and op == "sum":
        y = v.astype(np.int64) * world  # first call: the w terms cancel
        for _ in range(chain - 1):
            y = (y * world + 2**31) % 2**32 - 2**31  # int32 sums wrap
        return y.astype(np.int32)
    scale = _SCALE.get(dtype_name, 1.0)
    y = {"sum": v.astype(np.float64) * float(world) ** chain,
         "avg": v.astype(np.float64),
         "max": (v + w).astype(np.float64),
         "min": (v - w).astype(np.float64)}[op] * scale
    out_dtype = np.dtype(np.float32) if (op == "avg" and dtype == np.int32) else dtype
    if not _exact(y, out_dtype):
        raise AssertionError(f"jax_ar bench: the {op}/{dtype_name} chain of {chain} calls over "
                             f"{world} ranks is not exact in {out_dtype} (chain_length is wrong)")
    return y.astype(out_dtype)


# The unsigned type of each element size: values compared bit for bit.
UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def count_wrong(got: np.ndarray, want: np.ndarray) -> int:
    """Elements that differ bit for bit (shapes and dtypes must match)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return max(got.size, want.size)
    unsigned = UNSIGNED[got.dtype.itemsize]
    return int(np.count_nonzero(got.reshape(-1).view(unsigned) != want.reshape(-1).view(unsigned)))


# --- all-reduce + RMSNorm ---------------------------------------------------
# The chain feeds each call's normalized output back as the next partial sums
# and its residual output as the next residual, like consecutive layers. The
# normalization is not exact in any dtype, so the check is a tolerance
# against a float64 emulation that rounds where the kernels round. It holds
# for one call; along a chain a correct kernel and the emulation part by
# a rounding here and there, which the residual stream keeps, so bench
# checks a chain's first call against this and its last against that
# call's own inputs (timing.chained_to_count_ends).

def rms_norm_inputs(dtype_name: str, tokens: int, hidden: int, rank: int, world: int,
                    seed: int = 0):
    """(x of this rank, residual, gamma); residual and gamma are the same on every rank."""
    count = tokens * hidden
    x = rank_values(dtype_name, count, rank, world, seed).reshape(tokens, hidden)
    rng = np.random.default_rng([seed, count, 7])
    residual = rng.integers(-8, 9, count).reshape(tokens, hidden).astype(DTYPES[dtype_name])
    gamma = (0.5 + 0.25 * rng.integers(0, 5, hidden)).astype(DTYPES[dtype_name])
    return x, residual, gamma


def rms_norm_calls(parts, residual, gamma, eps: float):
    """(out, residual_out) of each call of the chain in turn, without end:
    float64 with rounding to the dtype after each call."""
    dtype = residual.dtype
    summed = np.sum([p.astype(np.float64) for p in parts], axis=0)
    res = residual.astype(np.float64)
    g = gamma.astype(np.float64)
    world = len(parts)
    while True:
        res = (summed + res).astype(dtype).astype(np.float64)
        rms = np.sqrt(np.mean(res * res, axis=-1, keepdims=True) + eps)
        out = (res / rms * g).astype(dtype)
        summed = out.astype(np.float64) * world  # every rank feeds back the same out
        yield out, res.astype(dtype)


def rms_norm_reference(parts, residual, gamma, eps: float, chain: int = 1):
    """(out, residual_out) after `chain` chained calls (rms_norm_calls)."""
    return next(itertools.islice(rms_norm_calls(parts, residual, gamma, eps), chain - 1, None))


# rms_norm_wrong's tolerance: ROUNDINGS roundings of the dtype (by its
# element size) of the value, or of 1 near zero.
ROUNDINGS = 8
ROUNDING = {2: 2.0**-7, 4: 2.0**-20}


def rms_norm_wrong(got, want) -> int:
    """Elements off the emulation by more than a few roundings of the dtype."""
    got64 = np.asarray(got).astype(np.float64)
    want64 = np.asarray(want).astype(np.float64)
    rounding = ROUNDING[np.asarray(want).dtype.itemsize]
    tol = ROUNDINGS * rounding * (np.abs(want64) + 1.0)
    return int(np.count_nonzero(~(np.abs(got64 - want64) <= tol)))  # NaN counts as wrong
