"""One rank of `python -m jax_ar bench` / `tune`, started by the launcher.

Usage (by bench.py/tune.py): bench_rank.py CONFIG.json. Every rank runs the
same cases in the same order; rank 0 prints progress lines ("@@progress i N
what") and writes the combined results to config["out"]. Each result is the
slowest rank's median time per call and the sum over ranks of elements that
differ from the host reference.

The ranks combine each size group's results as it ends, and rank 0 appends
them to config["partial_out"] (JSON lines, after one with the machine), so
that a sweep stopped half way (a signal, --timeout, a rank that died) keeps
the groups it finished. A case that cannot be set up (its data do not fit
in memory, XLA does not compile it) becomes a row saying why: the ranks
agree on that through the key-value store before any of them launches the
case, so none waits for a peer that gave it up. A setting every rank
rejects at setup (the table, JAX_AR_ALGO, ...) is one "@@error" line and
exit code 2.
"""
from __future__ import annotations

import os
import sys

# The launcher's bootstrap puts the script's folder first on sys.path; here
# that is the jax_ar package itself, whose module names (config, flax, ...)
# must not shadow top-level packages.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import json  # noqa: E402
import platform as host_platform  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jax_ar  # noqa: E402
from jax_ar import config as ar_config, selection  # noqa: E402
from jax_ar.tools import bench_data as data, wrong_count  # noqa: E402
from jax_ar.tools.baselines import lax_reduce, xla_rms_norm  # noqa: E402
from jax_ar.tools.timing import (calibrate, calls_for, chained_to_count,  # noqa: E402
                                 chained_to_count_ends,
                                 count_collectives, gather, launches_for, measure)


AXIS = "tp"
_CUSTOM_CALL_TARGET = re.compile(r"custom_call @(jax_ar_\w+)")  # in lowered StableHLO
XLA_ONESHOT_OPTION = "xla_gpu_unsupported_use_all_reduce_one_shot_kernel"
# The path each rms_norm variant asks for (bench.RMS_NORM_VARIANTS and
# tune's), as _norm_path names what a program runs; "auto" asks for none.
NORM_VARIANT_PATH = {"fused": "fused", "fused_oneshot": "fused", "fused_twoshot": "fused",
                     "all_reduce+rms_norm": "all_reduce+rms_norm", "psum+norm": "psum+norm"}


def _global_input(mesh, shape_per_rank, make_rank_values):
    """The array whose rank-r block along dim 0 is make_rank_values(r)."""
    world = mesh.devices.size
    shape = (shape_per_rank[0] * world,) + tuple(shape_per_rank[1:])
    position = {d: r for r, d in enumerate(mesh.devices.flat)}
    arrays = [jax.device_put(make_rank_values(position[d]).reshape(shape_per_rank), d)
              for d in mesh.local_devices]
    return jax.make_array_from_single_device_arrays(shape, NamedSharding(mesh, P(AXIS)), arrays)


def _replicated(mesh, value):
    return jax.make_array_from_callback(value.shape, NamedSharding(mesh, P()),
                                        lambda index: value[index])


def _rank_count(output) -> int:
    """This rank's count of wrong elements, from a chained_to_count program."""
    return int(np.asarray(output.addressable_shards[0].data)[0])


