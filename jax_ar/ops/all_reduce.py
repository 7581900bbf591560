"""The all_reduce primitive, and `run_all_reduce`, which carries out an
all-reduce's plan (ops/plan.py) step by step.

One call of the primitive reduces one or more arrays (leaves of a pytree)
in one exchange. Params: axes (tuple of axis names), op, algorithm (the
kernel: "oneshot" | "twoshot" | "twoshot_ll"), comm_id (which
communicator), world_size, vma (whether the enclosing shard_map tracks
varying axes; decides the transpose, as for psum).

Over several mesh axes (docs/multi_axis.md) a plan's step is one of two
compositions, for the leaves of one dtype as one flat message:

  allreduce_psum        (a) jax_ar all-reduce over the inner axis, then psum
                            of the whole message over the outer axes;
  scatter_psum_gather   (b) jax_ar reduce-scatter over the inner axis, psum of
                            each rank's 1/n share over the outer axes, jax_ar
                            all-gather over the inner axis: the two halves of
                            two-shot with the cross-host step in between,
                            which sends n times less across hosts.

Every rank gets the same bits ((b) reduces each element across hosts
once and copies it); the two agree bit for bit when the cross-host step does
not depend on order (two hosts, integers, max/min).
"""
from __future__ import annotations

import dataclasses

import numpy as np

import jax
import jax.numpy as jnp
from jax.interpreters import ad, batching

from .. import _compat
from .._native import ALGORITHM_CODES, OP_CODES
from . import _call_order
from ._axes import as_varying
from ._primitive import call_lax, collective_primitive, over_vmap_axes
from .plan import CONSTANT, KERNEL, LAX, LAX_NAMES, LOCAL, VMAP, operand_dtype
from .scatter_gather import gather_rows, scatter_rows

__all__ = ["LAX_REDUCTIONS", "all_reduce_p", "lax_reduce", "run_all_reduce"]

# The lax collectives jax_ar's ops stand in for (and fall back to), by op name.
LAX_REDUCTIONS = {"sum": jax.lax.psum, "avg": jax.lax.pmean, "max": jax.lax.pmax,
                  "min": jax.lax.pmin}


def lax_reduce(x, axes, op):
    """The lax collective of `op` over `axes`, in its place among jax_ar's
    calls on CPU (_call_order.in_chain)."""
    return _call_order.in_chain(LAX_REDUCTIONS[op], x, axes)


def _abstract_eval(*avals, axes, vma, **_):
    # Like psum: the result no longer varies over the reduced axes. Without
    # check_vma, jax.lax's psum / pmax / pmin gave a strongly typed result
    # up to jax 0.12.0 (a fresh ShapedArray), so this one does there too.
    out = [_compat.with_varying_axes(a, _compat.varying_axes(a) - set(axes)) for a in avals]
    if vma or _compat.LAX_REDUCTIONS_KEEP_WEAK_TYPE:
        return out
    return [a.update(weak_type=False) for a in out]


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


def run_all_reduce(plan, leaves) -> list:
    """The results of an all-reduce of `leaves` as `plan` (ops/plan.py,
    made for these leaves) says, in the order of its steps."""
    if plan.lax_only:
        return _lax_only(plan, leaves)
    op, out = plan.op, [None] * len(leaves)
    values = dict(zip(plan.arrays, _local(plan, [_operand(leaves[i], op) for i in plan.arrays])))
    link = None  # multi-axis steps run one after another (_call_order)
    for step in plan.steps:
        inputs = [values[i] if i in values else _operand(leaves[i], op) for i in step.leaves]
        if step.kind == LOCAL:
            results = inputs
        elif step.kind == CONSTANT:
            results = [empty_result(v, step.axes, step.op) if i in values else
                       _constant(leaves[i], plan) for i, v in zip(step.leaves, inputs)]
        elif step.kind == LAX:
            results = call_lax(plan.what, LAX_NAMES[step.op], _lax_each, inputs, step.axes,
                               step.op)
        elif step.kind == KERNEL:
            results = _kernel_call(inputs, step)
        else:
            results = link = _multi_axis(inputs, step, link)
        if step.divide > 1:
            results = [_divide(v, step.divide) for v in results]
        for i, r in zip(step.leaves, results):
            out[i] = _divide(r, plan.divide) if plan.divide > 1 and i in values else r
    return out


def _operand(leaf, op):
    """A leaf as the array it is reduced as (bool sums are int32 sums, as
    jax.lax's)."""
    x = leaf if isinstance(leaf, jax.core.Tracer) else jnp.asarray(leaf)
    dtype = operand_dtype(x, op)
    return x if x.dtype == dtype else x.astype(dtype)


def _lax_each(values, axes, op):
    return [lax_reduce(v, axes, op) for v in values]


def _local(plan, values):
    """The plan's reductions over vmap and size-1 axes: local arithmetic."""
    for where, axes, op in plan.local:
        if where == VMAP:
            values = over_vmap_axes(plan.what, LAX_NAMES[op], _lax_each, values, axes, op)
        else:
            values = call_lax(plan.what, LAX_NAMES[op], _lax_each, values, axes, op)
    return values


