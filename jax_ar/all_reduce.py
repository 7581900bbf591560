"""jax_ar.all_reduce: the primitive, its rules, and the public function."""
from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from . import _call_order, _compat, config, selection
from ._native import ALGORITHM_CODES, OP_CODES
from .communicator import Communicator, find_communicator

__all__ = ["all_reduce"]

OPS = ("sum", "avg", "max", "min")
SUPPORTED_DTYPES = tuple(np.dtype(t) for t in (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32))

# One call reduces one or more arrays (leaves of a pytree) in one exchange.
# Params: axes (tuple of axis names), op, algorithm ("oneshot" | "twoshot"),
# comm_id (which communicator), world_size, vma (whether the enclosing
# shard_map tracks varying axes; decides the transpose, as for psum).
all_reduce_p = Primitive("jax_ar_all_reduce")
all_reduce_p.multiple_results = True


def _abstract_eval(*avals, axes, **_):
    # Like psum: the result no longer varies over the reduced axes.
    return [_compat.with_varying_axes(a, _compat.varying_axes(a) - set(axes)) for a in avals]


all_reduce_p.def_abstract_eval(_abstract_eval)


def _impl(*args, **params):
    raise ValueError("jax_ar.all_reduce must be called inside jax.shard_map")


all_reduce_p.def_impl(_impl)


def _lowering(ctx, *args, axes, op, algorithm, comm_id, world_size, vma):
    return _call_order.ffi_call_in_order(  # CPU: keeps calls in program order
        ctx, "jax_ar_all_reduce", args, comm_id=np.int64(comm_id), op=np.int32(OP_CODES[op]),
        algorithm=np.int32(ALGORITHM_CODES[algorithm]))


# Not cacheable: each call must be lowered in place to be chained (_call_order.py).
mlir.register_lowering(all_reduce_p, _lowering, cacheable=False)


def _jvp(primals, tangents, **params):
    outs = all_reduce_p.bind(*primals, **params)
    if params["op"] not in ("sum", "avg"):
        raise NotImplementedError(
            f"jax_ar.all_reduce(op={params['op']!r}) is not differentiable "
            "(neither is jax.lax.pmax/pmin); use op='sum' or 'avg'")
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return outs, all_reduce_p.bind(*tangents, **params)


ad.primitive_jvps[all_reduce_p] = _jvp


def _transpose(cts, *args, axes, op, algorithm, comm_id, world_size, vma):
    del args
    cts = [ad.instantiate_zeros(ct) for ct in cts]
    if vma:
        # The cotangent of an invariant result is the same on every rank:
        # each input's cotangent is that value, marked varying (psum's rule).
        out = [_as_varying(ct, axes) for ct in cts]
    else:
        out = all_reduce_p.bind(*cts, axes=axes, op="sum", algorithm=algorithm,
                                comm_id=comm_id, world_size=world_size, vma=vma)
    if op == "avg":
        out = [ct / world_size for ct in out]
    return out


ad.primitive_transposes[all_reduce_p] = _transpose


def _batch(args, dims, **params):
    # Elementwise across ranks: a batch dimension is just part of the shape.
    return all_reduce_p.bind(*args, **params), dims


batching.primitive_batchers[all_reduce_p] = _batch


def _as_varying(x, axes):
    missing = tuple(a for a in axes if a not in _compat.varying_axes(jax.typeof(x)))
    return _compat.pcast_to_varying(x, missing) if missing else x


def all_reduce(x, axis_name, op="sum", algorithm="auto"):
    """All-reduce `x` (an array or pytree of arrays) over mesh axis `axis_name`
    inside jax.shard_map. Same result as psum/pmean/pmax/pmin, invariant over
    the axis. op: "sum" | "avg" | "max" | "min"; algorithm: "auto" |
    "oneshot" | "twoshot" | "psum". "avg" of int32 returns float32, as pmean.
    """
    if not isinstance(op, str) or op not in OPS:
        raise ValueError(f"jax_ar.all_reduce: op must be one of {OPS}, got {op!r}")
    if not isinstance(algorithm, str) or algorithm not in config.ALGORITHMS:
        raise ValueError(f"jax_ar.all_reduce: algorithm must be one of {config.ALGORITHMS}, "
                         f"got {algorithm!r}")
    axes = _check_axes(axis_name)
    if len(set(axes)) != len(axes):
        raise ValueError(f"jax_ar.all_reduce: axis_name names an axis twice: {axis_name!r}")
    leaves, treedef = jax.tree_util.tree_flatten(x)
    for leaf in leaves:
        dtype = getattr(leaf, "dtype", None)
        if dtype is None or np.dtype(dtype) not in SUPPORTED_DTYPES:
            raise TypeError(
                f"jax_ar.all_reduce: unsupported dtype {dtype} (supported: "
                f"{', '.join(str(d) for d in SUPPORTED_DTYPES)})")
    if algorithm == "auto":
        algorithm = config.algorithm_override() or "auto"
    if len(axes) > 1:  # jax_ar inside a host, psum across hosts: hierarchical.py
        from .hierarchical import all_reduce_over_axes

        out = all_reduce_over_axes(leaves, axes, op, algorithm)
    else:
        out = _reduce_leaves(leaves, axes, op, algorithm, _communicator_for(axes))
    return jax.tree_util.tree_unflatten(treedef, out)