class Runner:
    def __init__(self, config):
        self.config = config
        self.mesh = jax.make_mesh((jax.device_count(),), (AXIS,))
        self.world = self.mesh.devices.size
        self.comm = jax_ar.setup(self.mesh, AXIS, workspace_bytes=config.get("workspace_bytes"))
        self.device_kind = self.mesh.devices.flat[0].device_kind
        self.unavailable = dict(config.get("unavailable", {}))
        if not self.comm.serves_calls:
            reason = f"n/a: jax_ar falls back to psum here ({self.comm.fallback_reason})"
            for name in ("oneshot", "twoshot", "auto", "fused", "fused_oneshot", "fused_twoshot",
                         "all_reduce+rms_norm"):
                self.unavailable.setdefault(name, reason)

    # --- programs -----------------------------------------------------------
    def _all_reduce_step(self, algorithm, op):
        if algorithm in ("psum", "xla_oneshot"):
            return lambda x: (lax_reduce(x, AXIS, op),)
        return lambda x: (jax_ar.all_reduce(x, AXIS, op=op, algorithm=algorithm),)

    def _rms_norm_step(self, variant, eps):
        """One call of an all_reduce_rms_norm variant (bench.RMS_NORM_VARIANTS,
        and tune's fused_oneshot / fused_twoshot):
          fused                the fused kernel, its protocol as the table
                               picks among the fused paths
          fused_oneshot/_twoshot  the fused kernel with that protocol
          all_reduce+rms_norm  jax_ar.all_reduce, then jax_ar.rms_norm (the pair)
          psum+norm            psum, then the norm in jnp (XLA's fusion)
          auto                 all_reduce_rms_norm(algorithm="auto"): what a
                               model gets"""
        def norm(residual_out, gamma):
            return xla_rms_norm(residual_out, gamma, eps)[0]

        comm = self.comm
        if variant in ("fused", "fused_oneshot", "fused_twoshot", "auto"):
            def step(x, residual, gamma):
                if variant == "auto":
                    algorithm = "auto"
                elif variant == "fused":
                    path = selection.choose_norm_path(comm, x.size * x.dtype.itemsize,
                                                      ("fused_oneshot", "fused_twoshot"))
                    algorithm = path[len("fused_"):]
                else:
                    algorithm = variant[len("fused_"):]
                out, residual_out = jax_ar.all_reduce_rms_norm(x, residual, gamma, AXIS, eps=eps,
                                                               algorithm=algorithm)
                return out, residual_out, gamma
        elif variant == "all_reduce+rms_norm":
            def step(x, residual, gamma):
                out, residual_out = jax_ar.rms_norm(jax_ar.all_reduce(x, AXIS), gamma, eps=eps,
                                                    residual=residual)
                return out, residual_out, gamma
        else:  # psum+norm
            def step(x, residual, gamma):
                residual_out = jax.lax.psum(x, AXIS) + residual
                return norm(residual_out, gamma), residual_out, gamma
        return step

    def _compile(self, program, args, algorithm, chain):
        """(the compiled program, the jax_ar custom call targets it holds)."""
        lowered = program.lower(*args)
        if algorithm == "xla_oneshot":
            compiled = lowered.compile({XLA_ONESHOT_OPTION: True})
        else:
            compiled = lowered.compile()
        found = count_collectives(compiled.as_text())
        if found < chain:
            raise RuntimeError(
                f"jax_ar bench: XLA kept {found} of the {chain} chained collectives of "
                f"{algorithm}; the timing would be wrong, so nothing was timed")
        return compiled, set(_CUSTOM_CALL_TARGET.findall(lowered.as_text()))

    # --- cases ----------------------------------------------------------------
    def run_group(self, cases):
        """Times the cases of one message (the algorithms of one size, dtype
        and op) in turn: each of cfg["repeats"] rounds takes one sample of
        every case, alternating their order, so that load that comes and
        goes during the group slows every case alike (timed one after the
        other, they ranked differently from run to run on a busy 2-core
        machine). case["at_capacity"] = an algorithm sizes the message to
        one round of that algorithm's workspace."""
        cfg = self.config
        prepared = [self._prepare_timing(case) for case in cases]
        timed = [(result, how) for result, how in prepared if how is not None]
        outputs = {}
        for k in range(cfg["repeats"]):
            for result, (run, chain, launches, _) in (timed if k % 2 == 0 else timed[::-1]):
                # One untimed launch first: a case timed right after another
                # program took up to 6% longer than after itself (every other
                # sample, one H100, 2026-12-06), likely XLA recording its
                # command buffer again once the other program's buffers had
                # taken the place of this one's temporary buffer.
                jax.block_until_ready(run())
                _, sample, outputs[id(result)] = measure(run, chain, launches, 1)
                result["samples"] += sample
        for result, (_, chain, launches, check) in timed:
            result.update(chain=chain, launches=launches,
                          time_us=statistics.median(result["samples"]))
            if not cfg.get("check", True):
                result["wrong"] = None
                continue
            try:  # on the host, in this rank alone: no peer waits for it
                result["wrong"] = check(outputs[id(result)])
            except Exception as e:
                result.update(wrong=None, status=f"failed: checking the result: {_one_line(e)}")
        return [result for result, _ in prepared]

    def _prepare_timing(self, case):
        """(result, (run, chain, launches, check)) of one case, compiled and
        calibrated; (result, None) when it cannot run here (result says
        why)."""
        cfg = self.config
        algorithm = case["algorithm"]
        result = dict(case, chain=0, time_us=None, samples=[], wrong=0, status="ok")
        result.pop("at_capacity", None)
        reason = self.unavailable.get(algorithm)
        if reason:
            result["status"] = reason
            return result, None
        if case.get("at_capacity"):  # exactly what one workspace round carries
            itemsize = data.DTYPES[case["dtype"]].itemsize
            count = self.comm.capacity_bytes(case["at_capacity"]) // itemsize
            result.update(count=count, bytes=count * itemsize)
        if case["op"] != "rms_norm" and algorithm in ("oneshot", "twoshot"):
            # The kernel that runs (on CUDA "twoshot" is its LL or plain kernel).
            result["kernel"] = selection.choose_kernel(self.comm, algorithm,
                                                       _packed(result["bytes"]))
        # Data and compilation happen in each rank alone and may fail in some
        # (memory): the ranks agree on the outcome before any launches the
        # case, so that none waits in a collective for a peer that gave up.
        error, stage = None, "data"
        try:
            program, args, chain, check = self._prepare(result)
            stage = "compile"
            compiled, targets = self._compile(program, args, algorithm, chain)
        except Exception as e:
            error = (stage, _one_line(e))
            program = args = None  # the arrays go now, not at the next case
        errors = [e for e in gather(cfg["run_id"], f"prepare/{case['index']}", error,
                                    cfg.get("gather_timeout_s", 300)) if e]
        if errors:
            stage, text = errors[0]
            if stage == "compile" and algorithm in ("psum", "xla_oneshot"):
                # XLA's own collectives may be unavailable here (an unknown
                # option, no collectives implementation): report, do not fail.
                result["status"] = f"n/a: {text[:160]}"
            else:
                doing = "setting up the data" if stage == "data" else "compiling"
                result["status"] = f"failed: {doing}: {text[:200]}"
            return result, None
        if case["op"] == "rms_norm" and algorithm in NORM_VARIANT_PATH:
            ran = _norm_path(targets)
            if ran != NORM_VARIANT_PATH[algorithm]:
                # The library took another path (the fused kernel does not
                # take rows of this hidden size, ...): the row says what ran.
                result["kernel"] = ran
        run = lambda: compiled(*args)  # noqa: E731
        # Every rank must launch equally often: agree on the slowest rank's launch time.
        launch_s = max(gather(cfg["run_id"], f"calibrate/{case['index']}",
                              calibrate(run, cfg["warmup"]), cfg.get("gather_timeout_s", 300)))
        launches = launches_for(launch_s, cfg["launches"], cfg["min_sample_s"])
        return result, (run, chain, launches, check)

    def _prepare(self, case):
        """(program, its arguments, chain length, check(output) -> #wrong).
        The program's only output is each rank's count of wrong elements
        against the host's reference, taken on the device
        (timing.chained_to_count says why; for rms_norm, the first and the
        last call's: chained_to_count_ends); with --check 0 the reference is
        zeros and the count goes unread."""
        cfg, dtype_name, count = self.config, case["dtype"], case["count"]
        checked = cfg.get("check", True)
        if case["op"] == "rms_norm":
            tokens, hidden = case["tokens"], case["hidden"]
            chain = calls_for(cfg, case["bytes"])
            step = self._rms_norm_step(case["algorithm"], cfg["eps"])
            inputs = [data.rms_norm_inputs(dtype_name, tokens, hidden, r, self.world, cfg["seed"])
                      for r in range(self.world)]
            x, residual, gamma = inputs[0]
            # The first call against the host's emulation of it, the last
            # against its own inputs (chained_to_count_ends says why).
            wants = (data.rms_norm_reference([inp[0] for inp in inputs], residual, gamma,
                                             cfg["eps"], 1) if checked
                     else (np.zeros_like(residual), np.zeros_like(residual)))
            args = (_global_input(self.mesh, (tokens, hidden), lambda r: inputs[r][0]),
                    _replicated(self.mesh, residual), _replicated(self.mesh, gamma),
                    *(_replicated(self.mesh, w) for w in wants))

            def off(results, wants):  # out and residual_out; gamma only passes through
                return (wrong_count.off_tolerance(results[0], wants[0])
                        + wrong_count.off_tolerance(results[1], wants[1]))

            def off_own_inputs(results, call_args):
                if not checked:
                    return 0
                return off(results, wrong_count.rms_norm_of(*call_args, cfg["eps"], self.world))

            program = chained_to_count_ends(step, self.mesh, AXIS, chain, off, off_own_inputs,
                                            n_args=3, n_wants=2)
            return program, args, chain, _rank_count
        op = case["op"]
        chain = data.chain_length(op, dtype_name, self.world, calls_for(cfg, case["bytes"]))
        step = self._all_reduce_step(case["algorithm"], op)
        x = _global_input(self.mesh, (count,), lambda r: data.rank_values(
            dtype_name, count, r, self.world, cfg["seed"]))
        want = (data.reference(op, dtype_name, count, self.world, chain, cfg["seed"]) if checked
                else np.zeros(count, data.DTYPES[dtype_name]))
        program = chained_to_count(step, self.mesh, AXIS, chain,
                                   lambda results, wants: wrong_count.bits_differ(results[0],
                                                                                  wants[0]))
        return program, (x, _replicated(self.mesh, want)), chain, _rank_count

    def auto_picks(self, results) -> dict:
        """What algorithm="auto" runs here at each size, and the table it
        used. All-reduce: the algorithm, decided the way the library decides
        it (psum where the communicator falls back, JAX_AR_ALGO, else the
        cost model), keyed by the size in bytes. --op rms_norm: the variant
        (bench.RMS_NORM_VARIANTS) whose kernels the program of
        all_reduce_rms_norm(algorithm="auto") holds, keyed "dtype bytes"."""
        override = ar_config.algorithm_override()
        picks = {}
        for r in results:
            nbytes = r["bytes"]
            if r["op"] == "rms_norm":
                key = f"{r['dtype']} {nbytes}"
                if key not in picks:
                    picks[key] = self._norm_variant_of_auto(r)
            elif str(nbytes) not in picks:
                picks[str(nbytes)] = ("psum" if not self.comm.serves_calls else
                                      selection.choose_kernel(self.comm, override or "auto",
                                                              _packed(nbytes)))
        return {"table": self.table_source(), "picks": picks}

    def table_source(self) -> str:
        """Where the table that algorithm="auto" reads here comes from."""
        try:
            return selection.table_for(self.comm.platform, self.device_kind, self.world).source
        except selection.TableError as e:
            return f"none ({e})"

    def _norm_variant_of_auto(self, case) -> str:
        """Which variant all_reduce_rms_norm(algorithm="auto") runs for this
        case, read from the custom calls of its lowered program (one call):
        "fused", "all_reduce+rms_norm", "psum+norm" (no jax_ar kernel), or
        "auto" (jax_ar's all-reduce and XLA's norm: no variant of its own)."""
        tokens, hidden = case["tokens"], case["hidden"]
        dtype = data.DTYPES[case["dtype"]]
        step = self._rms_norm_step("auto", self.config["eps"])
        program = jax.jit(jax.shard_map(step, mesh=self.mesh, in_specs=(P(AXIS), P(), P()),
                                        out_specs=(P(), P(), P())))
        specs = (((tokens * self.world, hidden), P(AXIS)), ((tokens, hidden), P()),
                 ((hidden,), P()))
        args = [jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(self.mesh, spec))
                for shape, spec in specs]
        path = _norm_path(set(_CUSTOM_CALL_TARGET.findall(program.lower(*args).as_text())))
        return "auto" if path == "all_reduce+norm" else path

    def machine(self):
        info = {
            "platform": self.comm.platform,
            "device_kind": self.device_kind,
            "world_size": self.world,
            "processes": jax.process_count(),
            "devices": [str(d) for d in self.mesh.devices.flat],
            "jax": jax.__version__,
            "jax_ar": jax_ar.__version__,
            "workspace_bytes": self.comm.workspace_bytes,
            "capacity_bytes": {a: self.comm.capacity_bytes(a) for a in
                               selection.candidates_for(self.comm.platform, psum=False)},
            "serves_calls": self.comm.serves_calls,
            "fallback_reason": self.comm.fallback_reason,
            "host": host_platform.node(),
            "cpu": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "load_average": _load_average(),
            "python": host_platform.python_version(),
        }
        return info


