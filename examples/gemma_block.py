"""A Gemma 2/3-style decoder block in Flax NNX with jax_ar, two ways.

The block (after google/flax examples/gemma, small: causal attention and a
GeGLU MLP, no RoPE or soft-capping) keeps Gemma's norms: every scale is
zero-initialized and used as 1 + scale, and each sublayer's output is
normalized (post-norm) before it joins the residual stream:

    x = x + post_attention_norm(attention(pre_attention_norm(x)))
    x = x + post_ffw_norm(mlp(pre_ffw_norm(x)))

Under tensor parallelism over mesh axis "tp", query/key/value, gate and up
are column-parallel (each rank holds some heads, a slice of the MLP) and the
attention output and MLP down projections are row-parallel (each rank holds
the matching input features and produces partial sums).

* `ShardMapBlock` (inside jax.shard_map): the row-parallel partial sums go
  straight into jax_ar.flax.AllReduceRMSNorm(post_norm=True,
  scale_offset=1.0), which does Gemma's whole boundary in one call: the
  all-reduce, the post-norm, the residual add and the next pre-norm. Its
  twin without jax_ar is the same block with psum and jnp norms.
* `JitBlock` (plain jit, parameters sharded by annotation, no shard_map):
  the model is written as usual; only its row-parallel layers are
  jax_ar.flax.RowParallelLinear (jax_ar's all-reduce) and its norms
  jax_ar.flax.RMSNorm (the post-norm, then add + pre-norm in one kernel).
  Its twin without jax_ar uses flax.nnx.Linear (XLA inserts its own
  all-reduce) and jnp norms.

Both take (pre-normed input, residual stream) and return the same for the
next block; `compare` runs each against its twin from one set of
parameters (a Gemma-style checkpoint) and returns the largest differences.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 python examples/gemma_block.py
    python -m jax_ar launch -n 2 examples/gemma_block.py
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_ar
from jax_ar.flax import AllReduceRMSNorm, RMSNorm, RowParallelLinear

AXIS = "tp"
EPS = 1e-6
COLUMN_PARALLEL = ("query", "key", "value", "gate", "up")
ROW_PARALLEL = ("out", "down")


class GemmaNorm(nnx.Module):
    """Gemma's RMSNorm in jnp: float32 inside, times 1 + scale."""

    def __init__(self, dim, *, rngs):
        self.scale = nnx.Param(jnp.zeros((dim,), jnp.float32))

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + EPS)
        return (normed * (1.0 + self.scale[...])).astype(x.dtype)


