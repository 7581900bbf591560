"""Helpers of the "lax forms" suites: run jax_ar's collectives and jax.lax's
on the same per-rank inputs and compare results and types.

Like axes_cases.run_cases, but a case may return any pytree (scalars
included): every leaf gets its own output block. Each run records every
leaf's type at trace time (shape, dtype, weak type, varying axes), so
jax_ar's types can be compared with lax's without running lax (on the GPU
machine, where XLA's collectives cannot run). jax_ar's cases and lax's run
in separate programs: XLA:CPU does not order XLA's collectives with jax_ar's
calls.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from axes_cases import as_block, per_rank_blocks, rank_layout, stacked_inputs
from common import assert_bitwise_equal, global_array

ON_GPU = os.environ.get("JAX_AR_TEST_PLATFORM", "cpu") == "gpu"


def leaf_type(y):
    from jax_ar import _compat

    a = jax.typeof(y)
    return (tuple(a.shape), np.dtype(a.dtype), bool(a.weak_type),
            frozenset(_compat.varying_axes(a)))


def run_tree_cases(mesh, cases, check_vma=True):
    """cases: {name: (fn, [per-rank inputs of each argument])}. Returns
    ({name: [{rank: numpy leaf}] per leaf}, {name: [leaf types]})."""
    spec, ranks = rank_layout(mesh)
    names = list(cases)
    flat_inputs, arity = stacked_inputs(cases, ranks)
    types, counts = {}, {}

    def body(*xs):
        outs, i = [], 0
        for name, k in zip(names, arity):
            local = [x[0] for x in xs[i:i + k]]
            i += k
            leaves = jax.tree_util.tree_leaves(cases[name][0](*local))
            types[name] = [leaf_type(leaf) for leaf in leaves]
            counts[name] = len(leaves)
            outs.extend(as_block(jnp.asarray(leaf), mesh) for leaf in leaves)
        return tuple(outs)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=tuple(spec for _ in flat_inputs),
                              out_specs=spec, check_vma=check_vma))
    results = f(*[global_array(x, mesh, spec) for x in flat_inputs])
    out, i = {}, 0
    for name in names:
        out[name] = [per_rank_blocks(r) for r in results[i:i + counts[name]]]
        i += counts[name]
    return out, types


def _traced_types(mesh, fn, args, check_vma):
    """The leaf types of fn on per-rank inputs `args`, traced only (nothing
    runs). The traced inputs carry the sharding run_tree_cases gives its
    arrays: shard_map checks in_specs against it (jax 0.11 refuses P(None)
    inputs for P('tp') specs)."""
    spec, ranks = rank_layout(mesh)
    sharding = NamedSharding(mesh, spec)
    shapes = [jax.ShapeDtypeStruct((ranks,) + np.shape(per_rank[0]),
                                   np.asarray(per_rank[0]).dtype, sharding=sharding)
              for per_rank in args]
    types = []

    def body(*xs):
        leaves = jax.tree_util.tree_leaves(fn(*[x[0] for x in xs]))
        types.extend(leaf_type(leaf) for leaf in leaves)
        return xs[0]

    jax.eval_shape(jax.shard_map(body, mesh=mesh, in_specs=tuple(spec for _ in shapes),
                                 out_specs=spec, check_vma=check_vma), *shapes)
    return types


def traced_types(mesh, cases, check_vma=True):
    """({name: the leaf types}, {name: the exception type}) of each case,
    traced only: a case that raises while traced goes to the second (jax
    0.12.1's lax refuses some forms older releases took)."""
    types, refused = {}, {}
    for name, (fn, args) in cases.items():
        try:
            types[name] = _traced_types(mesh, fn, args, check_vma)
        except Exception as e:  # noqa: BLE001 (what is compared is the type)
            refused[name] = type(e)
    return types, refused


def compare_with_lax(mesh, cases, expected=None, check_vma=True, exact=lambda name: True):
    """cases: {name: (ours, theirs, [per-rank inputs of each argument])}.
    jax_ar's results must have lax's types; their values must equal
    `expected[name]` (a list per leaf of per-rank numpy arrays) where given,
    and on CPU lax's own bit for bit where `exact(name)` (data for which
    every summation order agrees). Returns jax_ar's results."""
    ours = {k: (fn, args) for k, (fn, _, args) in cases.items()}
    theirs = {k: (fn, args) for k, (_, fn, args) in cases.items()}
    # A form jax.lax refuses (this jax's rule) jax_ar must refuse alike.
    want_types, refused = traced_types(mesh, theirs, check_vma)
    ours_refused = traced_types(mesh, {k: ours[k] for k in refused}, check_vma)[1]
    for name, error in refused.items():
        assert ours_refused.get(name) is error, \
            f"{name} (check_vma={check_vma}): lax raises {error.__name__}, jax_ar " \
            f"{ours_refused[name].__name__ if name in ours_refused else 'does not'}"
    cases = {k: v for k, v in cases.items() if k not in refused}
    ours = {k: v for k, v in ours.items() if k not in refused}
    theirs = {k: v for k, v in theirs.items() if k not in refused}
    results, types = run_tree_cases(mesh, ours, check_vma)
    lax_results = None
    if not ON_GPU:
        lax_results, lax_run_types = run_tree_cases(mesh, theirs, check_vma)
        # What the GPU run compares with: traced types must be the run's.
        assert lax_run_types == want_types, (lax_run_types, want_types)
    for name in cases:
        assert types[name] == want_types[name], \
            f"{name} (check_vma={check_vma}): jax_ar gives {types[name]}, lax {want_types[name]}"
        for i, per_rank in enumerate(results[name]):
            for rank, got in per_rank.items():
                what = f"{name} leaf {i} on rank {rank} (check_vma={check_vma})"
                if expected is not None and name in expected:
                    want = np.asarray(expected[name][i][rank]).astype(got.dtype)
                    assert_bitwise_equal(got, want.reshape(got.shape), what)
                if lax_results is not None and exact(name):
                    assert_bitwise_equal(got, lax_results[name][i][rank], what + " vs lax")
    return results
