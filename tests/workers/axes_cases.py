"""Helpers of the reduce_scatter / all_gather / multi-axis workers.

Every rank's input and every rank's result travel through one global array
whose leading dimension is split over all mesh axes: rank r (its position in
the mesh, row-major) gets block r of each input, and each case's result gets
a leading dimension of 1, so block r of the output is rank r's own result,
whether it varies over the axes or not. Many cases run in one jitted program
(one compile per suite keeps the tests fast).
"""
from __future__ import annotations

import numpy as np

import jax
from jax.sharding import PartitionSpec as P

from common import global_array


def rank_layout(mesh):
    """(spec splitting dim 0 over every mesh axis, number of ranks)."""
    return P(tuple(mesh.axis_names)), int(np.prod(mesh.devices.shape))


def run_cases(mesh, cases, check_vma=True):
    """cases: {name: (fn, [per-rank inputs of each argument])}; fn takes one
    rank's arrays inside shard_map. Returns {name: {rank: numpy result}} for
    this process's ranks."""
    spec, ranks = rank_layout(mesh)
    names = list(cases)
    flat_inputs, arity = stacked_inputs(cases, ranks)

    def body(*xs):
        outs, i = [], 0
        for name, k in zip(names, arity):
            local = [x[0] for x in xs[i:i + k]]
            i += k
            outs.append(as_block(cases[name][0](*local), mesh))
        return tuple(outs)

    in_specs = tuple(spec for _ in flat_inputs)
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs,
                              out_specs=tuple(spec for _ in names), check_vma=check_vma))
    results = f(*[global_array(x, mesh, spec) for x in flat_inputs])
    return {name: per_rank_blocks(out) for name, out in zip(names, results)}


def stacked_inputs(cases, ranks):
    """(every argument of every case with the ranks' inputs stacked along a
    new leading dimension, in case order; the number of arguments of each
    case)."""
    flat_inputs, arity = [], []
    for name, (_, args) in cases.items():
        arity.append(len(args))
        for per_rank in args:
            assert len(per_rank) == ranks, (name, len(per_rank), ranks)
            flat_inputs.append(np.concatenate([np.asarray(a)[None] for a in per_rank]))
    return flat_inputs, arity


def as_block(y, mesh):
    # An invariant result is made varying before it gets its rank dimension,
    # so one out_spec serves every case.
    from jax_ar import _compat

    missing = tuple(a for a in mesh.axis_names if a not in _compat.varying_axes(jax.typeof(y)))
    if missing and _compat.check_vma_enabled():
        y = _compat.pcast_to_varying(y, missing)
    return y[None]


def per_rank_blocks(out) -> dict:
    return {s.index[0].start or 0: np.asarray(s.data)[0] for s in out.addressable_shards}