class Layers(nnx.Module):
    """The projections every variant shares; `row` builds the row-parallel ones."""

    def __init__(self, d_model, num_heads, head_dim, d_ff, row, rngs):
        self.head_dim = head_dim
        column = lambda n_in, n_out: nnx.Linear(n_in, n_out, use_bias=False, rngs=rngs)  # noqa
        self.query, self.key, self.value = (column(d_model, num_heads * head_dim)
                                            for _ in range(3))
        self.out = row(num_heads * head_dim, d_model)
        self.gate, self.up = column(d_model, d_ff), column(d_model, d_ff)
        self.down = row(d_ff, d_model)

    def attention(self, x):
        """Causal attention over the heads this rank holds (all of them
        outside shard_map); the output projection's input features."""
        batch, length, _ = x.shape
        heads = lambda t: t.reshape(batch, length, -1, self.head_dim)  # noqa: E731
        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(self.head_dim)
        causal = jnp.tril(jnp.ones((length, length), bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
        return jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, length, -1)

    def mlp_hidden(self, x):
        return jax.nn.gelu(self.gate(x)) * self.up(x)


class ShardMapBlock(nnx.Module):
    """Inside shard_map; jax_ar=True fuses each boundary into one
    AllReduceRMSNorm, False is its twin (psum and jnp norms)."""

    def __init__(self, d_model, num_heads, head_dim, d_ff, *, jax_ar: bool, rngs):
        plain = lambda n_in, n_out: nnx.Linear(n_in, n_out, use_bias=False, rngs=rngs)  # noqa
        self.layers = Layers(d_model, num_heads, head_dim, d_ff, plain, rngs)
        self.jax_ar = jax_ar
        if jax_ar:
            boundary = lambda: AllReduceRMSNorm(d_model, AXIS, EPS, scale_offset=1.0,  # noqa
                                                post_norm=True, rngs=rngs)
            self.attention_boundary, self.ffw_boundary = boundary(), boundary()
        else:
            norm = lambda: GemmaNorm(d_model, rngs=rngs)  # noqa: E731
            self.post_attention_norm, self.pre_ffw_norm = norm(), norm()
            self.post_ffw_norm, self.next_norm = norm(), norm()

    def __call__(self, normed, residual):
        partial = self.layers.out(self.layers.attention(normed))  # this rank's partial sums
        if self.jax_ar:
            normed, residual = self.attention_boundary(partial, residual)
        else:
            residual = residual + self.post_attention_norm(jax.lax.psum(partial, AXIS))
            normed = self.pre_ffw_norm(residual)
        partial = self.layers.down(self.layers.mlp_hidden(normed))
        if self.jax_ar:
            return self.ffw_boundary(partial, residual)
        residual = residual + self.post_ffw_norm(jax.lax.psum(partial, AXIS))
        return self.next_norm(residual), residual


class JitBlock(nnx.Module):
    """Plain jit on sharded parameters; jax_ar=True swaps in RowParallelLinear
    and jax_ar's norms, False is the same model without jax_ar."""

    def __init__(self, d_model, num_heads, head_dim, d_ff, *, jax_ar: bool, rngs):
        if jax_ar:
            row = lambda n_in, n_out: RowParallelLinear(n_in, n_out, AXIS, rngs=rngs)  # noqa
            norm = lambda: RMSNorm(d_model, EPS, scale_offset=1.0, rngs=rngs)  # noqa: E731
        else:
            row = lambda n_in, n_out: nnx.Linear(n_in, n_out, use_bias=False, rngs=rngs)  # noqa
            norm = lambda: GemmaNorm(d_model, rngs=rngs)  # noqa: E731
        self.layers = Layers(d_model, num_heads, head_dim, d_ff, row, rngs)
        self.jax_ar = jax_ar
        self.post_attention_norm, self.pre_ffw_norm = norm(), norm()
        self.post_ffw_norm, self.next_norm = norm(), norm()

    def _join(self, post_norm, pre_norm, y, residual):
        """residual + post_norm(y), then pre_norm of that (one jax_ar kernel
        for the add and the norm)."""
        if self.jax_ar:
            return pre_norm(post_norm(y), residual)
        residual = residual + post_norm(y)
        return pre_norm(residual), residual

    def __call__(self, normed, residual):
        y = self.layers.out(self.layers.attention(normed))
        normed, residual = self._join(self.post_attention_norm, self.pre_ffw_norm, y, residual)
        y = self.layers.down(self.layers.mlp_hidden(normed))
        return self._join(self.post_ffw_norm, self.next_norm, y, residual)


# ----------------------------------------------------------------------------
# One set of parameters for every variant.

def checkpoint(d_model, num_heads, head_dim, d_ff, seed):
    """A Gemma-style checkpoint: {name: array}, the four norm scales as
    Gemma stores them (zero-centred, used as 1 + scale)."""
    rng = np.random.default_rng(seed)
    weight = lambda n_in, n_out: (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)  # noqa
                                  ).astype(np.float32)
    params = {name: weight(d_model, num_heads * head_dim) for name in ("query", "key", "value")}
    params["out"] = weight(num_heads * head_dim, d_model)
    params["gate"], params["up"] = weight(d_model, d_ff), weight(d_model, d_ff)
    params["down"] = weight(d_ff, d_model)
    for name in ("post_attention_norm", "pre_ffw_norm", "post_ffw_norm", "next_norm"):
        params[name] = (0.2 * rng.standard_normal(d_model)).astype(np.float32)
    return params


def load(block, params):
    """Puts the checkpoint into any of the four blocks (the fused boundaries
    hold a post-norm's scale as post_scale and the next norm's as scale)."""
    for name in COLUMN_PARALLEL + ROW_PARALLEL:
        getattr(block.layers, name).kernel[...] = jnp.asarray(params[name])
    if isinstance(block, ShardMapBlock) and block.jax_ar:
        block.attention_boundary.post_scale[...] = jnp.asarray(params["post_attention_norm"])
        block.attention_boundary.scale[...] = jnp.asarray(params["pre_ffw_norm"])
        block.ffw_boundary.post_scale[...] = jnp.asarray(params["post_ffw_norm"])
        block.ffw_boundary.scale[...] = jnp.asarray(params["next_norm"])
    else:
        for name in ("post_attention_norm", "pre_ffw_norm", "post_ffw_norm", "next_norm"):
            getattr(block, name).scale[...] = jnp.asarray(params[name])


def parameter_specs(state):
    """Column-parallel kernels split their outputs over "tp", row-parallel
    ones their inputs; norms are replicated."""
    def spec(path, _):
        names = [getattr(p, "key", None) for p in path]
        if "layers" in names:
            layer = names[names.index("layers") + 1]
            return P(None, AXIS) if layer in COLUMN_PARALLEL else P(AXIS, None)
        return P()
    return jax.tree_util.tree_map_with_path(spec, state)


def to_global(value, sharding):
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def _max_difference(got, want):
    difference = magnitude = 0.0
    for g, w in zip(got, want):
        for (gs, ws) in zip(g.addressable_shards, w.addressable_shards):
            a, b = np.asarray(gs.data, np.float64), np.asarray(ws.data, np.float64)
            difference = max(difference, float(np.abs(a - b).max()))
            magnitude = max(magnitude, float(np.abs(b).max()))
    return difference, magnitude