def _norm_path(targets) -> str:
    """What a program of all_reduce_rms_norm's paths runs, from the jax_ar
    custom call targets it holds: "fused" (the fused kernel),
    "all_reduce+rms_norm" (jax_ar's all-reduce, then its norm kernel),
    "all_reduce+norm" (jax_ar's all-reduce, then XLA's norm) or "psum+norm"
    (no jax_ar kernel)."""
    if "jax_ar_all_reduce_rms_norm" in targets:
        return "fused"
    if "jax_ar_all_reduce" not in targets:
        return "psum+norm"
    if targets & {"jax_ar_rms_norm", "jax_ar_add_rms_norm"}:
        return "all_reduce+rms_norm"
    return "all_reduce+norm"


def _same_message_groups(cases):
    """Runs of consecutive cases that time the same message with different
    algorithms ([(index, case), ...] each): bench lists a size's
    algorithms together; tune lists an algorithm's sizes, whose cases then
    run one at a time."""
    groups, key_of = [], lambda c: tuple(c.get(k) for k in ("bytes", "at_capacity", "dtype",
                                                              "op", "hidden"))
    for i, case in enumerate(cases):
        if groups and key_of(groups[-1][-1][1]) == key_of(case):
            groups[-1].append((i, case))
        else:
            groups.append([(i, case)])
    return groups


