"""Per-call cost of jax_ar.all_reduce, its breakdown, and a plain device copy.

Run as ranks of the launcher, e.g. on one GPU shared by 8 ranks under MPS:

    python -m jax_ar launch -n 8 --platform gpu benchmarks/per_call_overhead.py \
        [--bytes 1K,16K,256K] [--algorithms oneshot,twoshot] [--stages all] [--calls 300] \
        [--stage-bytes 16K] [--copy-bytes 16K] [--ops avg,sum] [--variant NAME]

Every JSON line names the commit of the jax_ar it imported (jax_ar/PREBUILT
or git) and `--variant` (what an A/B run calls this tree or setting), so
that several trees timed in one device session land in one file
(scripts/latency_ab.sh).

Every case is a jitted program of K dependent calls, each on the last one's
result (y <- f(y)), compiled and warmed up, that returns one element of the
last result a rank (`--output element`; `--output results`, the method
before 2026-12-06, returns the whole result, and XLA then records the
program again at launches: benchmarks/output_buffers.py). A sample launches it L times
back to back (`--launches`) and blocks once (jax_ar.tools.timing.measure):
per call = wall time / (L * K), the median of `--repeats` samples. One
launch alone (the method of the figures before 2026-12-01,
`one_launch_us_per_call`) is also kept: it carries the skew between the
ranks' host-side starts, which several launches in a row amortize.

  all_reduce  f = jax_ar.all_reduce(., "tp", op="avg", algorithm=A), bfloat16
              (--ops avg,sum adds the same with op="sum": "all_reduce A sum")
  all_reduce_rms_norm A
              f = jax_ar.all_reduce_rms_norm(., ones, ones, "tp", algorithm=A)[0]
              over rows of --norm-hidden elements (several: "4096,8192"; each row's
              JSON line has its "norm_hidden") (--norm-algorithms oneshot,auto:
              the fused one-shot kernel beside the all-reduce of the same bytes);
              A = pair: jax_ar.rms_norm(jax_ar.all_reduce(.), ones, residual=ones)[0],
              the pair algorithm="auto" may pick instead of the fused kernel
  copy        f = optimization_barrier(-.): one read + one write kernel of the
              same bytes (the barrier keeps XLA from fusing or folding)
  stages      f = one launch of a piece of the protocol (jax_ar.tools.breakdown):
              empty kernel, + launch protocol, + call header, + one packet
              round trip; and the kernels alone (oneshot, twoshot_ll,
              twoshot_plain) without the Python-side choices

The all-reduce FFI handler's invocation count (the only handler the CUDA
module counts: `jax_ar_all_reduce`, so the fused, stage and copy cases
show 0 whatever their handlers do) is read before and after the timed
runs: for an all_reduce case, 0 or one program's calls under command
buffers means the calls cost no host work per launch (the CUDA graph
replays the kernels; XLA records it again only when a program's buffers
move). Before a case is timed, one call's result is
compared with numpy's (every case but the copy and the protocol-only
stages, whose results are not sums): a variant that is fast because it is
wrong says so in the JSON (`"result": "wrong"`) and the table. Rank 0
prints one JSON line per case prefixed with "PER_CALL_RESULT " and a table.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_ar
from jax_ar.tools import sweep, timing
from jax_ar.tools.breakdown import KERNEL_STAGES, STAGES, protocol_probe


def chain(step, calls, output):
    def body(y):
        for _ in range(calls):
            y = step(y)
        # "element": one element a rank leaves the program, so XLA keeps the
        # chain's values in its temporary buffer, as a model's layers' are;
        # "results": the last result, whose output buffer (new at every
        # launch) XLA shares with half the chain's values, so that it records
        # the program's command buffer again at launches
        # (benchmarks/output_buffers.py).
        return y[:1] if output == "element" else y
    return body


def tree_commit() -> str:
    """The commit of the jax_ar imported: its prebuilt modules' record
    (scripts/build_for_gpu.sh), else git's, else '?'."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(jax_ar.__file__)))
    try:
        with open(os.path.join(root, "jax_ar", "PREBUILT")) as f:
            return f.read().split(",")[0].replace("commit", "").strip()
    except OSError:
        pass
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


NORM_EPS = 1e-6


def norm_step(algorithm, hidden):
    """One all_reduce_rms_norm call on a rank's shard seen as rows of
    `hidden` elements, residual and gamma all ones; algorithm "pair" is
    the pair algorithm="auto" may take instead (jax_ar.all_reduce, then
    jax_ar.rms_norm)."""
    def step(y):
        x = y.reshape(-1, hidden)
        ones = jnp.ones_like(x)
        gamma = jnp.ones((hidden,), x.dtype)
        if algorithm == "pair":
            out, _ = jax_ar.rms_norm(jax_ar.all_reduce(x, "tp"), gamma, eps=NORM_EPS,
                                     residual=ones)
        else:
            out, _ = jax_ar.all_reduce_rms_norm(x, ones, gamma, "tp", eps=NORM_EPS,
                                                algorithm=algorithm)
        return out.reshape(y.shape)
    return step


