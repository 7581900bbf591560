"""Flax NNX modules over jax_ar's norms (importing this module needs flax).

`RMSNorm` and `AllReduceRMSNorm` hold one parameter, `scale`, created like
`flax.nnx.RMSNorm`'s (ones of `param_dtype`, float32 by default), so their
state has the same structure and existing checkpoints load into them with
`nnx.update`. Dtypes follow flax too: with `dtype=None` the computation
runs in the promotion of the inputs' and the parameter's dtypes (bfloat16
activations with a float32 scale compute and return float32); pass
`dtype=jnp.bfloat16` to normalize in bfloat16 with the scale cast to it.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx  # absolute import: the flax package, not this module

from ._norms import all_reduce_rms_norm, rms_norm

__all__ = ["AllReduceRMSNorm", "RMSNorm"]


def _compute_dtype(dtype, *arrays):
    if dtype is not None:
        return jnp.dtype(dtype)
    result = jnp.result_type(*arrays)
    return result if jnp.issubdtype(result, jnp.inexact) else jnp.dtype(jnp.float32)


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis through jax_ar.rms_norm.

    Drop-in for `flax.nnx.RMSNorm(num_features, epsilon=..., rngs=...)` with
    the default reduction/feature axes (-1) and use_scale=True. Called with a
    residual, returns (out, residual_out) as jax_ar.rms_norm does.
    """

    def __init__(self, num_features: int, eps: float = 1e-6, *, dtype=None,
                 param_dtype=jnp.float32, scale_init=nnx.initializers.ones,
                 epsilon: float | None = None, rngs: nnx.Rngs):
        if epsilon is not None:  # flax.nnx.RMSNorm's spelling
            eps = epsilon
        self.scale = nnx.Param(scale_init(rngs.params(), (num_features,), param_dtype))
        self.num_features = num_features
        self.eps = eps
        self.dtype = dtype
        self.param_dtype = param_dtype

    def __call__(self, x, residual=None):
        scale = self.scale[...]
        dtype = _compute_dtype(self.dtype, x, scale, *(() if residual is None else (residual,)))
        residual = None if residual is None else jnp.asarray(residual, dtype)
        return rms_norm(jnp.asarray(x, dtype), scale.astype(dtype), eps=self.eps,
                        residual=residual)


class AllReduceRMSNorm(nnx.Module):
    """The tensor-parallel block boundary: all-reduce of the partial sums `x`
    over `axis_name`, residual add, RMSNorm, through
    jax_ar.all_reduce_rms_norm (call it inside jax.shard_map).

    __call__(x, residual, quant_scale=None) -> (out, residual_out), both
    invariant over `axis_name`.
    """

    def __init__(self, num_features: int, axis_name: str, eps: float = 1e-6, *, dtype=None,
                 param_dtype=jnp.float32, scale_init=nnx.initializers.ones,
                 algorithm: str = "auto", epsilon: float | None = None, rngs: nnx.Rngs):
        if epsilon is not None:
            eps = epsilon
        self.scale = nnx.Param(scale_init(rngs.params(), (num_features,), param_dtype))
        self.num_features = num_features
        self.axis_name = axis_name
        self.eps = eps
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.algorithm = algorithm

    def __call__(self, x, residual, quant_scale=None):
        scale = self.scale[...]
        dtype = _compute_dtype(self.dtype, x, residual, scale)
        return all_reduce_rms_norm(jnp.asarray(x, dtype), jnp.asarray(residual, dtype),
                                   scale.astype(dtype), self.axis_name, eps=self.eps,
                                   algorithm=self.algorithm, quant_scale=quant_scale)
