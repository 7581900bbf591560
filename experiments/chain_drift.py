"""Where a chain of all_reduce_rms_norm calls leaves bench's tolerance.

    python -m jax_ar launch -n N experiments/chain_drift.py \
        [--hidden 4096] [--bytes 8M] [--dtype bfloat16] [--chain 300] \
        [--variants fused_twoshot,pair] [--json OUT]

`python -m jax_ar bench --op rms_norm` checks a chain of calls (each
call's out fed back as the next call's x on every rank, its residual_out
as the next residual) against bench_data's float64 emulation, which
rounds where the kernels round, within ROUNDINGS roundings of the dtype.
This runs the same chain one call at a time and compares every call's
outputs with the emulation after as many calls: for each variant, how many
elements differ at all and how many are off the tolerance, call by call,
and at the first call with any off the tolerance its worst elements (row,
column, got, want, and the other variants' values), so that a kernel's
wrong rows (a bug: off at once, whole rows or blocks) can be told from
rounding that drifts along the chain (a few elements, late).

Variants: fused_oneshot, fused_twoshot (all_reduce_rms_norm with that
algorithm) and pair (all_reduce, then rms_norm). Rank 0 prints; with
--json it also writes one JSON line a variant and call where anything
differs.
"""
from __future__ import annotations

import argparse
import json

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_ar
from jax_ar.tools import bench_data as data
from jax_ar.tools.sweep import parse_size

AXIS = "tp"
WORST = 8
VARIANTS = ("fused_oneshot", "fused_twoshot", "pair")


def step_of(variant: str, eps: float):
    if variant == "pair":
        def step(x, residual, gamma):
            out, residual_out = jax_ar.rms_norm(jax_ar.all_reduce(x, AXIS), gamma, eps=eps,
                                                residual=residual)
            return out, residual_out
    else:
        algorithm = variant[len("fused_"):]

        def step(x, residual, gamma):
            return jax_ar.all_reduce_rms_norm(x, residual, gamma, AXIS, eps=eps,
                                              algorithm=algorithm)
    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--bytes", type=parse_size, default="8M",
                   help="bytes of x a rank (tokens * hidden * itemsize; K, M, G binary)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--chain", type=int, default=300)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", default="fused_twoshot,pair")
    p.add_argument("--workspace-bytes", type=parse_size, default="64M")
    p.add_argument("--json", default=None)
    ns = p.parse_args()
    variants = ns.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    if ns.dtype not in data.DTYPES or ns.chain < 1:
        p.error(f"--dtype one of {', '.join(data.DTYPES)}; --chain at least 1")

    mesh = jax.make_mesh((jax.device_count(),), (AXIS,))
    world = mesh.devices.size
    jax_ar.setup(mesh, AXIS, workspace_bytes=ns.workspace_bytes)
    dtype = data.DTYPES[ns.dtype]
    tokens = ns.bytes // (ns.hidden * np.dtype(dtype).itemsize)
    if tokens < 1:
        p.error(f"--bytes {ns.bytes}: less than one row of --hidden {ns.hidden}")
    inputs = [data.rms_norm_inputs(ns.dtype, tokens, ns.hidden, r, world, ns.seed)
              for r in range(world)]
    _, residual0, gamma = inputs[0]
    rank0 = jax.process_index() == 0

    position = {d: r for r, d in enumerate(mesh.devices.flat)}
    sharded = NamedSharding(mesh, P(AXIS))

    def global_x(block_of):
        blocks = [jax.device_put(block_of(position[d]), d) for d in mesh.local_devices]
        return jax.make_array_from_single_device_arrays((tokens * world, ns.hidden), sharded,
                                                        blocks)

    def replicated(value):
        return jax.make_array_from_callback(value.shape, NamedSharding(mesh, P()),
                                            lambda index: value[index])

    def local(array):
        return np.asarray(array.addressable_shards[0].data)

    programs = {v: jax.jit(jax.shard_map(step_of(v, ns.eps), mesh=mesh,
                                         in_specs=(P(AXIS), P(), P()), out_specs=(P(AXIS), P())))
                for v in variants}
    state = {v: (global_x(lambda r: inputs[r][0]), replicated(residual0)) for v in variants}
    g = replicated(gamma)
    emulation = data.rms_norm_calls([inp[0] for inp in inputs], residual0, gamma, ns.eps)
    first_off = {}
    lines = []
    for call in range(1, ns.chain + 1):
        want_out, want_res = next(emulation)
        got = {}
        for v in variants:
            out, residual_out = programs[v](state[v][0], state[v][1], g)
            state[v] = (out, residual_out)
            got[v] = (local(out), local(residual_out))
        for v in variants:
            out, residual_out = got[v]
            differ = int(np.count_nonzero(out != want_out)) + int(
                np.count_nonzero(residual_out != want_res))
            if not differ:
                continue
            off_out = data.rms_norm_wrong(out, want_out)
            off_res = data.rms_norm_wrong(residual_out, want_res)
            line = {"variant": v, "call": call, "differ": differ, "off_out": off_out,
                    "off_residual": off_res, "ranks": world, "hidden": ns.hidden,
                    "tokens": tokens, "dtype": ns.dtype}
            if (off_out or off_res) and v not in first_off:
                first_off[v] = call
                # The worst elements of whichever output is off (out first).
                k, name = (0, "out") if off_out else (1, "residual_out")
                got64 = got[v][k].astype(np.float64)
                want64 = (want_out, want_res)[k].astype(np.float64)
                scale = np.abs(want64) + 1.0
                err = np.abs(got64 - want64) / scale
                worst = np.argsort(err, axis=None)[::-1][:WORST]
                rows, cols = np.unravel_index(worst, got64.shape)
                line["worst"] = name
                line["worst_elements"] = [
                    {"row": int(r), "col": int(c), "got": float(got64[r, c]),
                     "want": float(want64[r, c]),
                     **{u: float(got[u][k][r, c]) for u in variants if u != v}}
                    for r, c in zip(rows, cols)]
                limit = data.ROUNDINGS * data.ROUNDING[got[v][k].itemsize]
                off_rows = np.unique(np.nonzero(~(err <= limit))[0])
                line["off_rows"] = [int(r) for r in off_rows[:64]]
                line["off_row_count"] = int(off_rows.size)
            lines.append(line)
            if rank0 and (off_out or off_res or call in (1, ns.chain) or call % 50 == 0):
                print(json.dumps(line), flush=True)
    if rank0:
        for v in variants:
            print(f"{v}: first call off the tolerance: {first_off.get(v, 'none')} "
                  f"of {ns.chain}", flush=True)
        if ns.json:
            with open(ns.json, "w") as f:
                for line in lines:
                    f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
