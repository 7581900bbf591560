"""One rank of the jax_ar.flax tests. Usage: flax_modules.py [SUITE...]

Suites: rms_norm (jax_ar.flax.RMSNorm against flax.nnx.RMSNorm: parameter,
state structure, checkpoints both ways, outputs for the dtype combinations
flax supports), gemma_norm (scale_offset=1.0 against a Gemma-style norm
written here: zeros-initialized scale used as 1 + scale, a Gemma checkpoint
loaded as it is), all_reduce_rms_norm (jax_ar.flax.AllReduceRMSNorm inside
shard_map against numpy and against flax's RMSNorm of the summed input; with
post_norm, scale_offset and a float32 residual stream), stacked_layers
(AllReduceRMSNorm layers under nnx.vmap and nnx.scan), row_parallel_linear
(jax_ar.flax.RowParallelLinear against flax.nnx.Linear, inside shard_map and
in plain jit), tp_block (examples/tp_transformer_block.py: the
tensor-parallel block against the same block unsharded).
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
from common import (assert_bitwise_equal, assert_equal_nan_aware, global_array, local_shards, log,
                    main_guard, norm_auto_takes_pair, run_suites, suites_in)
from norm_checks import (FLOAT32_EVALUATION, FLOAT_DTYPES, add_residual, assert_norm_close,
                         assert_within, norm_float64, post_norm_float64, random_normal,
                         scale_vector, sum_in_rank_order)

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


class GemmaRMSNorm(nnx.Module):
    """Gemma's RMSNorm as google/flax examples/gemma/layers.py writes it:
    scale zeros-initialized and used as 1 + scale; x normalized in float32,
    cast to `dtype`, then multiplied by 1 + scale in `dtype`."""

    def __init__(self, dim, *, dtype=jnp.float32, weight_dtype=jnp.float32, rngs):
        self.dtype = dtype
        self.scale = nnx.Param(nnx.initializers.zeros_init()(rngs.params(), dim, weight_dtype))

    def __call__(self, x):
        x = jnp.asarray(x, jnp.float32)
        mean2 = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        normed = jnp.asarray(x * jax.lax.rsqrt(mean2 + 1e-06), dtype=self.dtype)
        return normed * (1.0 + jnp.asarray(self.scale[...], self.dtype))


def suite_gemma_norm(mesh):
    rng = np.random.default_rng(SEED + 33)
    hidden = 256
    for dt in ("float32", "bfloat16"):
        dtype = FLOAT_DTYPES[dt]
        theirs = GemmaRMSNorm(hidden, dtype=dtype, rngs=nnx.Rngs(0))
        ours = jax_ar.flax.RMSNorm(hidden, scale_offset=1.0, dtype=dtype, rngs=nnx.Rngs(0))
        what = f"Gemma RMSNorm dtype={dt}"
        assert jax.tree.structure(nnx.state(ours)) == jax.tree.structure(nnx.state(theirs)), what
        assert not np.asarray(ours.scale[...]).any(), what + ": scale must start at zeros"
        # A trained Gemma checkpoint loads with no conversion (and back).
        theirs.scale[...] = jnp.asarray(random_normal(rng, (hidden,), np.float32, 0.3))
        nnx.update(ours, nnx.state(theirs))
        x = jnp.asarray(random_normal(rng, (3, hidden), dtype, scale=2.0))
        got, want = ours(x), theirs(x)
        assert got.dtype == want.dtype == dtype, (what, got.dtype, want.dtype)
        gamma = scale_vector(np.asarray(theirs.scale[...]).astype(dtype), 1.0)
        assert_norm_close(np.asarray(got), norm_float64(np.asarray(x), gamma, 1e-6), what)
        if dt == "float32":  # the same float32 formula: an ulp or two apart
            assert_norm_close(np.asarray(got), np.asarray(want, np.float64), what + " vs Gemma")
        else:  # Gemma rounds twice more in bfloat16 (the norm, 1 + scale)
            want64 = np.asarray(want, np.float64)
            assert_within(got, want64, 3 * 2.0**-8 * np.abs(want64) + 1e-6, what + " vs Gemma")
        restored = GemmaRMSNorm(hidden, dtype=dtype, rngs=nnx.Rngs(1))
        nnx.update(restored, nnx.state(ours))
        assert_equal_nan_aware(np.asarray(restored.scale[...]), np.asarray(ours.scale[...]),
                               what + " back to Gemma")
    log("gemma_norm: ok")


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
        total = sum_in_rank_order(parts)
        if norm_auto_takes_pair(comm, (4, hidden), dtype, dtype):  # the sum rounded first
            total = total.astype(dtype).astype(np.float32)
        want_residual = add_residual(total, residual)
        gamma = np.asarray(theirs.scale[...]).astype(dtype)  # the computation dtype
        for shard_out, shard_residual in zip(out.addressable_shards,
                                             residual_out.addressable_shards):
            assert_equal_nan_aware(np.asarray(shard_residual.data), want_residual, what)
            assert_norm_close(np.asarray(shard_out.data),
                              norm_float64(want_residual, gamma, 1e-6), what)
        if dt is None:  # float32: flax's RMSNorm of the summed stream agrees
            want = np.asarray(theirs(jnp.asarray(want_residual)), np.float64)
            assert_norm_close(np.asarray(out.addressable_shards[0].data), want, what + " vs flax")

    # Gemma 2/3's boundary: bfloat16 partials, a float32 residual stream and
    # float32 params, post_norm and 1 + scale; params "scale", "post_scale".
    module = jax_ar.flax.AllReduceRMSNorm(hidden, "tp", scale_offset=1.0, post_norm=True,
                                          dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    assert sorted(k for k in nnx.state(module).keys()) == ["post_scale", "scale"], \
        nnx.state(module)
    module.scale[...] = jnp.asarray(random_normal(rng, (hidden,), np.float32, 0.3))
    module.post_scale[...] = jnp.asarray(random_normal(rng, (hidden,), np.float32, 0.3))
    graphdef, state = nnx.split(module)
    parts = [random_normal(rng, (4, hidden), FLOAT_DTYPES["bfloat16"]) for _ in range(world)]
    residual = random_normal(rng, (4, hidden), np.float32)
    run = jax.jit(jax.shard_map(lambda st, x, r: nnx.merge(graphdef, st)(x, r), mesh=mesh,
                                in_specs=(P(), P("tp"), P()), out_specs=(P(), P())))
    state = jax.tree.map(lambda v: global_array(np.asarray(v), mesh, P()), state)
    out, residual_out = run(state, global_array(np.concatenate(parts), mesh, P("tp")),
                            global_array(residual, mesh, P()))
    what = "AllReduceRMSNorm post_norm bfloat16 + float32 stream"
    bf16 = lambda v: np.asarray(v).astype(FLOAT_DTYPES["bfloat16"])  # noqa: E731  (dtype=bf16)
    post = post_norm_float64(sum_in_rank_order(parts), scale_vector(bf16(module.post_scale[...]),
                                                                    1.0), 1e-6)
    want_residual = post + residual
    for shard_out, shard_residual in zip(out.addressable_shards, residual_out.addressable_shards):
        got_residual = np.asarray(shard_residual.data)
        assert got_residual.dtype == np.float32 and shard_out.data.dtype == jnp.bfloat16, what
        assert_within(got_residual, want_residual,
                      (2.0**-23 + FLOAT32_EVALUATION) * (np.abs(want_residual) + np.abs(post)),
                      what + " residual_out")
        assert_norm_close(np.asarray(shard_out.data),
                          norm_float64(got_residual, scale_vector(bf16(module.scale[...]), 1.0),
                                       1e-6), what + " out")
    comm.close()
    log("all_reduce_rms_norm: ok")


def suite_stacked_layers(mesh):
    """AllReduceRMSNorm layers stacked along a leading axis (a scale per
    layer) under nnx.vmap, and chained with nnx.scan, inside shard_map:
    the same as calling each layer in a Python loop."""
    comm = jax_ar.setup(mesh, "tp")
    world = comm.world_size
    rng = np.random.default_rng(SEED + 34)
    hidden, layers = 256, 3
    modules = [jax_ar.flax.AllReduceRMSNorm(hidden, "tp", scale_offset=1.0, post_norm=True,
                                            rngs=nnx.Rngs(i)) for i in range(layers)]
    for m in modules:
        m.scale[...] = jnp.asarray(random_normal(rng, (hidden,), np.float32, 0.3))
        m.post_scale[...] = jnp.asarray(random_normal(rng, (hidden,), np.float32, 0.3))
    graphdef, _ = nnx.split(modules[0])
    states = [nnx.state(m) for m in modules]
    stacked = jax.tree.map(lambda *v: np.stack([np.asarray(a) for a in v]), *states)
    x = np.stack([np.concatenate([random_normal(rng, (2, hidden), np.float32)
                                  for _ in range(world)]) for _ in range(layers)])
    residual = random_normal(rng, (layers, 2, hidden), np.float32)

    def loop(st_list, xs, rs):
        outs = [nnx.merge(graphdef, st)(xs[i], rs[i]) for i, st in enumerate(st_list)]
        return tuple(jnp.stack(o) for o in zip(*outs))

    def vmapped(st, xs, rs):
        layer = nnx.merge(graphdef, st)
        return nnx.vmap(lambda m, a, b: m(a, b), in_axes=(0, 0, 0))(layer, xs, rs)

    def scanned(st, xs, r0):
        layer = nnx.merge(graphdef, st)

        def step(carry, m, a):
            out, carry = m(a, carry)
            return carry, out
        return nnx.scan(step, in_axes=(nnx.Carry, 0, 0), out_axes=(nnx.Carry, 0))(r0, layer, xs)

    def loop_chain(st_list, xs, r0):
        outs = []
        for i, st in enumerate(st_list):
            out, r0 = nnx.merge(graphdef, st)(xs[i], r0)
            outs.append(out)
        return r0, jnp.stack(outs)

    put = lambda tree: jax.tree.map(lambda v: global_array(np.asarray(v), mesh, P()), tree)  # noqa
    xs = global_array(x, mesh, P(None, "tp"))
    rs = global_array(residual, mesh, P())
    sm = lambda fn: jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P(), P(None, "tp"), P()),  # noqa
                                          out_specs=(P(), P())))
    text = sm(vmapped).lower(put(stacked), xs, rs).as_text()
    assert text.count("jax_ar_all_reduce_rms_norm") == 1, "one fused call for the stack"
    got = sm(vmapped)(put(stacked), xs, rs)
    want = sm(loop)(put(states), xs, rs)
    for g, w in zip(got, want):
        for (device, _, gd), (_, _, wd) in zip(local_shards(g), local_shards(w)):
            assert_bitwise_equal(gd, wd, f"nnx.vmap vs loop on {device}")
    r0 = global_array(residual[0], mesh, P())
    got = sm(scanned)(put(stacked), xs, r0)
    want = sm(loop_chain)(put(states), xs, r0)
    for g, w in zip(got, want):
        for (device, _, gd), (_, _, wd) in zip(local_shards(g), local_shards(w)):
            assert_bitwise_equal(gd, wd, f"nnx.scan vs loop on {device}")
    comm.close()
    log("stacked_layers: ok")


def suite_row_parallel_linear(mesh):
    """RowParallelLinear against flax.nnx.Linear: the same state (kernel,
    bias), checkpoints both ways, and the same outputs (small integers: bit
    for bit) inside shard_map on local shards and in plain jit on sharded
    arrays, the bias added once."""
    comm = jax_ar.setup(mesh, "tp")
    world = comm.world_size
    rng = np.random.default_rng(SEED + 35)
    features_in, features_out = 32 * world, 48
    for use_bias in (False, True):
        theirs = nnx.Linear(features_in, features_out, use_bias=use_bias, rngs=nnx.Rngs(0))
        ours = jax_ar.flax.RowParallelLinear(features_in, features_out, "tp", use_bias=use_bias,
                                             rngs=nnx.Rngs(0))
        what = f"RowParallelLinear use_bias={use_bias}"
        assert jax.tree.structure(nnx.state(ours)) == jax.tree.structure(nnx.state(theirs)), what
        assert_equal_nan_aware(np.asarray(ours.kernel[...]), np.asarray(theirs.kernel[...]),
                               what + " initial kernel")
        theirs.kernel[...] = jnp.asarray(rng.integers(-3, 4, (features_in, features_out)),
                                         jnp.float32)
        if use_bias:
            theirs.bias[...] = jnp.asarray(rng.integers(-3, 4, features_out), jnp.float32)
        nnx.update(ours, nnx.state(theirs))
        x = rng.integers(-3, 4, (5, features_in)).astype(np.float32)
        want = np.asarray(theirs(jnp.asarray(x)))

        graphdef, state = nnx.split(ours)
        specs = jax.tree.map(lambda v: P("tp", None) if v.ndim == 2 else P(), state)
        sharded = jax.tree.map(lambda v, s: global_array(np.asarray(v), mesh, s), state, specs)
        run = jax.jit(jax.shard_map(lambda st, a: nnx.merge(graphdef, st)(a), mesh=mesh,
                                    in_specs=(specs, P(None, "tp")), out_specs=P()))
        y = run(sharded, global_array(x, mesh, P(None, "tp")))
        for device, _, data in local_shards(y):
            assert_bitwise_equal(data, want, f"{what} in shard_map on {device}")
        # Plain jit: the layer sees global (sharded) arrays.
        y = jax.jit(lambda st, a: nnx.merge(graphdef, st)(a))(
            sharded, global_array(x, mesh, P(None, "tp")))
        for device, index, data in local_shards(y):
            assert_bitwise_equal(data, want[index], f"{what} in jit on {device}")
        restored = nnx.Linear(features_in, features_out, use_bias=use_bias, rngs=nnx.Rngs(1))
        nnx.update(restored, nnx.state(ours))
        assert_equal_nan_aware(np.asarray(restored.kernel[...]), np.asarray(ours.kernel[...]),
                               what + " back to flax")
    comm.close()
    log("row_parallel_linear: ok")


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