def expected_result(name, data, n, hidden=1):
    """What one call of case `name` returns for the global input `data` (n
    shards, one a rank), in float64 (norm rows of `hidden`); None where it
    is not a sum."""
    shards = data.astype(np.float64).reshape(n, -1)
    kind, what = (name.split() + [""])[:2]
    if kind == "all_reduce_rms_norm":
        rows = shards.sum(0).reshape(-1, hidden) + 1.0  # the residual: ones
        normed = rows / np.sqrt((rows ** 2).mean(-1, keepdims=True) + NORM_EPS)
        return np.tile(normed.reshape(-1), n)
    if kind == "all_reduce":
        total = shards.sum(0) if name.endswith(" sum") else shards.mean(0)
    elif kind == "stage" and what in KERNEL_STAGES:
        total = shards.sum(0)
    else:
        return None
    return np.tile(total, n)


def check_result(step_program, x, want, rtol=0.0):
    """'ok' or 'wrong' for this process's shards of one call's result
    against `want`, 'unchecked' when want is None. The inputs are small
    integers: their sums and averages over 2-8 ranks are exact in bfloat16;
    a norm is checked to `rtol` (its one bfloat16 rounding)."""
    if want is None:
        return "unchecked"
    out = step_program(x)
    same = all(np.allclose(np.asarray(s.data, dtype=np.float64), want[s.index], rtol=rtol,
                           atol=0.0) for s in out.addressable_shards)
    return "ok" if same else "wrong"


