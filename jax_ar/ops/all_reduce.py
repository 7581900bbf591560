"""The all_reduce primitive and the single-axis reduction of a list of arrays.

One call reduces one or more arrays (leaves of a pytree) in one exchange.
Params: axes (tuple of axis names), op, algorithm ("oneshot" | "twoshot"),
comm_id (which communicator), world_size, vma (whether the enclosing
shard_map tracks varying axes; decides the transpose, as for psum).
"""
from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax.interpreters import ad, batching

from .. import _compat, selection
from .._native import ALGORITHM_CODES, OP_CODES
from . import _call_order
from ._axes import as_varying
from ._primitive import collective_primitive, fallback_reason, log_fallback

__all__ = ["LAX_NAMES", "LAX_REDUCTIONS", "all_reduce_p", "empty_result", "lax_reduce",
           "reduce_leaves"]

# The lax collectives jax_ar's ops stand in for (and fall back to), by op name.
LAX_REDUCTIONS = {"sum": jax.lax.psum, "avg": jax.lax.pmean, "max": jax.lax.pmax,
                  "min": jax.lax.pmin}
LAX_NAMES = {op: f"jax.lax.{fn.__name__}" for op, fn in LAX_REDUCTIONS.items()}


def lax_reduce(x, axes, op):
    """The lax collective of `op` over `axes`, in its place among jax_ar's
    calls on CPU (_call_order.in_chain)."""
    return _call_order.in_chain(LAX_REDUCTIONS[op], x, axes)


def _abstract_eval(*avals, axes, vma, **_):
    # Like psum: the result no longer varies over the reduced axes. Without
    # check_vma, jax.lax's psum / pmax / pmin give a strongly typed result
    # (jax 0.10 to 0.12: a fresh ShapedArray), so this one does too.
    out = [_compat.with_varying_axes(a, _compat.varying_axes(a) - set(axes)) for a in avals]
    return out if vma else [a.update(weak_type=False) for a in out]


def _ffi_attributes(*, op, algorithm, comm_id, **_):
    return dict(comm_id=np.int64(comm_id), op=np.int32(OP_CODES[op]),
                algorithm=np.int32(ALGORITHM_CODES[algorithm]))


def _aliases(ctx, **_):
    """Each result may reuse its operand's buffer (a donated input costs no
    second buffer; XLA copies an operand that is still needed elsewhere).

    CPU: every protocol round copies its whole range of the inputs into the
    workspaces (the peers' slots, or one's own) before it writes any output,
    and later rounds read only later ranges, so out == in is safe. GPU: each
    kernel reads an input vector before the thread that reads it writes the
    same output vector, and reads inputs through L2 (LoadSegment,
    cuda/gpu/launch_protocol.cuh), so out == in is safe there too."""
    return {i: i for i in range(len(ctx.avals_in))}


all_reduce_p = collective_primitive("jax_ar_all_reduce", "all_reduce", _abstract_eval,
                                    _ffi_attributes, axis_of=lambda params: params["axes"][0],
                                    multiple_results=True, aliases_of=_aliases)


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
        out = [as_varying(ct, axes) for ct in cts]
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


def reduce_leaves(leaves, axes, op, algorithm, comm) -> list:
    """all_reduce of each of `leaves` over the one axis `comm` serves
    (`axes` is that axis, as a tuple); algorithm "auto" asks the cost model
    per call."""
    reason = fallback_reason(comm)
    if algorithm == "psum" or reason is not None:
        if algorithm != "psum":
            log_fallback(comm, "all_reduce", axes[0], "psum", reason)
        return [lax_reduce(leaf, axes, op) for leaf in leaves]

    vma = _compat.check_vma_enabled()
    out = [None] * len(leaves)
    # Integer averages follow pmean: the kernels sum, then true division
    # (float32). Leaves that need a different kernel op go in separate calls.
    kernel_ops = ["sum" if op == "avg" and leaf.dtype == jnp.int32 else op for leaf in leaves]
    for i, leaf in enumerate(leaves):
        if np.size(leaf) == 0:
            out[i] = empty_result(leaf, axes, op)
    for kernel_op in dict.fromkeys(kernel_ops):
        todo = [i for i, leaf in enumerate(leaves)
                if kernel_ops[i] == kernel_op and np.size(leaf) > 0]
        for group in _pack(todo, leaves, comm.capacity_bytes("twoshot")):
            inputs = [leaves[i] for i in group]
            if vma:
                inputs = [as_varying(v, axes) for v in inputs]
            nbytes = sum(v.size * v.dtype.itemsize for v in inputs)
            chosen = algorithm
            if chosen == "auto":
                chosen = selection.choose_for(comm, nbytes)
            if chosen == "psum":
                results = [lax_reduce(v, axes, op) for v in inputs]
            else:
                results = all_reduce_p.bind(*inputs, axes=axes, op=kernel_op, algorithm=chosen,
                                            comm_id=comm.comm_id, world_size=comm.world_size,
                                            vma=vma)
                if kernel_op != op:
                    results = [r / comm.world_size for r in results]
            for i, r in zip(group, results):
                out[i] = r
    return out


def empty_result(leaf, axes, op):
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
