"""The public row-parallel product: argument checks, then ops/matmul_all_reduce."""
from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from . import config
from .ops._axes import classify_axes
from .ops.matmul_all_reduce import (check_result_dtype, local_matmul_all_reduce,
                                    matmul_all_reduce_p)

__all__ = ["matmul_all_reduce"]


def matmul_all_reduce(x, w, axis_name, *, precision=None, preferred_element_type=None,
                      algorithm="auto"):
    """y = x [..., K] @ w [K, N] where K is sharded over mesh axis
    `axis_name`: each rank multiplies its slice and jax_ar's all-reduce sums
    the partial products (the row-parallel layer of tensor parallelism).

    Inside jax.shard_map (the axis manual), x and w are this rank's shards
    [..., K / n] and [K / n, N]; the result is invariant over the axis, like
    psum's. In plain jit on arrays sharded over a mesh that jax_ar.setup saw
    (sharding annotations, no shard_map), x and w are the global arrays and
    the call partitions itself: K over `axis_name`, N replicated, x's leading
    dimensions keeping their sharding; each shard runs the local product and
    jax_ar's all-reduce (psum where jax_ar does not serve the axis, logged).

    x and w are promoted to one dtype as jnp.matmul does; the product (of
    `preferred_element_type` if given) must be float32, bfloat16, float16 or
    int32. precision as lax.dot_general's. algorithm: the all-reduce's
    ("auto" | "oneshot" | "twoshot" | "psum"). Differentiable (the
    derivative's products are XLA's, partitioned by XLA) and vmappable.
    """
    op = "jax_ar.matmul_all_reduce"
    if not isinstance(algorithm, str) or algorithm not in config.ALGORITHMS:
        raise ValueError(f"{op}: algorithm must be one of {config.ALGORITHMS}, got {algorithm!r}")
    if not isinstance(axis_name, str):
        raise TypeError(f"{op}: axis_name must be one mesh axis name (str), got {axis_name!r}")
    x, w = (jnp.asarray(a) if not hasattr(a, "dtype") else a for a in (x, w))
    if np.ndim(x) < 1 or np.ndim(w) != 2:
        raise ValueError(f"{op}: x must be [..., K] and w [K, N], got shapes "
                         f"{tuple(np.shape(x))} and {tuple(np.shape(w))}")
    dtype = jnp.result_type(x, w)
    x, w = x.astype(dtype), w.astype(dtype)
    preferred = None if preferred_element_type is None else np.dtype(preferred_element_type)
    check_result_dtype(op, x, w, preferred)
    if algorithm == "auto":
        algorithm = config.algorithm_override() or "auto"
    mesh = jax.sharding.get_abstract_mesh()
    manual = set(getattr(mesh, "manual_axes", ()))
    if axis_name in manual:
        if x.shape[-1] != w.shape[0]:
            raise ValueError(f"{op}: x's shard has {x.shape[-1]} features but w's has "
                             f"{w.shape[0]} rows")
        return local_matmul_all_reduce(x, w, classify_axes((axis_name,), op), op,
                                       precision=precision, preferred_element_type=preferred,
                                       algorithm=algorithm)
    if manual:
        raise ValueError(f"{op} called inside a shard_map whose manual axes "
                         f"{sorted(manual)} do not include {axis_name!r}; call it inside a "
                         f"shard_map over {axis_name!r} or outside shard_map")
    if x.shape[-1] != w.shape[0]:
        raise ValueError(f"{op}: x has {x.shape[-1]} features but w has {w.shape[0]} rows")
    _check_axis_in_meshes(op, axis_name, mesh, x, w)
    return matmul_all_reduce_p.bind(x, w, axis=axis_name, precision=precision,
                                    preferred_element_type=preferred, algorithm=algorithm)


def _check_axis_in_meshes(op, axis_name, context_mesh, *arrays) -> None:
    """In plain jit: `axis_name` must be an axis of the meshes the call can
    see (jax.set_mesh's, and those x's and w's shardings name). Without
    this check a missing axis surfaces only while XLA partitions the
    program, as an internal error around the partitioner's traceback."""
    meshes = [context_mesh] + [getattr(jax.typeof(a).sharding, "mesh", None) for a in arrays]
    for mesh in meshes:
        if mesh is None or getattr(mesh, "empty", True):
            continue
        if axis_name not in mesh.axis_names:
            raise ValueError(f"{op}: axis {axis_name!r} is not an axis of the call's mesh "
                             f"{tuple(mesh.axis_names)} (its operands' sharding or "
                             "jax.set_mesh's)")