def _check_axes(axis_name, what="jax_ar.all_reduce") -> tuple:
    axes = (axis_name,) if isinstance(axis_name, str) else axis_name
    if not isinstance(axes, tuple) or not axes or not all(isinstance(a, str) for a in axes):
        raise TypeError(f"{what}: axis_name must be a mesh axis name (str), got "
                        f"{axis_name!r}")
    mesh = jax.sharding.get_abstract_mesh()
    manual = set(getattr(mesh, "manual_axes", ()))
    for a in axes:
        if a not in manual:
            where = ("outside jax.shard_map" if not manual else
                     f"over axis {a!r}, which is not a manual axis of the enclosing "
                     f"shard_map (its axes: {sorted(manual)})")
            raise ValueError(f"{what} called {where}; call it inside "
                             f"jax.shard_map over a mesh with axis {a!r}")
    return axes


def _communicator_for(axes, what="jax_ar.all_reduce") -> Communicator:
    mesh = jax.sharding.get_abstract_mesh()
    comm = find_communicator(axes[0], mesh.axis_names, mesh.axis_sizes)
    if comm is None:
        raise ValueError(f"{what}: no communicator for axis {axes[0]!r}; call "
                         f"jax_ar.setup(mesh, {axes[0]!r}) before tracing")
    return comm


def _psum_like(leaf, axes, op):
    reduce = {"sum": jax.lax.psum, "avg": jax.lax.pmean, "max": jax.lax.pmax,
              "min": jax.lax.pmin}[op]
    return reduce(leaf, axes)


def _reduce_leaves(leaves, axes, op, algorithm, comm):
    if algorithm == "psum" or not comm.serves_calls:
        if algorithm != "psum":
            reason = "closed" if comm.closed else comm.fallback_reason
            config.log_once(("psum", comm.comm_id),
                            f"jax_ar: all_reduce over {axes[0]!r} lowers to psum: {reason}")
        return [_psum_like(leaf, axes, op) for leaf in leaves]

    vma = _compat.check_vma_enabled()
    out = [None] * len(leaves)
    # Integer averages follow pmean: the kernels sum, then true division
    # (float32). Leaves that need a different kernel op go in separate calls.
    kernel_ops = ["sum" if op == "avg" and leaf.dtype == jnp.int32 else op for leaf in leaves]
    for i, leaf in enumerate(leaves):
        if np.size(leaf) == 0:
            out[i] = _empty_result(leaf, axes, op)
    for kernel_op in dict.fromkeys(kernel_ops):
        todo = [i for i, leaf in enumerate(leaves)
                if kernel_ops[i] == kernel_op and np.size(leaf) > 0]
        for group in _pack(todo, leaves, comm.capacity_bytes("twoshot")):
            inputs = [leaves[i] for i in group]
            if vma:
                inputs = [_as_varying(v, axes) for v in inputs]
            nbytes = sum(v.size * v.dtype.itemsize for v in inputs)
            chosen = algorithm
            if chosen == "auto":
                chosen = selection.choose_for(comm, nbytes)
            if chosen == "psum":
                results = [_psum_like(v, axes, op) for v in inputs]
            else:
                results = all_reduce_p.bind(*inputs, axes=axes, op=kernel_op, algorithm=chosen,
                                            comm_id=comm.comm_id, world_size=comm.world_size,
                                            vma=vma)
                if kernel_op != op:
                    results = [r / comm.world_size for r in results]
            for i, r in zip(group, results):
                out[i] = r
    return out


def _empty_result(leaf, axes, op):
    """An empty array needs no exchange (and no NCCL call either): a constant
    of the result's type, varying over the axes the input varies over
    except the reduced ones."""
    dtype = jnp.float32 if op == "avg" and leaf.dtype == jnp.int32 else leaf.dtype
    remaining = tuple(sorted(_compat.varying_axes(jax.typeof(leaf)) - set(axes)))
    empty = jnp.zeros(leaf.shape, dtype)
    return _compat.pcast_to_varying(empty, remaining) if remaining else empty


def _pack(indices, leaves, capacity):
    """Splits leaves into calls of at most `capacity` bytes each (a larger
    leaf gets a call of its own and is carried in several rounds)."""
    groups, current, used = [], [], 0
    for i in indices:
        nbytes = -(-leaves[i].size * leaves[i].dtype.itemsize // 16) * 16
        if current and used + nbytes > capacity:
            groups.append(current)
            current, used = [], 0
        current.append(i)
        used += nbytes
    if current:
        groups.append(current)
    return groups
