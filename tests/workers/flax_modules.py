"""One rank of the jax_ar.flax tests. Usage: flax_modules.py [SUITE...]

Suites: rms_norm (jax_ar.flax.RMSNorm against flax.nnx.RMSNorm: parameter,
state structure, checkpoints both ways, outputs for the dtype combinations
flax supports), all_reduce_rms_norm (jax_ar.flax.AllReduceRMSNorm inside
shard_map against numpy and against flax's RMSNorm of the summed input),
tp_block (examples/tp_transformer_block.py: the tensor-parallel block
against the same block unsharded).
"""
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

import jax_ar
import jax_ar.flax
from common import assert_equal_nan_aware, global_array, log, main_guard, run_suites, suites_in
from norm_checks import (FLOAT_DTYPES, add_residual, assert_norm_close,
                         norm_float64, random_normal, sum_in_rank_order)

SEED = int(os.environ.get("JAX_AR_TEST_SEED", "0"))
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"

# (input dtype, param_dtype, dtype): flax's defaults, bfloat16 activations
# with float32 parameters (computed in float32, as flax does), and
# explicitly bfloat16 / float16 computation.
DTYPE_COMBINATIONS = [
    ("float32", "float32", None), ("bfloat16", "float32", None),
    ("bfloat16", "float32", "bfloat16"), ("bfloat16", "bfloat16", None),
    ("float16", "float32", "float16"),
]


def suite_rms_norm(mesh):
    rng = np.random.default_rng(SEED + 31)
    hidden = 384
    for x_dt, param_dt, dt in DTYPE_COMBINATIONS:
        what = f"RMSNorm x={x_dt} param_dtype={param_dt} dtype={dt}"
        dtype = None if dt is None else FLOAT_DTYPES[dt]
        theirs = nnx.RMSNorm(hidden, epsilon=1e-5, dtype=dtype,
                             param_dtype=FLOAT_DTYPES[param_dt], rngs=nnx.Rngs(0))
        ours = jax_ar.flax.RMSNorm(hidden, eps=1e-5, dtype=dtype,
                                   param_dtype=FLOAT_DTYPES[param_dt], rngs=nnx.Rngs(0))
        # Fresh modules: the same parameter, initialized the same way.
        assert jax.tree.structure(nnx.state(ours)) == jax.tree.structure(nnx.state(theirs)), what
        assert_equal_nan_aware(np.asarray(ours.scale[...]), np.asarray(theirs.scale[...]),
                             what + " initial scale")
        # A trained flax checkpoint loads into ours (and back).
        theirs.scale[...] = jnp.asarray(random_normal(rng, (hidden,), FLOAT_DTYPES[param_dt]))
        nnx.update(ours, nnx.state(theirs))
        assert_equal_nan_aware(np.asarray(ours.scale[...]), np.asarray(theirs.scale[...]), what)
        x = jnp.asarray(random_normal(rng, (2, 5, hidden), FLOAT_DTYPES[x_dt], scale=2.0))
        got, want = ours(x), theirs(x)
        assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype)
        # Both are roundings of the same float32 formula: one ulp apart at most.
        assert_norm_close(np.asarray(got), np.asarray(want, np.float64), what)
        restored = nnx.RMSNorm(hidden, epsilon=1e-5, dtype=dtype,
                               param_dtype=FLOAT_DTYPES[param_dt], rngs=nnx.Rngs(1))
        nnx.update(restored, nnx.state(ours))
        assert_equal_nan_aware(np.asarray(restored.scale[...]), np.asarray(ours.scale[...]),
                             what + " back to flax")
    # With a residual: (out, residual_out) of the sum, like jax_ar.rms_norm.
    norm = jax_ar.flax.RMSNorm(hidden, rngs=nnx.Rngs(0))
    x = random_normal(rng, (3, hidden), np.float32)
    residual = random_normal(rng, (3, hidden), np.float32)
    out, residual_out = jax.jit(lambda a, b: norm(a, b))(x, residual)
    assert_equal_nan_aware(np.asarray(residual_out), x + residual, "RMSNorm residual_out")
    assert_norm_close(np.asarray(out), norm_float64(x + residual, np.ones(hidden), 1e-6),
                      "RMSNorm with residual")
    log("rms_norm: ok")


def suite_all_reduce_rms_norm(mesh):
    comm = jax_ar.setup(mesh, "tp")
    world = comm.world_size
    rng = np.random.default_rng(SEED + 32)
    hidden = 512
    theirs = nnx.RMSNorm(hidden, epsilon=1e-6, rngs=nnx.Rngs(0))
    theirs.scale[...] = jnp.asarray(random_normal(rng, (hidden,), np.float32))
    for x_dt, dt in (("float32", None), ("bfloat16", "bfloat16")):
        dtype = FLOAT_DTYPES[x_dt]
        module = jax_ar.flax.AllReduceRMSNorm(hidden, "tp", rngs=nnx.Rngs(0),
                                              dtype=None if dt is None else FLOAT_DTYPES[dt])
        nnx.update(module, nnx.state(theirs))  # a flax RMSNorm checkpoint
        graphdef, state = nnx.split(module)
        parts = [random_normal(rng, (4, hidden), dtype) for _ in range(world)]
        residual = random_normal(rng, (4, hidden), dtype)

        def body(state, x, r):
            return nnx.merge(graphdef, state)(x, r)

        run = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P("tp"), P()),
                                    out_specs=(P(), P())))
        state = jax.tree.map(lambda v: global_array(np.asarray(v), mesh, P()), state)
        out, residual_out = run(state, global_array(np.concatenate(parts), mesh, P("tp")),
                                global_array(residual, mesh, P()))
        what = f"AllReduceRMSNorm {x_dt}"
        want_residual = add_residual(sum_in_rank_order(parts), residual)
        gamma = np.asarray(theirs.scale[...]).astype(dtype)  # the computation dtype
        for shard_out, shard_residual in zip(out.addressable_shards,
                                             residual_out.addressable_shards):
            assert_equal_nan_aware(np.asarray(shard_residual.data), want_residual, what)
            assert_norm_close(np.asarray(shard_out.data),
                              norm_float64(want_residual, gamma, 1e-6), what)
        if dt is None:  # float32: flax's RMSNorm of the summed stream agrees
            want = np.asarray(theirs(jnp.asarray(want_residual)), np.float64)
            assert_norm_close(np.asarray(out.addressable_shards[0].data), want, what + " vs flax")
    comm.close()
    log("all_reduce_rms_norm: ok")


def suite_tp_block(mesh):
    sys.path.insert(0, str(EXAMPLES))
    import tp_transformer_block

    comm = jax_ar.setup(mesh, "tp")
    difference, magnitude = tp_transformer_block.compare(mesh)
    comm.close()
    log(f"tp_block: max |difference| {difference:.3g} (values up to {magnitude:.3g})")
    # float32 throughout; only the order of the row-parallel partial sums
    # differs, which moves results by a few float32 ulps (~1e-6 relative).
    assert difference <= 1e-4 * magnitude, (difference, magnitude)


SUITES = suites_in(globals())


def main(argv):
    mesh = jax.make_mesh((jax.device_count(),), ("tp",))
    log(f"{jax.device_count()} devices, {jax.process_count()} processes")
    run_suites(SUITES, argv or list(SUITES), mesh)


if __name__ == "__main__":
    main_guard(main)