def _lax_only(plan, leaves):
    """A form only jax.lax takes (positional axes, axis_index_groups)."""
    (step,) = plan.steps
    fn, lax_name = LAX_REDUCTIONS[plan.op], LAX_NAMES[plan.op]
    if plan.positional or not _compat.check_vma_enabled():
        return call_lax(plan.what, lax_name, fn, list(leaves), step.axes,
                        axis_index_groups=plan.groups)
    # jax.lax.psum refuses groups under check_vma (NotImplementedError): the
    # collective runs without the varying-axes checks, and each result is
    # typed as varying over its input's axes and the reduced ones (each
    # group has its own result).
    out = []
    for leaf in leaves:
        varying = _compat.varying_axes(jax.typeof(leaf)) if hasattr(leaf, "dtype") else frozenset()
        with _compat.without_vma_checks():
            r = call_lax(plan.what, lax_name, fn, leaf, step.axes, axis_index_groups=plan.groups)
        missing = tuple(a for a in (*sorted(varying, key=str), *step.axes)
                        if a not in _compat.varying_axes(jax.typeof(r)))
        out.append(_compat.pcast_to_varying(r, missing) if missing else r)
    return out


def _constant(leaf, plan):
    """psum / pmean of a value that is not traced. jax.lax multiplies Python
    and numpy constants by the axis size, but exchanges bools and concrete
    jax arrays as if they were data; every rank holds the same value, so
    jax_ar gives lax's values and types without the exchange (which ranks
    sharing a GPU could not run: NCCL refuses them)."""
    if not (isinstance(leaf, jax.Array) or np.asarray(leaf).dtype == np.bool_):
        return call_lax(plan.what, LAX_NAMES[plan.op], lax_reduce, leaf, plan.axes, plan.op)
    x = jnp.asarray(leaf)
    if x.dtype == np.bool_:
        x = x.astype(jnp.int32)  # as jax.lax.psum
    size = jax.lax.psum(1, plan.axes)  # a Python int: lax's constant rule
    total = x * size
    return total if plan.op == "sum" else total / size  # int32 averages are float32, as pmean's


def _kernel_call(inputs, step):
    """One call of jax_ar's kernel over the step's axis."""
    vma = _compat.check_vma_enabled()
    if vma:
        inputs = [as_varying(v, step.axes) for v in inputs]
    return all_reduce_p.bind(*inputs, axes=step.axes, op=step.op, algorithm=step.kernel,
                             comm_id=step.comm.comm_id, world_size=step.comm.world_size, vma=vma)


def _multi_axis(inputs, step, link):
    """A composition over several mesh axes of leaves of one dtype, as one
    flat message; after `link` (the previous composition's result), since
    XLA:CPU would otherwise interleave jax_ar's calls and psums of different
    groups differently on each host."""
    if _compat.check_vma_enabled():
        inputs = [as_varying(v, step.axes) for v in inputs]
    flat = jnp.concatenate([v.reshape(-1) for v in inputs])
    if link is not None:
        (flat,) = _call_order.after([flat], link[-1])
    inner, outer = step.axes[:1], step.axes[1:]
    if step.composition == "scatter_psum_gather":
        reduced = _scatter_psum_gather(flat, inner[0], outer, step.op, step.comm)
    elif step.kernel == "psum":
        reduced = lax_reduce(lax_reduce(flat, inner, step.op), outer, step.op)
    else:
        (inside,) = _kernel_call([flat], dataclasses.replace(step, axes=inner))
        reduced = lax_reduce(inside, outer, step.op)
    out, start = [], 0
    for v in inputs:
        out.append(reduced[start:start + v.size].reshape(v.shape))
        start += v.size
    return out


def _scatter_psum_gather(flat, inner, outer, op, comm):
    """Composition (b) on a 1-D array: padded so that each rank's share is a
    whole number of 16-byte blocks."""
    n = comm.world_size
    block = max(1, 16 // flat.dtype.itemsize)
    share = -(-flat.size // (n * block)) * block
    rows = jnp.pad(flat, (0, n * share - flat.size)).reshape(n, share)
    mine = scatter_rows(rows, inner, op, comm)
    mine = lax_reduce(mine, outer, op)
    whole = gather_rows(mine, inner, comm, invariant=_compat.check_vma_enabled())
    return whole.reshape(-1)[:flat.size]


def _divide(total_sum, count):
    """avg from a sum: float32 division, rounded once (int32 gives float32, as pmean)."""
    if total_sum.dtype == jnp.int32:
        return total_sum.astype(jnp.float32) / np.float32(count)
    return (total_sum.astype(jnp.float32) / np.float32(count)).astype(total_sum.dtype)


def empty_result(leaf, axes, op):
    """An empty array needs no exchange (and no NCCL call either): a constant
    of the result's type, varying over the axes the input varies over
    except the reduced ones."""
    dtype = jnp.float32 if op == "avg" and leaf.dtype == jnp.int32 else leaf.dtype
    remaining = tuple(sorted(_compat.varying_axes(jax.typeof(leaf)) - set(axes)))
    empty = jnp.zeros(leaf.shape, dtype)
    return _compat.pcast_to_varying(empty, remaining) if remaining else empty
