"""Reproducer: XLA:GPU's compiler and a zero-size parameter (docs/gpu.md).

The pytree suite of tests/workers/ops_scatter_gather.py killed every rank
with SIGSEGV on the GPU (never on CPU). Its program was the only one whose
compiled form kept a zero-size entry parameter alive: all_gather of an empty
leaf was broadcast_to(x[None]) of that parameter. This script compiles, in
one process of several ranks (python -m jax_ar launch -n 2 ...), one variant:

  plain_xla   no jax_ar at all: a kernel on f32[n,3] beside broadcast_to of a
              zero-size parameter f32[n,0], both returned (what jax_ar's old
              all_gather produced for an empty leaf)
  constant    the same with the zero-size output a constant (what jax_ar does
              now: gather_rows returns zeros for an empty leaf)

and prints "compiled OK" (or dies). Usage:
  python -m jax_ar launch -n 2 --platform gpu scripts/repro/xla_gpu_zero_size_param.py VARIANT
"""
import faulthandler
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

faulthandler.enable(all_threads=True)

variant = sys.argv[1] if len(sys.argv) > 1 else "plain_xla"
n = jax.device_count()
mesh = jax.make_mesh((n,), ("tp",))
full = np.ones((n, n, 3), np.float32)
empty = np.zeros((n, n, 0), np.float32)


def body(u, w):
    if variant == "plain_xla":
        gathered = jnp.broadcast_to(w[0][None], (n,) + w[0].shape)
    elif variant == "constant":
        gathered = jax.lax.pcast(jnp.zeros((n,) + w[0].shape, w.dtype), ("tp",), to="varying") \
            if hasattr(jax.lax, "pcast") else jax.lax.pvary(jnp.zeros((n,) + w[0].shape), ("tp",))
    else:
        raise SystemExit(f"unknown variant {variant!r}")
    return (u[0] * 2)[None], gathered[None]


spec = P("tp")
f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, spec), out_specs=(spec, spec)))
args = [jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda i, x=x: x[i])
        for x in (full, empty)]
lowered = f.lower(*args)
print(f"[{jax.process_index()}] {variant}: jax {jax.__version__}, lowered; compiling", flush=True)
compiled = lowered.compile()
print(f"[{jax.process_index()}] {variant}: compiled OK", flush=True)
jax.block_until_ready(compiled(*args))
print(f"[{jax.process_index()}] {variant}: ran OK", flush=True)