def compare(mesh, d_model=256, num_heads=4, head_dim=64, d_ff=512, batch=2, length=8, seed=0,
            sharded_twins=True):
    """Runs ShardMapBlock and JitBlock with jax_ar and their twins without,
    from one checkpoint and input. mesh: a 1-D mesh over AXIS that
    jax_ar.setup saw (its axes Auto, so XLA propagates the parameters'
    shardings in plain jit). sharded_twins=False (where XLA's collectives
    cannot run, e.g. ranks sharing a GPU) compares both with the twin
    computed unsharded (replicated parameters, no collective). Returns
    {"shard_map": (max |difference|, max |value|), "jit": (...), "jax_ar
    modes": (...)} over both outputs."""
    params = checkpoint(d_model, num_heads, head_dim, d_ff, seed)
    rng = np.random.default_rng(seed + 1)
    embeddings = rng.standard_normal((batch, length, d_model)).astype(np.float32)
    first_norm = GemmaNorm(d_model, rngs=nnx.Rngs(0))
    normed = np.asarray(jax.jit(lambda e: first_norm(e))(embeddings))
    replicated = NamedSharding(mesh, P())
    inputs = (to_global(normed, replicated), to_global(embeddings, replicated))

    def placed(block, sharded=True):
        load(block, params)
        graphdef, state = nnx.split(block)
        specs = parameter_specs(state)
        if not sharded:
            specs = jax.tree.map(lambda _: P(), specs)
        state = jax.tree.map(lambda v, s: to_global(v, NamedSharding(mesh, s)), state, specs)
        return graphdef, state, specs

    results = {}
    for kind in ("shard_map", "jit"):
        outs = []
        for use_jax_ar in (True, False):
            unsharded = not use_jax_ar and not sharded_twins
            cls = ShardMapBlock if kind == "shard_map" and not unsharded else JitBlock
            block = cls(d_model, num_heads, head_dim, d_ff, jax_ar=use_jax_ar, rngs=nnx.Rngs(0))
            graphdef, state, specs = placed(block, sharded=not unsharded)
            body = lambda st, n, r, g=graphdef: nnx.merge(g, st)(n, r)  # noqa: E731
            if cls is ShardMapBlock:
                run = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(specs, P(), P()),
                                            out_specs=(P(), P())))
            else:  # replicated results, to compare like the shard_map ones
                run = jax.jit(body, out_shardings=(replicated, replicated))
            outs.append(run(state, *inputs))
        results[kind] = _max_difference(*outs)
        results.setdefault("outputs", []).append(outs[0])
    results["jax_ar modes"] = _max_difference(*results.pop("outputs"))
    return results


def jit_collectives(mesh, d_model=256, num_heads=4, head_dim=64, d_ff=512, batch=2, length=8):
    """(jax_ar all-reduces, XLA all-reduces) in the compiled program of the
    jit block with jax_ar: its two row-parallel layers, and none of XLA's."""
    block = JitBlock(d_model, num_heads, head_dim, d_ff, jax_ar=True, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(block)
    specs = parameter_specs(state)
    state = jax.tree.map(lambda v, s: to_global(v, NamedSharding(mesh, s)), state, specs)
    x = to_global(np.zeros((batch, length, d_model), np.float32), NamedSharding(mesh, P()))
    text = jax.jit(lambda st, n, r: nnx.merge(graphdef, st)(n, r)).lower(state, x, x) \
        .compile().as_text()
    return (text.count('custom_call_target="jax_ar_all_reduce"'),
            text.count("all-reduce(") + text.count("all-reduce-start("))


def make_mesh():
    """The tensor-parallel mesh: every device along AXIS, Auto axes."""
    return jax.make_mesh((jax.device_count(),), (AXIS,), axis_types=(AxisType.Auto,))


def main():
    mesh = make_mesh()
    comm = jax_ar.setup(mesh, AXIS)
    results = compare(mesh)
    ours, xlas = jit_collectives(mesh)
    comm.close()
    print(f"[process {jax.process_index()}] plain jit: {ours} all-reduces by jax_ar, {xlas} by XLA")
    for name, (difference, magnitude) in results.items():
        print(f"[process {jax.process_index()}] Gemma-style block, {name}: max |difference| "
              f"{difference:.3g} (values up to {magnitude:.3g})")
    # float32 throughout; jax_ar's norms take their inverse RMS in double,
    # jnp's rsqrt in float32: a few float32 ulps apart, carried through.
    if any(difference > 1e-5 * magnitude for difference, magnitude in results.values()):
        raise SystemExit("a jax_ar block does not match its twin")


if __name__ == "__main__":
    main()
