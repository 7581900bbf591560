"""Flax NNX modules over jax_ar's norms and row-parallel product (importing
this module needs flax).

`RMSNorm` and `AllReduceRMSNorm` hold the parameter `scale` (and, with
post_norm, `post_scale`), created like `flax.nnx.RMSNorm`'s (`param_dtype`,
float32 by default), so their state has the same structure and existing
checkpoints load into them with `nnx.update`. With scale_offset=1.0 the norm
multiplies by (1 + scale), as Gemma's does, and `scale` starts at zeros: a
Gemma checkpoint loads as it is. Dtypes follow flax.nnx.RMSNorm: with
`dtype=None` x and the scale are promoted together (bfloat16 activations with
a float32 scale compute and return float32, as flax does); `dtype=jnp.
bfloat16` computes in bfloat16 with the scale cast to it. A residual keeps
its own dtype (residual_out has it): a float32 residual stream beside
bfloat16 activations stays float32.

`RowParallelLinear` is `flax.nnx.Linear` (params `kernel` [in, out] and
`bias` [out]) whose input features are sharded over a mesh axis: its
product is jax_ar.matmul_all_reduce, the bias added once after the sum. It
runs inside shard_map (params and inputs are local shards) and in plain jit
on arrays sharded over a mesh that jax_ar.setup saw, so a model written with
sharding annotations adopts jax_ar by swapping its row-parallel layers.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx  # absolute import: the flax package, not this module

from ._linear import matmul_all_reduce
from ._norms import all_reduce_rms_norm, rms_norm

__all__ = ["AllReduceRMSNorm", "RMSNorm", "RowParallelLinear"]


def _compute_dtype(dtype, *arrays):
    """flax's promote_dtype: `dtype`, else the promotion of the arrays (at
    least float32 for integer inputs)."""
    if dtype is not None:
        return jnp.dtype(dtype)
    result = jnp.result_type(*arrays)
    return result if jnp.issubdtype(result, jnp.inexact) else jnp.dtype(jnp.float32)


def _scale_init(scale_init, scale_offset):
    """The given initializer, else one that makes scale + scale_offset 1."""
    if scale_init is not None:
        return scale_init
    return nnx.initializers.constant(1.0 - scale_offset)


def _no_parameter():
    """What flax.nnx.Linear holds for a bias it does not have."""
    data = getattr(nnx, "data", None)
    return data(None) if data is not None else None


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis through jax_ar.rms_norm.

    Drop-in for `flax.nnx.RMSNorm(num_features, epsilon=..., rngs=...)` with
    the default reduction/feature axes (-1) and use_scale=True, and for
    Gemma's RMSNorm with scale_offset=1.0. Called with a residual, returns
    (out, residual_out) as jax_ar.rms_norm does.
    """

    def __init__(self, num_features: int, eps: float = 1e-6, scale_offset: float = 0.0, *,
                 dtype=None, param_dtype=jnp.float32, scale_init=None,
                 epsilon: float | None = None, rngs: nnx.Rngs):
        if epsilon is not None:  # flax.nnx.RMSNorm's spelling
            eps = epsilon
        init = _scale_init(scale_init, scale_offset)
        self.scale = nnx.Param(init(rngs.params(), (num_features,), param_dtype))
        self.num_features = num_features
        self.eps = eps
        self.scale_offset = float(scale_offset)
        self.dtype = dtype
        self.param_dtype = param_dtype

    def __call__(self, x, residual=None):
        scale = self.scale[...]
        dtype = _compute_dtype(self.dtype, x, scale)
        return rms_norm(jnp.asarray(x, dtype), scale.astype(dtype), eps=self.eps,
                        residual=residual, scale_offset=self.scale_offset)


class AllReduceRMSNorm(nnx.Module):
    """The tensor-parallel block boundary: all-reduce of the partial sums `x`
    over `axis_name` (+ bias), with post_norm a norm of that sum (Gemma 2/3's
    post-norm, param `post_scale`), residual add, RMSNorm (param `scale`),
    through jax_ar.all_reduce_rms_norm (call it inside jax.shard_map).

    __call__(x, residual, quant_scale=None, bias=None) -> (out, residual_out),
    both invariant over `axis_name`; bias (e.g. a row-parallel layer's) is
    added once, after the reduction.
    """

    def __init__(self, num_features: int, axis_name: str, eps: float = 1e-6,
                 scale_offset: float = 0.0, post_norm: bool = False, *, dtype=None,
                 param_dtype=jnp.float32, scale_init=None, algorithm: str = "auto",
                 epsilon: float | None = None, rngs: nnx.Rngs):
        if epsilon is not None:
            eps = epsilon
        init = _scale_init(scale_init, scale_offset)
        self.scale = nnx.Param(init(rngs.params(), (num_features,), param_dtype))
        if post_norm:
            self.post_scale = nnx.Param(init(rngs.params(), (num_features,), param_dtype))
        self.num_features = num_features
        self.axis_name = axis_name
        self.eps = eps
        self.scale_offset = float(scale_offset)
        self.post_norm = post_norm
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.algorithm = algorithm

    def __call__(self, x, residual, quant_scale=None, bias=None):
        scale = self.scale[...]
        post_scale = self.post_scale[...] if self.post_norm else None
        dtype = _compute_dtype(self.dtype, x, scale)
        return all_reduce_rms_norm(
            jnp.asarray(x, dtype), residual, scale.astype(dtype), self.axis_name, eps=self.eps,
            algorithm=self.algorithm, quant_scale=quant_scale, scale_offset=self.scale_offset,
            post_gamma=None if post_scale is None else post_scale.astype(dtype), bias=bias)


class RowParallelLinear(nnx.Module):
    """`flax.nnx.Linear` with its input features sharded over `axis_name`:
    y = matmul_all_reduce(x, kernel) (+ bias, once, after the sum).

    Params `kernel` [in_features, out_features] and `bias` [out_features]
    (with use_bias) as nnx.Linear's, so checkpoints move both ways. Inside
    shard_map the layer sees its shards (kernel [in / n, out], x [..., in /
    n]); in plain jit it sees the global arrays, sharded as the model's
    annotations say, and partitions itself. dtype/param_dtype/precision as
    nnx.Linear's.
    """

    def __init__(self, in_features: int, out_features: int, axis_name: str,
                 use_bias: bool = False, *, dtype=None, param_dtype=jnp.float32, precision=None,
                 kernel_init=nnx.initializers.lecun_normal(), bias_init=nnx.initializers.zeros,
                 algorithm: str = "auto", rngs: nnx.Rngs):
        self.kernel = nnx.Param(kernel_init(rngs.params(), (in_features, out_features),
                                            param_dtype))
        if use_bias:
            self.bias = nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype))
        else:
            self.bias = _no_parameter()
        self.in_features = in_features
        self.out_features = out_features
        self.axis_name = axis_name
        self.use_bias = use_bias
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.precision = precision
        self.algorithm = algorithm

    def __call__(self, x):
        kernel = self.kernel[...]
        bias = self.bias[...] if self.use_bias else None
        dtype = _compute_dtype(self.dtype, x, kernel, *(() if bias is None else (bias,)))
        y = matmul_all_reduce(jnp.asarray(x, dtype), kernel.astype(dtype), self.axis_name,
                              precision=self.precision, algorithm=self.algorithm)
        if bias is not None:
            y = y + bias.astype(dtype)
        return y
