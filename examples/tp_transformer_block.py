"""A tensor-parallel transformer block in Flax NNX, with jax_ar at its boundaries.

The block is pre-norm: attention, then an MLP, each closed by the boundary
every tensor-parallel layer has, all-reduce + residual add + RMSNorm:

    partial  = out_proj(attention(q, k, v of normed))   # row-parallel: partial sums
    normed, residual = AllReduceRMSNorm(partial, residual)
    partial  = down(gelu(up(normed)))                     # column- then row-parallel
    normed, residual = AllReduceRMSNorm(partial, residual)

The query/key/value and up projections are column-parallel (each rank holds
a slice of output features: a subset of the heads, a slice of the MLP's
hidden layer); the output and down projections are row-parallel (each rank
holds the matching slice of input features and produces partial sums). One
jax_ar.all_reduce_rms_norm per boundary sums the partials over "tp", adds
the residual stream and normalizes it for the next layer.

The same module, built with axis_name=None, is the unsharded block: its
boundaries are jax_ar.flax.RMSNorm with the residual (add + norm, no
reduction). `compare` runs both from the same parameters and returns the
largest difference.

Run it on CPU devices of one process or on several processes:

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python examples/tp_transformer_block.py
    python -m jax_ar launch -n 2 examples/tp_transformer_block.py
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_ar
from jax_ar.flax import AllReduceRMSNorm, RMSNorm

# Parameter sharding over "tp": which layers split their outputs (column-
# parallel) and which their inputs (row-parallel); norms are replicated.
COLUMN_PARALLEL = ("query", "key", "value", "up")
ROW_PARALLEL = ("out", "down")


class Block(nnx.Module):
    def __init__(self, d_model: int, num_heads: int, d_ff: int, *, axis_name: str | None,
                 rngs: nnx.Rngs):
        self.head_dim = d_model // num_heads
        linear = lambda n_in, n_out: nnx.Linear(n_in, n_out, use_bias=False, rngs=rngs)
        self.query, self.key, self.value = (linear(d_model, d_model) for _ in range(3))
        self.out = linear(d_model, d_model)
        self.up = linear(d_model, d_ff)
        self.down = linear(d_ff, d_model)
        if axis_name is None:
            norm = lambda: RMSNorm(d_model, eps=1e-5, rngs=rngs)
        else:
            norm = lambda: AllReduceRMSNorm(d_model, axis_name, eps=1e-5, rngs=rngs)
        self.attention_norm, self.mlp_norm = norm(), norm()

    def attention(self, x):
        batch, length, _ = x.shape
        # The heads this rank holds: as many as its slice of the projections.
        heads = lambda t: t.reshape(batch, length, -1, self.head_dim)
        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(self.head_dim)
        causal = jnp.tril(jnp.ones((length, length), bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
        return jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, length, -1)

    def __call__(self, normed, residual):
        """(normed input, residual stream) -> (normed output, residual stream)."""
        normed, residual = self.attention_norm(self.out(self.attention(normed)), residual)
        return self.mlp_norm(self.down(jax.nn.gelu(self.up(normed))), residual)


def parameter_specs(state, axis_name="tp"):
    """PartitionSpecs of the block's parameters for tensor parallelism."""
    def spec(path, _):
        layer = path[0].key
        if layer in COLUMN_PARALLEL:
            return P(None, axis_name)
        if layer in ROW_PARALLEL:
            return P(axis_name, None)
        return P()
    return jax.tree_util.tree_map_with_path(spec, state)


def to_global(value, sharding):
    """A global array from host data every process holds."""
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def compare(mesh, d_model=256, num_heads=8, d_ff=512, batch=2, length=16, seed=0):
    """Runs the block tensor-parallel over mesh axis "tp" and unsharded, from
    the same parameters and inputs; returns (max |difference|, max |value|)
    over both outputs."""
    reference = Block(d_model, num_heads, d_ff, axis_name=None, rngs=nnx.Rngs(seed))
    parallel = Block(d_model, num_heads, d_ff, axis_name="tp", rngs=nnx.Rngs(seed))
    # Random norm scales, the same in both, so that gamma matters.
    scales = np.random.default_rng(seed).uniform(0.5, 1.5, (2, d_model)).astype(np.float32)
    for block in (reference, parallel):
        block.attention_norm.scale[...] = jnp.asarray(scales[0])
        block.mlp_norm.scale[...] = jnp.asarray(scales[1])

    embeddings = np.random.default_rng(seed + 1).standard_normal(
        (batch, length, d_model)).astype(np.float32)
    input_norm = RMSNorm(d_model, eps=1e-5, rngs=nnx.Rngs(seed))
    normed = np.asarray(jax.jit(lambda e: input_norm(e))(embeddings))

    want = jax.jit(lambda n, r: reference(n, r))(normed, embeddings)

    graphdef, state = nnx.split(parallel)
    specs = parameter_specs(state)
    state = jax.tree.map(lambda v, s: to_global(v, NamedSharding(mesh, s)), state, specs)

    def body(state, normed, residual):
        return nnx.merge(graphdef, state)(normed, residual)

    run = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(specs, P(), P()),
                                out_specs=(P(), P())))
    replicated = NamedSharding(mesh, P())
    got = run(state, to_global(normed, replicated), to_global(embeddings, replicated))
    difference = magnitude = 0.0
    for g, w in zip(got, want):
        local = np.asarray(g.addressable_shards[0].data, np.float64)
        difference = max(difference, float(np.abs(local - np.asarray(w, np.float64)).max()))
        magnitude = max(magnitude, float(np.abs(np.asarray(w)).max()))
    return difference, magnitude


def main():
    mesh = jax.make_mesh((jax.device_count(),), ("tp",))
    comm = jax_ar.setup(mesh, "tp")
    difference, magnitude = compare(mesh)
    print(f"[process {jax.process_index()}] tensor-parallel block over {jax.device_count()} "
          f"devices vs unsharded: max |difference| {difference:.3g} (values up to "
          f"{magnitude:.3g})")
    comm.close()
    # float32 throughout; the sharded block sums its row-parallel products
    # in a different order, which moves results by a few float32 ulps.
    if difference > 1e-4 * magnitude:
        raise SystemExit("the tensor-parallel block does not match the unsharded one")


if __name__ == "__main__":
    main()