def timed(fn, arg, repeats, handler_calls):
    """Seconds per run of fn(arg) after two warm-up runs (compile, record),
    and how often the FFI handlers ran during the timed runs."""
    fn(arg).block_until_ready()
    fn(arg).block_until_ready()
    before = handler_calls()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(arg).block_until_ready()
        samples.append(time.perf_counter() - start)
    return samples, handler_calls() - before


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per program (K)")
    parser.add_argument("--bytes", default="16K",
                        help="comma-separated bytes per rank (K/M suffixes), default 16K")
    parser.add_argument("--algorithms", default="oneshot,twoshot",
                        help="comma-separated all_reduce algorithms (default oneshot,twoshot)")
    parser.add_argument("--stages", default="",
                        help=f"comma-separated breakdown stages, or 'all': {', '.join(STAGES)}")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--launches", type=int, default=10,
                        help="back-to-back launches per sample (default 10)")
    parser.add_argument("--stage-bytes", default=None,
                        help="sizes at which the stages run (default: every --bytes size)")
    parser.add_argument("--copy-bytes", default=None,
                        help="sizes at which the copy baseline runs (default: every --bytes size)")
    parser.add_argument("--ops", default="avg",
                        help="comma-separated all_reduce ops: avg (default), sum")
    parser.add_argument("--norm-algorithms", default="",
                        help="comma-separated all_reduce_rms_norm algorithms (oneshot, twoshot: "
                             "the fused kernel; auto; pair: jax_ar.all_reduce then "
                             "jax_ar.rms_norm) timed at every --bytes size that is whole "
                             "rows; none by default")
    parser.add_argument("--norm-hidden", default="4096",
                        help="comma-separated row lengths of the all_reduce_rms_norm cases "
                             "(default 4096)")
    parser.add_argument("--output", choices=("element", "results"), default="element",
                        help="what the timed program returns: one element a rank (default, "
                             "since 2026-12-06) or the last call's results (the method before)")
    parser.add_argument("--variant", default="main", help="name of this tree or setting in the JSON")
    parser.add_argument("--json", default=None, help="also append the JSON lines to this file")
    parser.add_argument("--dump-hlo", default=None,
                        help="rank 0 writes each case's optimized program (HLO text) here")
    args = parser.parse_args()

    commit = tree_commit()
    mesh = jax.make_mesh((jax.device_count(),), ("tp",))
    comm = jax_ar.setup(mesh, "tp")
    assert comm.serves_calls, comm
    n = jax.device_count()
    sizes = [sweep.parse_size(s) for s in args.bytes.split(",") if s]
    stage_sizes = sizes if args.stage_bytes is None else [
        sweep.parse_size(s) for s in args.stage_bytes.split(",") if s]
    copy_sizes = sizes if args.copy_bytes is None else [
        sweep.parse_size(s) for s in args.copy_bytes.split(",") if s]
    algorithms = [a for a in args.algorithms.split(",") if a]
    ops = [o for o in args.ops.split(",") if o]
    norm_algorithms = [a for a in args.norm_algorithms.split(",") if a]
    norm_hiddens = [int(h) for h in args.norm_hidden.split(",") if h]
    stages = list(STAGES) if args.stages == "all" else [s for s in args.stages.split(",") if s]
    me = jax.process_index()
    # Invariant results feed the next call, so the vma checks are off; avg
    # keeps the values from growing over the chain.
    wrap = lambda body: jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("tp"),
                                              out_specs=P("tp"), check_vma=False))
    cases = []
    for nbytes in sizes:
        for algorithm in algorithms:
            for op in ops:
                suffix = "" if op == "avg" else f" {op}"
                cases.append((f"all_reduce {algorithm}{suffix}", nbytes,
                              lambda y, a=algorithm, o=op: jax_ar.all_reduce(y, "tp", op=o,
                                                                             algorithm=a),
                              None))
        for hidden in norm_hiddens if norm_algorithms else ():
            for algorithm in norm_algorithms if nbytes % (2 * hidden) == 0 else ():
                cases.append((f"all_reduce_rms_norm {algorithm}", nbytes,
                              norm_step(algorithm, hidden), hidden))
        for stage in stages if nbytes in stage_sizes else ():
            cases.append((f"stage {stage}", nbytes, lambda y, s=stage: protocol_probe(y, "tp", s),
                          None))
        if nbytes in copy_sizes:
            cases.append(("copy", nbytes, lambda y: jax.lax.optimization_barrier(-y), None))

    rows = []
    for name, nbytes, step, hidden in cases:
        elements = max(1, nbytes // 2)
        # make_array_from_callback, not device_put: device_put of a global
        # array checks through a collective that processes agree, and NCCL
        # refuses ranks that share a GPU.
        data = np.random.default_rng(0).integers(-4, 5, (n * elements,)).astype(jnp.bfloat16)
        x = jax.make_array_from_callback(data.shape, jax.sharding.NamedSharding(mesh, P("tp")),
                                         lambda idx: data[idx])
        norm = name.startswith("all_reduce_rms_norm")
        result = check_result(wrap(step), x, expected_result(name, data, n, hidden),
                              rtol=2.0 ** -7 if norm else 0.0)
        program = wrap(chain(step, args.calls, args.output))
        if args.dump_hlo and me == 0:
            os.makedirs(args.dump_hlo, exist_ok=True)
            name_of = f"{name.replace(' ', '_')}_{nbytes}.txt"
            with open(os.path.join(args.dump_hlo, name_of), "w") as f:
                f.write(program.lower(x).compile().as_text())
        one_launch, handler_runs = timed(program, x, args.repeats, comm.handler_calls)
        before = comm.handler_calls()
        per_call_us, samples, _ = timing.measure(lambda: program(x), args.calls, args.launches,
                                                 args.repeats)
        handler_runs += comm.handler_calls() - before
        row = {
            "commit": commit,
            "variant": args.variant,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "device": jax.devices()[0].device_kind,
            "jax": jax.__version__,
            "ranks": n,
            "processes": jax.process_count(),
            "case": name,
            "bytes_per_rank": nbytes,
            **({"norm_hidden": hidden} if hidden else {}),
            "dtype": "bfloat16",
            "calls_per_program": args.calls,
            "output": args.output,
            "launches_per_sample": args.launches,
            "repeats": args.repeats,
            "us_per_call": per_call_us,
            "result": result,
            "samples_us_per_call": [round(v, 3) for v in samples],
            "one_launch_us_per_call": 1e6 * statistics.median(one_launch) / args.calls,
            "handler_calls_during_timed_runs": handler_runs,
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
        }
        rows.append(row)
        if me == 0:
            print("PER_CALL_RESULT " + json.dumps(row), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
    comm.check()
    comm.close()
    if me == 0:
        print(f"# per call, us: {n} ranks on {jax.devices()[0].device_kind}, bfloat16, "
              f"{args.calls} calls per program, {args.launches} launches per sample, median "
              f"of {args.repeats} (one launch alone in parentheses)")
        for r in rows:
            hidden = f" h{r['norm_hidden']}" if "norm_hidden" in r else ""
            print(f"per call: {r['case'] + hidden:>22} {r['bytes_per_rank']:>9} B  "
                  f"{r['us_per_call']:8.2f} us"
                  f"  ({r['one_launch_us_per_call']:.2f}; all-reduce handler runs while timed: "
                  f"{r['handler_calls_during_timed_runs']})"
                  f"{'  RESULT WRONG' if r['result'] == 'wrong' else ''}", flush=True)


if __name__ == "__main__":
    main()