def _one_line(error: BaseException) -> str:
    """An exception as one line: its type and the first line of its text."""
    name = type(error).__name__.lstrip("_")
    text = (str(error).strip().splitlines() or [""])[0]
    return f"{name}: {text}" if text else name


def _packed(nbytes: int) -> int:
    """What one array of `nbytes` takes in a call: whole 16-byte vectors."""
    return -(-nbytes // 16) * 16


def _load_average():
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return host_platform.processor() or host_platform.machine()


def main(argv) -> None:
    with open(argv[0]) as f:
        config = json.load(f)
    try:
        runner = Runner(config)
    except (selection.TableError, ValueError) as e:
        # The environment (JAX_AR_TABLE, JAX_AR_ALGO, JAX_AR_TIMEOUT_S) or an
        # option that jax_ar.setup rejects, alike in every rank: one line.
        print(f"@@error {str(e).strip().splitlines()[0]}", flush=True)
        sys.exit(2)
    leader = jax.process_index() == 0
    cases = config["cases"]
    partial = config.get("partial_out") if leader else None
    if partial:
        _append_line(partial, {"machine": runner.machine(), "table": runner.table_source()})
    results, picks = [], {}
    start = time.monotonic()
    timeout = config.get("gather_timeout_s", 300)
    for g, group in enumerate(_same_message_groups(cases)):
        if leader:
            i, case = group[0]
            size = f"{case['at_capacity']}-round" if case.get("at_capacity") else case["bytes"]
            what = ",".join(c["algorithm"] for _, c in group)
            print(f"@@progress {i} {len(cases)} {size} {case['dtype']} {case['op']} {what}",
                  flush=True)
        mine = runner.run_group([dict(case, index=i) for i, case in group])
        everyone = gather(config["run_id"], f"results/{g}",
                          [[r["time_us"], r["wrong"], r["status"]] for r in mine], timeout)
        _combine(mine, everyone)
        results += mine
        if leader:
            group_picks = runner.auto_picks(mine)["picks"]
            picks.update(group_picks)
            if partial:
                _append_line(partial, {"results": mine, "picks": group_picks})
    if leader:
        print(f"@@progress {len(cases)} {len(cases)} done", flush=True)
        doc = {"machine": runner.machine(), "results": results,
               "selection": {"table": runner.table_source(), "picks": picks},
               "elapsed_s": time.monotonic() - start}
        tmp = config["out"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, config["out"])


def _combine(results, everyone) -> None:
    """Each result as all ranks saw it: the slowest rank's time, the wrong
    elements summed, and a rank's failure (its check) for all of them."""
    for i, r in enumerate(results):
        times = [per_rank[i][0] for per_rank in everyone]
        failed = next((per_rank[i][2] for per_rank in everyone if per_rank[i][2] != "ok"), None)
        if failed is not None:
            r["status"] = failed
        r["time_us_ranks"] = times
        r["time_us"] = max(times) if r["status"] == "ok" else None
        wrong = [per_rank[i][1] for per_rank in everyone]
        r["wrong"] = None if None in wrong else sum(wrong)  # None: not checked (-c 0)


def _append_line(path: str, value) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(value) + "\n")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Exception:  # a stop signal (KeyboardInterrupt, SystemExit) goes to the bootstrap
        traceback.print_exc()
        sys.stdout.flush()
        sys.exit(1)
