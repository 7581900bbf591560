"""python -m jax_ar bench / tune: exact benchmark data, a short sweep on CPU
ranks (table, JSON, PNG, #wrong == 0), a tiny tune run, option errors."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from harness import ON_GPU, runs_on


import jax_ar
from jax_ar.tools import bench_data as data
from jax_ar.selection import table as _table
from jax_ar import __version__ as VERSION

pytestmark = runs_on("cpu", "gpu")

PLATFORM = ["--platform", "gpu" if ON_GPU else "cpu"]
# The tests below check behaviour, not timing: on GPU they keep the
# programs as short as before the default of 300 calls (compile time).
SHORT = ["-n", "20"] if ON_GPU else []


def _reduce(parts, op, dtype, order, in_dtype):
    """One all-reduce the way some implementation might do it: ranks in
    `order`, accumulating in float32 (jax_ar) or in the dtype itself with a
    rounding after every step (a ring in bfloat16)."""
    acc_type = dtype if in_dtype else (np.int64 if dtype == np.int32 else np.float32)
    acc = parts[order[0]].astype(acc_type)
    for r in order[1:]:
        p = parts[r].astype(acc_type)
        acc = {"sum": acc + p, "avg": acc + p, "max": np.maximum(acc, p),
               "min": np.minimum(acc, p)}[op]
        if dtype == np.int32:
            acc = (acc.astype(np.int64) + 2**31) % 2**32 - 2**31
    if op == "avg":  # int32 averages are float32, as pmean's
        mean = acc.astype(np.float32) / np.float32(len(parts))
        return mean if dtype == np.int32 else mean.astype(dtype)
    return acc.astype(dtype)


@pytest.mark.parametrize("dtype_name", list(data.DTYPES))
def test_chained_data_are_exact_in_any_reduction_order(dtype_name):
    dtype = data.DTYPES[dtype_name]
    for world in (2, 3, 4, 8, 16):
        for op in ("sum", "avg", "max", "min"):
            chain = data.chain_length(op, dtype_name, world, 20)
            assert chain >= (1 if (op, dtype_name) == ("avg", "int32") else 4), (op, world)
            want = data.reference(op, dtype_name, 999, world, chain, seed=3)
            for order, in_dtype in ((range(world), False), (range(world)[::-1], True),
                                    ([*range(1, world), 0], True)):
                parts = [data.rank_values(dtype_name, 999, r, world, seed=3)
                         for r in range(world)]
                assert all(np.all(p.astype(np.float64) != 0) for p in parts)
                assert len({p.tobytes() for p in parts}) >= 2  # ranks hold different data
                for _ in range(chain):
                    y = _reduce(parts, op, dtype, list(order), in_dtype)
                    parts = [y.astype(dtype) if op != "avg" or dtype != np.int32 else y] * world
                assert data.count_wrong(y, want) == 0, (dtype_name, world, op, order, in_dtype)
            # A kernel that never read its peers (every rank reduces n copies of
            # its own data) is caught on some rank at every element.
            parts = [data.rank_values(dtype_name, 999, r, world, seed=3) for r in range(world)]
            once = data.reference(op, dtype_name, 999, world, 1, seed=3)
            worst = max(data.count_wrong(_reduce([p] * world, op, dtype, range(world), False),
                                         once) for p in parts)
            assert worst == 999, (dtype_name, world, op)


def _with_mistakes(want, rng):
    """want with a few elements changed the ways a kernel could get them
    wrong: one bit off, a sign, NaN, and values just inside and outside
    rms_norm_wrong's tolerance."""
    got = want.copy().reshape(-1)
    wide = got.astype(np.float64)
    picks = rng.choice(got.size, 6, replace=False)
    rounding = data.ROUNDING.get(got.dtype.itemsize, 0.0)
    unsigned = data.UNSIGNED[got.dtype.itemsize]
    bits = got.view(unsigned)
    bits[picks[0]] ^= 1
    got[picks[1]] = -got[picks[1]]
    if got.dtype.kind == "f" or got.dtype == data.DTYPES["bfloat16"]:
        got[picks[2]] = np.nan
        for pick, share in ((picks[3], 0.5), (picks[4], 3.0)):
            got[pick] = wide[pick] + share * data.ROUNDINGS * rounding * (abs(wide[pick]) + 1.0)
    return got.reshape(want.shape)


@pytest.mark.parametrize("dtype_name", list(data.DTYPES))
def test_the_device_counts_wrong_elements_as_the_host_does(dtype_name):
    """wrong_count (the timed program's check) against bench_data's host
    rules, on results with mistakes a kernel could make."""
    import jax.numpy as jnp
    from jax_ar.tools import wrong_count

    rng = np.random.default_rng(5)
    dtype = data.DTYPES[dtype_name]
    want = data.reference("sum", dtype_name, 4096, 2, 1, seed=1).reshape(8, 512)
    got = _with_mistakes(want, rng)
    host = data.count_wrong(got, want)
    assert host >= 2
    assert int(wrong_count.bits_differ(jnp.asarray(got), jnp.asarray(want))) == host
    assert int(wrong_count.bits_differ(jnp.asarray(want), jnp.asarray(want))) == 0
    assert int(wrong_count.bits_differ(jnp.asarray(got[:4]), jnp.asarray(want))) == want.size
    if dtype_name in ("bfloat16", "float32"):  # the fused kernel's dtypes
        host = data.rms_norm_wrong(got, want)
        assert host >= 3  # the sign, NaN and the value beyond the tolerance at least
        assert int(wrong_count.off_tolerance(jnp.asarray(got), jnp.asarray(want))) == host


def test_the_timed_program_returns_only_each_rank_s_count_of_wrong_elements():
    """chained_to_count: the chain's results stay inside the program (its
    only output is an int32 a rank) and a wrong element is counted."""
    import jax
    import jax.numpy as jnp
    from jax_ar.tools import timing, wrong_count

    mesh = jax.make_mesh((1,), ("tp",), devices=jax.devices()[:1])
    step = lambda a: (jax.lax.psum(a, "tp") + 1.0,)  # noqa: E731  (invariant, as a collective's)
    count = lambda results, wants: wrong_count.bits_differ(results[0], wants[0])  # noqa: E731
    program = timing.chained_to_count(step, mesh, "tp", 5, count)
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("tp"))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    x = jax.device_put(jnp.arange(64, dtype=jnp.float32), sharded)
    right = np.arange(64, dtype=np.float32) + 5
    off = right.copy()
    off[7] += 1
    right, off = jax.device_put(right, replicated), jax.device_put(off, replicated)
    assert program(x, right).tolist() == [0]
    out = program(x, off)
    assert out.dtype == jnp.int32 and out.tolist() == [1]
    compiled = program.lower(x, right).compile().as_text()
    assert re.search(r"ENTRY[^\n]*->\s*s32\[1\]", compiled), compiled[-2000:]


def test_a_chain_of_rms_norm_calls_is_checked_at_its_ends():
    """chained_to_count_ends: the first call's results against the wants,
    the last call's against a reference of its own inputs: the roundings
    in which the calls differ from an emulation of the whole chain are not
    counted, a wrong first or last call is."""
    import jax
    import jax.numpy as jnp
    from jax_ar.tools import timing, wrong_count

    mesh = jax.make_mesh((1,), ("tp",), devices=jax.devices()[:1])
    calls = []

    def step_of(wrong_call):
        def step(a):
            calls.append(None)  # the chain is unrolled: this is call len(calls)
            # Each call rounds its own way (as a kernel's float32 inverse
            # RMS does against the host's float64): no emulation of the
            # whole chain follows it, but each call is a * 0.75 + 1 within
            # float32's rounding.
            y = jax.lax.psum(a, "tp") * jnp.float32(0.75) + (1.0 + 2.0**-20 * len(calls))
            return (y + 1.0 if len(calls) == wrong_call else y,)
        return step

    def own_reference(results, args):
        return wrong_count.off_tolerance(results[0], args[0] * 0.75 + 1.0)

    def first_against_wants(results, wants):
        return wrong_count.off_tolerance(results[0], wants[0])

    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("tp"))
    x = jax.device_put(jnp.arange(64, dtype=jnp.float32), sharded)
    first = jax.device_put(np.arange(64, dtype=np.float32) * 0.75 + 1.0,
                           jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    chain = 40
    for wrong_call, expected in ((0, 0), (1, 64), (chain, 64)):
        calls.clear()
        program = timing.chained_to_count_ends(step_of(wrong_call), mesh, "tp", chain,
                                               first_against_wants, own_reference)
        assert program(x, first).tolist() == [expected], wrong_call
    # The same chain against an emulation of all 40 calls (what bench did):
    # the calls' own roundings add up past the tolerance.
    calls.clear()
    program = timing.chained_to_count(step_of(0), mesh, "tp", chain, first_against_wants)
    emulated = np.arange(64, dtype=np.float64)
    for _ in range(chain):
        emulated = emulated * 0.75 + 1.0
    want = jax.device_put(emulated.astype(np.float32),
                          jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    assert program(x, want).tolist()[0] > 0


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float32"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_device_reference_of_one_rms_norm_call_matches_the_host_emulation(dtype_name,
                                                                                world):
    """wrong_count.rms_norm_of (a chain's last call, from its own inputs,
    every rank's x the same) against bench_data's float64 emulation of that
    call: the residual_out bit for bit (16-bit data; float32 sums round),
    out within one rounding, and a result off by a rank's share counted
    wrong."""
    import jax.numpy as jnp
    from jax_ar.tools import wrong_count

    tokens, hidden = 16, 256
    x, residual, gamma = data.rms_norm_inputs(dtype_name, tokens, hidden, 0, world, seed=2)
    # A later call's x: an earlier call's out, the same on every rank.
    x = data.rms_norm_reference([x] * world, residual, gamma, 1e-6, 3)[0]
    want_out, want_res = data.rms_norm_reference([x] * world, residual, gamma, 1e-6)
    out, res = wrong_count.rms_norm_of(jnp.asarray(x), jnp.asarray(residual), jnp.asarray(gamma),
                                       1e-6, world)
    if dtype_name == "bfloat16":
        assert data.count_wrong(np.asarray(res), want_res) == 0
    assert int(wrong_count.off_tolerance(res, jnp.asarray(want_res))) == 0
    rounding = data.ROUNDING[want_out.dtype.itemsize]
    assert np.all(np.abs(np.asarray(out, np.float64) - want_out.astype(np.float64))
                  <= rounding * (np.abs(want_out.astype(np.float64)) + 1.0))
    assert int(wrong_count.off_tolerance(out, jnp.asarray(want_out))) == 0
    # A sum that missed one rank's share.
    short, _ = wrong_count.rms_norm_of(jnp.asarray(x), jnp.asarray(residual), jnp.asarray(gamma),
                                       1e-6, world - 1)
    assert int(wrong_count.off_tolerance(short, jnp.asarray(want_out))) > 0


def run_cli(*args, timeout=300):
    env = dict(os.environ, JAX_AR_TIMEOUT_S="60")
    return subprocess.run([sys.executable, "-m", "jax_ar", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_bench_short_sweep(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("bench", *PLATFORM, *SHORT, "-N", "2", "-b", "1K", "-e", "2K",
                   "-d", "float32,bfloat16", "-o", "sum,max", "--repeats", "3",
                   "--min-sample-ms", "2", "--out-dir", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if not line.startswith("#")]
    # size, count, type, op, algorithm, time_us, algbw, busbw, #wrong, vs_psum
    assert len(rows) == 2 * 2 * 2 * 3, proc.stdout
    header = next(line for line in proc.stdout.splitlines() if "time_us" in line)
    for column in ("size", "count", "type", "op", "algorithm", "time_us", "algbw", "busbw",
                   "#wrong", "vs_psum"):
        assert column in header
    assert "# machine: 2 ranks" in proc.stdout
    doc = json.loads((out / "bench.json").read_text())
    assert doc["machine"]["world_size"] == 2
    results = doc["results"]
    assert {r["algorithm"] for r in results} == {"oneshot", "twoshot", "psum"}
    for r in results:
        if r["algorithm"] == "psum" and ON_GPU:
            assert r["status"].startswith("n/a") and "NCCL" in r["status"]
            continue
        assert r["status"] == "ok" and r["wrong"] == 0 and r["time_us"] > 0, r
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"])  # 2(n-1)/n = 1 at n = 2
        # The chain is the platform's default length (sweep.DEFAULTS: 10 on
        # CPU, 20 on GPU), never shortened for these exact data.
        assert r["chain"] == doc["method"]["iters"] and len(r["time_us_ranks"]) == 2, \
            (r, doc["method"])
        if not ON_GPU:
            assert r["speedup_vs_psum"] > 0
    png = (out / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_bench_rms_norm_mode(tmp_path, capsys):
    if not hasattr(jax_ar, "all_reduce_rms_norm"):
        from jax_ar.tools import bench

        with pytest.raises(SystemExit) as info:
            bench.main(["--op", "rms_norm", "--platform", "cpu"])
        assert info.value.code == 2
        assert "needs jax_ar.all_reduce_rms_norm" in capsys.readouterr().err
        return
    proc = run_cli("bench", *PLATFORM, *SHORT, "-N", "2", "--op", "rms_norm", "-b", "8K",
                   "-e", "16K", "--hidden", "1024", "-d", "bfloat16", "--repeats", "3",
                   "--min-sample-ms", "2", "--out-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "bench.json").read_text())
    results = doc["results"]
    assert {r["algorithm"] for r in results} == {"fused", "all_reduce+rms_norm", "psum+norm",
                                                 "auto"}
    assert all(r["wrong"] == 0 for r in results), results
    assert not any("kernel" in r for r in results), results  # each ran what it names
    # What auto runs is marked at every size, and the table stays aligned
    # ("all_reduce+rms_norm*" is the widest label).
    rows = [line for line in proc.stdout.splitlines() if not line.startswith("#")]
    for size in (8192, 16384):
        starred = [line for line in rows if line.split()[0] == str(size) and "*" in line]
        assert len(starred) == 1, proc.stdout
        pick = doc["selection"]["picks"][f"bfloat16 {size}"]
        assert pick in ("fused", "all_reduce+rms_norm", "psum+norm", "auto"), pick
        assert starred[0].split()[4] == pick + "*", proc.stdout
    _assert_aligned(proc.stdout)


def test_bench_rms_norm_rows_say_what_ran_below_the_fused_kernel_s_hidden_sizes(tmp_path):
    """Rows of a hidden size the fused kernel does not take: all_reduce_rms_norm
    runs jax_ar.all_reduce and then XLA's norm, and the "fused" row says so."""
    from jax_ar import _native

    hidden = _native.limits("gpu" if ON_GPU else "cpu")["fused_min_hidden"] // 2
    proc = run_cli("bench", *PLATFORM, *SHORT, "-N", "2", "--op", "rms_norm", "-b", "1K",
                   "-e", "1K", "--hidden", str(hidden), "-a", "fused,all_reduce+rms_norm",
                   "--repeats", "2", "--min-sample-ms", "1", "--no-plot",
                   "--out-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["algorithm"]: r for r in json.loads((tmp_path / "bench.json").read_text())["results"]}
    assert rows["fused"]["hidden"] == hidden and rows["fused"]["kernel"] == "all_reduce+norm"
    assert "kernel" not in rows["all_reduce+rms_norm"]  # ran what it names
    labels = [line.split()[4] for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert labels == ["all_reduce+norm", "all_reduce+rms_norm"], proc.stdout
    assert ("# all_reduce+norm (jax_ar.all_reduce, then XLA's norm): rows of fused, which the "
            "library runs that way for these messages") in proc.stdout.splitlines()
    _assert_aligned(proc.stdout)


def _assert_aligned(table: str):
    """Every row's columns end where the header's do."""
    lines = table.splitlines()
    header = next(line for line in lines if "time_us" in line)
    ends = [m.end() for m in re.finditer(r"\S+", header)][1:]  # after the "#"
    for line in lines:
        if line.startswith("#") or "n/a" in line:
            continue
        assert [m.end() for m in re.finditer(r"\S+", line)] == ends, f"{line!r}\n{header!r}"


@pytest.mark.parametrize("args,message", [
    (["-d", "float64"], "--dtype: float64"),
    (["-a", "nccl"], "--algorithms: nccl"),
    (["-d", ""], "--dtype: give one or more of float32, bfloat16"),
    (["-a", ""], "--algorithms: give one or more of oneshot, twoshot"),
    (["-a", " , "], "--algorithms: give one or more of oneshot, twoshot"),
    (["-o", "rms_norm", "-a", ""], "--algorithms: give one or more of fused, "),
    (["-o", ","], "--op: give one or more of sum, avg"),
    (["-b", "1K", "-e", "512"], "min-bytes <= max-bytes"),
    (["-b", "lots"], "not a size"),
    (["-N", "1"], "at least 2"),
    (["-n", "0"], "--iters must be at least 1"),
    (["-c", "2"], "invalid choice: 2"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["-o", "rms_norm", "--hidden", "0", "-b", "1K", "-e", "1K"],
     "--hidden must be at least 1, got 0"),
    (["-o", "rms_norm", "--hidden", "-5"], "--hidden must be at least 1, got -5"),
    (["-o", "rms_norm", "--eps", "nan"], "--eps: eps must be positive and finite, got nan"),
    (["-o", "rms_norm", "--eps", "1e-45"], "below float32's smallest normal number"),
    (["--min-sample-ms", "nan"], "--min-sample-ms must be at least 0 and finite, got nan"),
    (["--min-sample-ms", "-1"], "--min-sample-ms must be at least 0 and finite, got -1"),
    (["--launches", "0"], "--launches must be at least 1, got 0"),
    (["-w", "-1"], "--warmup must be at least 0, got -1"),
    (["--workspace-bytes", "10"],
     "--workspace-bytes must be between 1M and 1024G (jax_ar.setup's limits), got 10"),
    (["--timeout", "nan"], "--timeout must be a positive number of seconds, got nan"),
    (["--timeout", "0"], "--timeout must be a positive number of seconds, got 0"),
    (["--seed", "-1"], "--seed must be at least 0, got -1"),
])
def test_bench_rejects_bad_options(args, message, capsys):
    from jax_ar.tools import bench

    with pytest.raises(SystemExit) as info:
        bench.main(["--platform", "cpu", *args])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_limits_of_options_are_the_library_s():
    """--workspace-bytes takes exactly what jax_ar.setup takes."""
    from jax_ar.comm import communicator
    from jax_ar.tools import bench, sweep as _sweep

    def plan(*args):
        return bench.plan(bench.build_parser().parse_args(["-e", "1K", *args]), "cpu", 0)

    for size in (communicator.MIN_WORKSPACE_BYTES, communicator.MAX_WORKSPACE_BYTES):
        assert plan("--workspace-bytes", _sweep.format_size(size))["workspace_bytes"] == size
    for size in (communicator.MIN_WORKSPACE_BYTES - 1, communicator.MAX_WORKSPACE_BYTES + 1):
        with pytest.raises(ValueError, match="jax_ar.setup's limits"):
            plan("--workspace-bytes", str(size))
    assert plan("--min-sample-ms", "0")["min_sample_s"] == 0  # no least sample time


@pytest.mark.parametrize("args,message", [
    (["--min-sample-ms", "nan"], "--min-sample-ms must be at least 0 and finite, got nan"),
    (["--workspace-bytes", "10"], "--workspace-bytes must be between 1M and 1024G"),
    (["--timeout", "-1"], "--timeout must be a positive number of seconds, got -1"),
    (["--repeats", "0"], "--repeats must be at least 1, got 0"),
])
def test_tune_rejects_bad_options(args, message, capsys):
    from jax_ar.tools import tune

    with pytest.raises(SystemExit) as info:
        tune.main(["--platform", "cpu", *args])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_tune_writes_a_table_later_runs_accept(tmp_path):
    path = tmp_path / "table.json"
    proc = run_cli("tune", *PLATFORM, *SHORT, "-N", "2", "-b", "1K", "-e", "16K", "--repeats", "3",
                   "--min-sample-ms", "2", "--out", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"# wrote {path}" in proc.stdout
    doc = json.loads(path.read_text())
    table = _table.load_table(str(path), doc["platform"], doc["device_kind"], 2, VERSION)
    assert set(table.curves) == set(_table.kernel_curves(doc["platform"]) + _table.NORM_PATHS)
    assert sorted(doc["measurements"]["oneshot"])[0][0] == 1024
    if not ON_GPU:
        assert len(doc["measurements"]["psum"]) == 5
    # all_reduce_rms_norm's paths: whole calls of 1 and 2 rows of 4096 bfloat16.
    for path_name in _table.NORM_PATHS:
        assert sorted(b for b, _ in doc["measurements"][path_name]) == [8192, 16384], path_name
        assert path_name not in doc["notes"], doc["notes"]


def test_tune_below_one_norm_row_says_so_instead_of_an_empty_table(tmp_path):
    """Messages of 1K and 2K hold no row of the norm paths (4096 bfloat16):
    one line says nothing was measured there, and the kernels' table follows."""
    proc = run_cli("tune", *PLATFORM, *SHORT, "-N", "2", "-b", "1K", "-e", "2K", "--repeats", "2",
                   "--min-sample-ms", "1", "--out", str(tmp_path / "table.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("# all_reduce_rms_norm (bfloat16, hidden 4096), whole calls: none measured (a "
            "call takes at least one row of 8KB)") in proc.stdout.splitlines(), proc.stdout
    assert "fused_oneshot us" not in proc.stdout  # no header of an empty table
    assert re.search(r"^\s+1024\s", proc.stdout, re.M), proc.stdout  # the kernels' rows


def test_bench_plans_ranks_sharing_a_gpu(monkeypatch, capsys):
    """What the GPU machine's run gets (2 ranks on 1 GPU): psum is reported
    as unavailable, not attempted; a missing MPS daemon is warned about."""
    from jax_ar.tools import bench, sweep as _sweep, timing

    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/nonexistent")
    ns = bench.build_parser().parse_args(["-N", "2", "-e", "64M", "--xla-oneshot"])
    config = bench.plan(ns, "gpu", 1)
    assert "CUDA MPS" in capsys.readouterr().err
    assert config["ranks"] == 2 and config["iters"] == 300 and config["min_sample_s"] == 0.02
    # The default chain moves at most 4 GB a rank: 300 calls of 1 MB, 64 of 64 MB, 20 of 256 MB.
    assert [timing.calls_for(config, b << 20) for b in (1, 64, 256)] == [300, 64, 20]
    explicit = bench.plan(bench.build_parser().parse_args(["-N", "2", "-n", "50"]), "gpu", 1)
    assert [timing.calls_for(explicit, b << 20) for b in (1, 256)] == [50, 50]
    assert config["unavailable"]["psum"] == config["unavailable"]["xla_oneshot"]
    assert "NCCL" in config["unavailable"]["psum"]
    sizes = sorted({c["bytes"] for c in config["cases"]})
    assert sizes == _sweep.size_list(1024, 64 << 20)
    assert {c["algorithm"] for c in config["cases"]} == {"oneshot", "twoshot", "psum",
                                                        "xla_oneshot"}
    # One GPU per rank: psum runs.
    assert bench.plan(bench.build_parser().parse_args(["-N", "8"]), "gpu", 8)["unavailable"] == {}


def test_bench_nccl_tests_flags_and_a_new_folder_per_run(tmp_path):
    """-n iterations, -w warm-up, -c 0 (no check), -G accepted with a note;
    without --out-dir each run writes a new bench_results/<date>-<time>/."""
    env = dict(os.environ, JAX_AR_TIMEOUT_S="60")
    cmd = [sys.executable, "-m", "jax_ar", "bench", *PLATFORM, "-N", "2", "-b", "1K", "-e", "1K",
           "-a", "oneshot,auto", "-n", "3", "-w", "0", "-c", "0", "-G", "5", "--repeats", "2",
           "--min-sample-ms", "1", "--no-plot"]
    runs = [subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           env=env) for _ in range(2)]
    for proc in runs:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "-G 5 is ignored" in proc.stderr
        assert "results not checked (-c 0)" in proc.stdout
    folders = sorted(p for p in (tmp_path / "bench_results").iterdir())
    assert len(folders) == 2, folders
    for folder, proc in zip(folders, runs):
        assert f"# wrote {os.path.join('bench_results', folder.name, 'bench.json')}" in proc.stdout
        doc = json.loads((folder / "bench.json").read_text())
        assert doc["method"]["iters"] == 3 and doc["method"]["warmup"] == 0
        assert all(r["wrong"] is None and r["chain"] == 3 for r in doc["results"])
        # the row of what auto picks is marked, and auto ran that algorithm
        pick = doc["selection"]["picks"]["1024"]
        assert pick in ("oneshot", "twoshot", "psum")


def test_star_marks_what_auto_runs_never_an_unavailable_row():
    from jax_ar.tools import bench

    def row(algorithm, status="ok"):
        ok = status == "ok"
        return {"dtype": "float32", "op": "sum", "bytes": 1024, "count": 256,
                "algorithm": algorithm, "status": status, "time_us": 5.0 if ok else None,
                "algbw_gbps": 0.2 if ok else None, "busbw_gbps": 0.2 if ok else None,
                "wrong": 0, "speedup_vs_psum": None, "samples": [5.0] if ok else []}

    doc = {"date": "2026-12-01", "ranks": 17, "gpus": 0,
           "machine": {"platform": "cpu", "device_kind": "cpu", "world_size": 17, "cpu": "x",
                       "cpu_count": 2, "host": "h", "jax": "0", "jax_ar": "0",
                       "workspace_bytes": 8 << 20},
           "method": {"iters": 10, "launches": 2, "min_sample_s": 0.01, "repeats": 5,
                      "warmup": 1},
           "selection": {"table": "defaults", "picks": {"1024": "oneshot"}},
           "results": [row("oneshot", "n/a: jax_ar falls back to psum here"), row("psum")]}
    text = bench.format_table(doc)
    assert "oneshot*" not in text, text
    doc["selection"]["picks"]["1024"] = "psum"
    assert "psum*" in bench.format_table(doc)
    assert "# method: 10 calls chained per program (fewer where exact data" in text
    doc["method"].update(iters=300, chain_bytes=4 << 30, chain_least=20)
    assert ("# method: 300 calls chained per program (fewer where they would move more than "
            "4GB a rank, at least 20, and where exact data") in bench.format_table(doc)


def _doc(results, picks, samples=(5.0, 5.0, 5.0)):
    def row(algorithm, nbytes, dtype="bfloat16", op="rms_norm"):
        return {"dtype": dtype, "op": op, "bytes": nbytes, "count": nbytes // 2,
                "algorithm": algorithm, "status": "ok", "time_us": 5.0, "algbw_gbps": 0.2,
                "busbw_gbps": 0.2, "wrong": 0, "speedup_vs_psum": 1.0, "samples": list(samples)}

    return {"date": "2026-12-01", "ranks": 2, "gpus": 0,
            "machine": {"platform": "cpu", "device_kind": "cpu", "world_size": 2, "cpu": "x",
                        "cpu_count": 2, "host": "h", "jax": "0", "jax_ar": "0",
                        "workspace_bytes": 8 << 20},
            "method": {"iters": 10, "launches": 2, "min_sample_s": 0.01, "repeats": 5,
                       "warmup": 1},
            "selection": {"table": "defaults", "picks": picks},
            "results": [row(*r) for r in results]}


def test_table_is_aligned_and_marks_auto_at_every_size_for_rms_norm():
    from jax_ar.tools import bench

    variants = ("fused", "all_reduce+rms_norm", "psum+norm", "auto")
    sizes = (1024, 2048, 4096)
    doc = _doc([(v, b) for b in sizes for v in variants],
               {"bfloat16 1024": "all_reduce+rms_norm", "bfloat16 2048": "fused",
                "bfloat16 4096": "auto"})
    text = bench.format_table(doc)
    _assert_aligned(text)
    starred = [line.split()[4] for line in text.splitlines()
               if not line.startswith("#") and "*" in line]
    assert starred == ["all_reduce+rms_norm*", "fused*", "auto*"], text
    # The picked variant not timed (-a auto,psum+norm): the auto row is marked.
    doc = _doc([(v, 1024) for v in ("psum+norm", "auto")], {"bfloat16 1024": "fused"})
    assert "auto*" in bench.format_table(doc) and "psum+norm*" not in bench.format_table(doc)


def test_noisy_timing_warning_above_15_percent():
    from jax_ar.tools import bench

    quiet = _doc([("oneshot", 1024, "float32", "sum")], {"1024": "oneshot"},
                 samples=(9.0, 10.0, 11.0))  # (75th - 25th) / median = 10%
    noisy = _doc([("oneshot", 1024, "float32", "sum")], {"1024": "oneshot"},
                 samples=(8.0, 10.0, 12.0))  # 20%
    assert "WARNING: noisy timings" not in bench.format_table(quiet)
    assert "WARNING: noisy timings" in bench.format_table(noisy)


def test_cli_without_a_command_exits_2_with_a_hint():
    proc = subprocess.run([sys.executable, "-m", "jax_ar"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "python -m jax_ar bench" in proc.stderr
    version = subprocess.run([sys.executable, "-m", "jax_ar", "--version"], capture_output=True,
                             text=True, timeout=120)
    assert version.returncode == 0 and version.stdout.startswith(f"jax_ar {VERSION} (jax ")


@pytest.mark.parametrize("command", ["bench", "tune", "launch"])
def test_every_option_has_help(command):
    import importlib

    module = importlib.import_module(f"jax_ar.tools.{command}")
    parser = module.build_parser()
    missing = [a.dest for a in parser._actions if not a.help]
    assert not missing, f"{command}: no help for {missing}"


# --- bad input, stops and failures: what is measured is never lost ----------

MACHINE = {"platform": "cpu", "device_kind": "cpu", "world_size": 2, "processes": 2,
           "cpu": "x", "cpu_count": 2, "host": "h", "jax": "0", "jax_ar": VERSION,
           "workspace_bytes": 8 << 20, "capacity_bytes": {"oneshot": 2 << 20, "twoshot": 2 << 20},
           "serves_calls": True, "fallback_reason": None, "load_average": [1.0, 1.0, 1.0]}


def _row(algorithm, nbytes, us, dtype="float32", op="sum", samples=3, **extra):
    itemsize = data.DTYPES[dtype].itemsize
    row = {"dtype": dtype, "op": op, "count": nbytes // itemsize, "bytes": nbytes,
           "algorithm": algorithm, "chain": 10, "launches": 2, "status": "ok", "wrong": 0,
           "time_us": us, "time_us_ranks": [us, us], "samples": [us] * samples}
    row.update(extra)
    return row


def _bench_raw(samples=3):
    results = [_row(a, b, us, samples=samples) for b in (1024, 2048)
               for a, us in (("oneshot", 5.0), ("twoshot", 6.0), ("psum", 50.0))]
    return {"machine": dict(MACHINE), "results": results, "elapsed_s": 1.0,
            "selection": {"table": "defaults", "picks": {"1024": "oneshot", "2048": "oneshot"}}}


def _tune_raw():
    results = []
    for algorithm, slope in (("oneshot", 2.0), ("twoshot", 1.0), ("psum", 0.5)):
        results += [_row(algorithm, b, 5 + slope * b / 1024) for b in (1024, 2048, 4096, 8192)]
    for variant in ("fused_oneshot", "fused_twoshot", "all_reduce+rms_norm"):
        results += [_row(variant, b, 20 + b / 1024, dtype="bfloat16", op="rms_norm",
                         hidden=4096, tokens=b // 8192) for b in (8192, 16384)]
    return {"machine": dict(MACHINE), "results": results, "elapsed_s": 1.0,
            "selection": {"table": "defaults", "picks": {}}}


def _fake_sweep(monkeypatch, module, raw=None, error=None, seen=None):
    """Replaces the ranks: run_sweep returns `raw` (or raises `error`) and
    records its arguments in `seen`; with neither, a call fails the test."""
    def run_sweep(config, ranks, platform, timeout_s, progress_label="bench", env=None):
        if seen is not None:
            seen.update(config=config, env=env)
        if error is not None:
            raise error
        assert raw is not None, "no rank may start"
        return json.loads(json.dumps(raw))

    monkeypatch.setattr(module.sweep, "run_sweep", run_sweep)


def _usage_error(main, args, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_bench_writes_its_files_before_the_table_and_a_closed_stdout_loses_nothing(
        tmp_path, monkeypatch):
    """`bench ... | head -2`: the reader is gone before the table is printed;
    bench.json is written all the same, and there is no BrokenPipeError."""
    from jax_ar.tools import bench

    _fake_sweep(monkeypatch, bench, raw=_bench_raw())
    read, write = os.pipe()
    os.close(read)
    broken = os.fdopen(write, "w", buffering=1)  # each line written at once, as to a pipe
    monkeypatch.setattr(sys, "stdout", broken)
    try:
        rc = bench.main(["--platform", "cpu", "-e", "2K", "--no-plot",
                         "--out-dir", str(tmp_path / "out")])
    finally:
        monkeypatch.undo()
        try:
            broken.close()
        except OSError:
            pass
    assert rc == 0
    doc = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert len(doc["results"]) == 6 and "partial" not in doc


@pytest.mark.parametrize("where,message", [
    ("file", "exists and is not a folder"),
    ("file/below", "cannot write there"),
])
def test_bench_out_dir_that_cannot_be_made_is_a_usage_error_before_any_rank(
        tmp_path, monkeypatch, capsys, where, message):
    from jax_ar.tools import bench

    (tmp_path / "file").write_text("")
    _fake_sweep(monkeypatch, bench)
    line = _usage_error(bench.main, ["--platform", "cpu", "-e", "1K",
                                     "--out-dir", str(tmp_path / where)], capsys)
    assert f"--out-dir {tmp_path / where}" in line and message in line, line


@pytest.mark.parametrize("env,message", [
    ({"JAX_AR_ALGO": "bogus"}, "JAX_AR_ALGO must be one of"),
    ({"JAX_AR_TIMEOUT_S": "abc"}, "JAX_AR_TIMEOUT_S must be a number of seconds, got 'abc'"),
    ({"JAX_AR_TIMEOUT_S": "1e10"}, "JAX_AR_TIMEOUT_S must be a positive number of seconds, at "
                                   "most 1000000 (11.6 days), got 10000000000.0"),
    ({"JAX_AR_TIMEOUT_S": "nan"}, "JAX_AR_TIMEOUT_S must be a positive number of seconds"),
    ({"JAX_AR_TABLE": "/nonexistent/table.json"}, "table.json does not exist"),
    ({"JAX_AR_TABLE": None}, "table-cpu-cpu-n2.json cannot be read as JSON"),
])
def test_bench_settings_every_rank_would_reject_are_one_line_before_any_rank(
        tmp_path, monkeypatch, capsys, env, message):
    """JAX_AR_ALGO, JAX_AR_TIMEOUT_S and the table (JAX_AR_TABLE's file, or
    the tuned file in the cache, here not JSON): exit 2 and one line."""
    from jax_ar.tools import bench

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "jax_ar").mkdir()
    (tmp_path / "jax_ar" / "table-cpu-cpu-n2.json").write_text("not json")
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    _fake_sweep(monkeypatch, bench)
    line = _usage_error(bench.main, ["--platform", "cpu", "-e", "1K", "--out-dir",
                                     str(tmp_path / "out")], capsys)
    assert message in line, line
    assert not (tmp_path / "out").exists()
    # JAX_AR_TABLE=default: the shipped table, whatever the cache holds.
    monkeypatch.setenv("JAX_AR_TABLE", "default")
    monkeypatch.delenv("JAX_AR_ALGO", raising=False)
    monkeypatch.delenv("JAX_AR_TIMEOUT_S", raising=False)
    _fake_sweep(monkeypatch, bench, raw=_bench_raw())
    assert bench.main(["--platform", "cpu", "-e", "2K", "--no-plot", "--out-dir",
                       str(tmp_path / "out")]) == 0


def test_bench_stopped_half_way_writes_what_it_finished_marked_partial(tmp_path, monkeypatch,
                                                                       capsys):
    """--timeout (exit 124, as launch), a signal or a rank that died: the
    size groups that finished are in bench.json and the table, marked."""
    from jax_ar.tools import bench, sweep as _sweep

    raw = _bench_raw()
    raw["results"] = raw["results"][:3]
    raw.update(elapsed_s=None, partial={"cases_done": 3, "cases_planned": 6})
    error = _sweep.SweepError("jax_ar bench: stopped at --timeout 5 s (the sweep was not done): "
                              "ranks 0, 1 killed at the deadline", 124, raw)
    _fake_sweep(monkeypatch, bench, error=error)
    rc = bench.main(["--platform", "cpu", "-e", "2K", "--no-plot", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 124
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["partial"] == {"cases_done": 3, "cases_planned": 6, "reason": (
        "stopped at --timeout 5 s (the sweep was not done): ranks 0, 1 killed at the deadline")}
    assert len(doc["results"]) == 3
    assert "# PARTIAL: stopped at --timeout 5 s" in out and "3 of 6 cases" in out, out
    assert f"# wrote {tmp_path / 'bench.json'}" in out
    # Nothing finished: nothing to write, and the new folder goes again.
    _fake_sweep(monkeypatch, bench, error=_sweep.SweepStopped(2, "jax_ar bench: stopped"))
    assert bench.main(["--platform", "cpu", "-e", "2K", "--out-dir",
                       str(tmp_path / "new")]) == 130
    assert not (tmp_path / "new").exists()


def test_sweep_at_its_timeout_exits_124_keeps_finished_groups_and_shows_no_empty_logs(
        tmp_path, monkeypatch):
    from jax_ar.tools import sweep as _sweep
    from jax_ar.tools.relay import LaunchResult

    def launch(script, args, **kwargs):
        with open(args[0]) as f:
            config = json.load(f)
        with open(config["partial_out"], "w") as f:
            f.write(json.dumps({"machine": MACHINE, "table": "defaults"}) + "\n")
            f.write(json.dumps({"results": _bench_raw()["results"][:3],
                                "picks": {"1024": "oneshot"}}) + "\n")
            f.write('{"results": [')  # a line cut short by the kill: not read
        return LaunchResult([None, None], ["@@progress 0 6 1024 float32 sum x\n", ""], True)

    monkeypatch.setattr(_sweep.launch, "launch", launch)
    config = {"cases": [{}] * 6}
    with pytest.raises(_sweep.SweepError) as info:
        _sweep.run_sweep(config, 2, "cpu", 5.0)
    error = info.value
    assert error.exit_code == 124
    assert str(error) == ("jax_ar bench: stopped at --timeout 5 s (the sweep was not done): "
                          "ranks 0, 1 killed at the deadline")
    assert error.partial["partial"] == {"cases_done": 3, "cases_planned": 6}
    assert error.partial["selection"] == {"table": "defaults", "picks": {"1024": "oneshot"}}


def test_a_failed_rank_s_log_section_names_its_failure_as_the_summary_does(monkeypatch):
    """A rank that raised and was then killed while exiting has returncode
    -9; its log section says what the summary says (its own exit code)."""
    from jax_ar.tools import sweep as _sweep
    from jax_ar.tools.relay import LaunchResult

    what = "raised ValueError: no such thing, exit code 1"
    result = LaunchResult([-9, -15], ["Traceback ...\nValueError: no such thing\n", ""], False,
                          failures=[(0, what)], stopped=[1], exiting_with={0: 1})
    monkeypatch.setattr(_sweep.launch, "launch", lambda *a, **k: result)
    with pytest.raises(_sweep.SweepError) as info:
        _sweep.run_sweep({"cases": [{}]}, 2, "cpu", 5.0)
    text = str(info.value)
    assert f"----- rank 0 ({what}), last lines -----\nTraceback ...\nValueError: no such thing" \
        in text, text
    assert "-9" not in text and "rank 1 (" not in text, text


def _sweep_config():
    """bench's config of 2 sizes (groups) of oneshot and twoshot: 4 cases."""
    from jax_ar.tools import bench, sweep as _sweep

    ns = bench.build_parser().parse_args(["-e", "2K", "-a", "oneshot,twoshot", "--repeats", "1",
                                          "--min-sample-ms", "0", "-n", "1", "-w", "0"])
    config = bench.plan(ns, *_sweep.resolve_platform(PLATFORM[1]))
    config.pop("ranks")
    return config


def test_a_case_one_rank_cannot_set_up_is_a_row_and_no_rank_waits_for_it(monkeypatch):
    """Rank 1 cannot make case 1's data: every rank marks the row failed,
    saying why, before any launches it, and the sweep goes on."""
    from jax_ar.tools import sweep as _sweep

    monkeypatch.setattr(_sweep, "RANK_SCRIPT", os.path.join(
        os.path.dirname(__file__), "workers", "bench_rank_faults.py"))
    raw = _sweep.run_sweep(_sweep_config(), 2, "gpu" if ON_GPU else "cpu", 120,
                           env={"JAX_AR_TEST_FAULT": "prepare_fails:1"})
    results = raw["results"]
    assert [(r["bytes"], r["algorithm"]) for r in results] == [
        (1024, "oneshot"), (1024, "twoshot"), (2048, "oneshot"), (2048, "twoshot")]
    assert results[1]["status"] == ("failed: setting up the data: MemoryError: injected: rank 1 "
                                    "cannot hold case 1"), results[1]
    assert results[1]["time_us"] is None
    for r in results[:1] + results[2:]:
        assert r["status"] == "ok" and r["time_us"] > 0 and r["wrong"] == 0, r


def test_a_rank_that_fails_mid_sweep_keeps_the_groups_before(monkeypatch):
    from jax_ar.tools import sweep as _sweep

    monkeypatch.setattr(_sweep, "RANK_SCRIPT", os.path.join(
        os.path.dirname(__file__), "workers", "bench_rank_faults.py"))
    with pytest.raises(_sweep.SweepError) as info:
        _sweep.run_sweep(_sweep_config(), 2, "gpu" if ON_GPU else "cpu", 120,
                         env={"JAX_AR_TEST_FAULT": "group_raises:1"})
    error = info.value
    assert error.exit_code == 1 and "rank 1 failed" in str(error)
    assert "injected: rank 1 fails in size group 1" in str(error)
    assert error.partial["partial"] == {"cases_done": 2, "cases_planned": 4}
    assert [r["bytes"] for r in error.partial["results"]] == [1024] * 2
    assert all(r["status"] == "ok" for r in error.partial["results"])


def test_a_setting_the_ranks_reject_at_setup_is_one_line_exit_2():
    """What the host cannot check up front (a GPU's cached table: the file
    is named after the device kind only the ranks know) is one line too."""
    from jax_ar.tools import sweep as _sweep

    with pytest.raises(_sweep.SweepError) as info:
        _sweep.run_sweep(_sweep_config(), 2, "gpu" if ON_GPU else "cpu", 120,
                         env={"JAX_AR_ALGO": "bogus"})
    assert info.value.exit_code == 2 and info.value.partial is None
    assert str(info.value) == ("jax_ar bench: jax_ar: JAX_AR_ALGO must be one of ('auto', "
                               "'oneshot', 'twoshot', 'psum'), got 'bogus'")


@pytest.mark.skipif(ON_GPU, reason="CUDA reserves more address space than the limit leaves")
def test_bench_a_size_that_does_not_fit_in_memory_is_a_row_and_the_rest_is_kept(tmp_path):
    """The audit's B8: 16G per rank under a 4 GB address-space limit."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    env = dict(os.environ, JAX_AR_TIMEOUT_S="60")
    proc = subprocess.run([sys.executable, "-m", "jax_ar", "bench", "--platform", "cpu",
                           "-b", "1K", "-e", "16G", "-f", str(16 << 20), "-a", "oneshot",
                           "--repeats", "1", "--min-sample-ms", "0", "-n", "1", "-w", "0",
                           "--no-plot", "--out-dir", str(tmp_path)], capture_output=True,
                          text=True, timeout=300, env=env, preexec_fn=limit)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == \
        "jax_ar bench: FAILED: 1 case could not run (the table says why)"
    rows = [line.split() for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert rows[0][0] == "1024" and rows[0][5] != "failed:", proc.stdout
    assert rows[1][:6] == ["17179869184", "4294967296", "float32", "sum", "oneshot",
                           "failed:"], proc.stdout
    assert "MemoryError" in proc.stdout
    assert "1 cases timed, 0 not available, 1 failed" in proc.stdout
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert [r["status"] for r in doc["results"]][0] == "ok"


def test_with_fewer_than_3_samples_the_spread_is_not_estimated():
    from jax_ar.tools import bench
    from jax_ar.tools.timing import typical_spread

    doc = _doc([("oneshot", 1024, "float32", "sum")], {"1024": "oneshot"}, samples=(5.0, 9.0))
    assert typical_spread(doc["results"]) is None
    text = bench.format_table(doc)
    assert "# samples spread not estimated (it takes --repeats 3 or more)" in text, text
    assert "0%" not in text


@pytest.mark.parametrize("args,message", [
    (["-b", "1", "-e", "2"], "the sizes from -b to -e hold 0"),
    (["-b", "1K", "-e", "1K"], "the sizes from -b to -e hold 1"),
])
def test_tune_rejects_sizes_that_fit_no_curve(args, message, monkeypatch, capsys):
    from jax_ar.tools import tune

    _fake_sweep(monkeypatch, tune)
    assert message in _usage_error(tune.main, ["--platform", "cpu", *args], capsys)


@pytest.mark.parametrize("env", [{}, {"JAX_AR_ALGO": "bogus"}])
def test_tune_out_that_cannot_be_written_is_a_usage_error_before_any_rank(
        tmp_path, monkeypatch, capsys, env):
    from jax_ar.tools import tune

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "file").write_text("")
    _fake_sweep(monkeypatch, tune)
    # JAX_AR_ALGO plays no part in tune (its ranks run without it): a bad
    # one does not hide where the table cannot go.
    cases = [(str(tmp_path), "is a folder"),
             (str(tmp_path / "file" / "t.json"), "cannot write there")]
    for out, message in cases:
        line = _usage_error(tune.main, ["--platform", "cpu", "-e", "4K", "--out", out], capsys)
        assert message in line, line
    assert os.listdir(tmp_path) == ["file"]  # no temporary file left


def test_tune_ranks_read_no_table_and_jax_ar_table_names_the_new_file(tmp_path, monkeypatch,
                                                                       capsys):
    """JAX_AR_TABLE=<a file to be> tune: the ranks run on the shipped table
    (a missing or broken one must not stop them) and without JAX_AR_ALGO
    (which would make the pair's all-reduce its pick), the file is written."""
    from jax_ar.tools import tune

    path = tmp_path / "new.json"
    monkeypatch.setenv("JAX_AR_TABLE", str(path))
    monkeypatch.setenv("JAX_AR_ALGO", "psum")
    seen = {}
    _fake_sweep(monkeypatch, tune, raw=_tune_raw(), seen=seen)
    assert tune.main(["--platform", "cpu", "-e", "8K"]) == 0, capsys.readouterr()
    assert seen["env"] == {"JAX_AR_TABLE": "default", "JAX_AR_ALGO": ""}
    out, err = capsys.readouterr()
    assert f"# wrote {path}" in out
    assert "JAX_AR_ALGO=psum is ignored" in err, err
    _table.load_table(str(path), "cpu", "cpu", 2, VERSION)
    assert os.listdir(tmp_path) == ["new.json"]


def test_tune_checks_the_new_table_before_it_replaces_the_old_one(tmp_path, monkeypatch,
                                                                  capsys):
    from jax_ar.tools import tune

    path = tmp_path / "table.json"
    path.write_text("the old table")
    _fake_sweep(monkeypatch, tune, raw=_tune_raw())

    def reject(*args):
        raise _table.TableError(f"jax_ar: algorithm table {args[0]} has a malformed cost curve; "
                                "run `python -m jax_ar tune` to measure this machine")

    monkeypatch.setattr(tune, "load_table", reject)
    assert tune.main(["--platform", "cpu", "-e", "8K", "--out", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "the new table fails its check" in err and f"{path} left as it was" in err, err
    assert "run `python" not in err
    assert path.read_text() == "the old table" and os.listdir(tmp_path) == ["table.json"]

    def no_room(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tune.os, "replace", no_room)
    monkeypatch.setattr(tune, "load_table", _table.load_table)
    assert tune.main(["--platform", "cpu", "-e", "8K", "--out", str(path)]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        f"jax_ar tune: cannot write {path} (No space left on device); it was left as it was"
    assert path.read_text() == "the old table" and os.listdir(tmp_path) == ["table.json"]


def test_tune_stopped_half_way_writes_no_table_but_keeps_what_it_measured(tmp_path,
                                                                          monkeypatch, capsys):
    from jax_ar.tools import sweep as _sweep, tune

    raw = _tune_raw()
    raw["results"] = raw["results"][:5]
    raw.update(elapsed_s=None, partial={"cases_done": 5, "cases_planned": 18})
    _fake_sweep(monkeypatch, tune, error=_sweep.SweepStopped(
        15, "jax_ar tune: stopped by SIGTERM, forwarded to every rank", raw))
    path = tmp_path / "table.json"
    assert tune.main(["--platform", "cpu", "-e", "8K", "--out", str(path)]) == 128 + 15
    assert not path.exists()
    doc = json.loads((tmp_path / "table.partial.json").read_text())
    assert doc["schema"] == "jax_ar.tune_partial"
    assert doc["partial"]["reason"] == "stopped by SIGTERM, forwarded to every rank"
    assert len(doc["measurements"]["oneshot"]) == 4 and len(doc["measurements"]["twoshot"]) == 1
    assert "what was measured (5 of 18 cases)" in capsys.readouterr().err
    with pytest.raises(_table.TableError, match="is not a jax_ar algorithm table"):
        _table.load_table(str(tmp_path / "table.partial.json"), "cpu", "cpu", 2, VERSION)


def test_tune_replaces_a_broken_cached_table(tmp_path):
    """The audit's B4: the cache's table is not JSON, which is what tune is
    run to fix: its ranks do not read it, and it is replaced."""
    cached = tmp_path / "jax_ar" / "table-cpu-cpu-n2.json"
    cached.parent.mkdir()
    cached.write_text("not json")
    env = dict(os.environ, JAX_AR_TIMEOUT_S="60", XDG_CACHE_HOME=str(tmp_path))
    env.pop("JAX_AR_TABLE", None)
    proc = subprocess.run([sys.executable, "-m", "jax_ar", "tune", "--platform", "cpu",
                           "-b", "1K", "-e", "2K", "--repeats", "1", "--min-sample-ms", "0",
                           "-n", "1", "-w", "0"], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"# wrote {cached}" in proc.stdout
    _table.load_table(str(cached), "cpu", "cpu", 2, VERSION)
    assert os.listdir(cached.parent) == [cached.name]


def test_interleaved_benchmark_runs_as_the_docs_say(tmp_path):
    """benchmarks/interleaved.py, briefly, and interleaved_table.py on what
    it wrote; the docs' form of --bytes (1K,2K,...,1M) is what it takes."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "benchmarks"))
    try:
        import interleaved
    finally:
        sys.path.pop(0)
    assert interleaved.parse_sizes("1K,2K,...,1M") == [1024 << k for k in range(11)]
    assert interleaved.parse_sizes("2M,4M,...,64M") == [2 << 20 << k for k in range(6)]
    assert interleaved.parse_sizes("1K,...,4K") == [1024, 2048, 4096]
    for bad in ("1K,...,3K", "...,1K", "1K,..."):
        with pytest.raises(ValueError):
            interleaved.parse_sizes(bad)
    docs = open(os.path.join(root, "docs", "benchmarks.md")).read()
    for sizes in re.findall(r"benchmarks/interleaved\.py[^`]*?--bytes (\S+)", docs):
        assert interleaved.parse_sizes(sizes), sizes
    jsonl = tmp_path / "ab.jsonl"
    env = dict(os.environ, JAX_AR_TIMEOUT_S="60")
    proc = subprocess.run([sys.executable, "-m", "jax_ar", "launch", "-n", "2", *PLATFORM,
                           os.path.join(root, "benchmarks", "interleaved.py"),
                           "--bytes", "1K,...,2K", "--rounds", "2", "--iters", "2",
                           "--min-sample-ms", "1", "--json", str(jsonl)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [row["bytes"] for row in written] == [1024, 2048]
    # psum runs unless the ranks share a GPU, where NCCL refuses them
    shared = "share a GPU" in proc.stdout
    candidates = ["oneshot", "twoshot"] + ([] if shared else ["psum"])
    assert all(list(row["samples"]) == candidates for row in written), written
    table = subprocess.run([sys.executable, os.path.join(root, "benchmarks",
                                                         "interleaved_table.py"),
                            str(jsonl), "--ranks", "2"], capture_output=True, text=True,
                           timeout=120, env=env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    columns = " | ".join(f"{name} us" for name in candidates)
    assert lines[0] == (f"| size per rank | dtype | rounds | {columns} | "
                        "fastest by median | next / fastest | rounds won | auto picks |")
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| 1K", "| 2K"]
    # the docs' tables have these columns, psum's among them
    assert ("| size per rank | dtype | rounds | oneshot us | twoshot us | psum us | fastest by "
            "median | next / fastest | rounds won | auto picks |") in docs


def test_latency_table_shows_every_run_and_the_median_against_the_probe(tmp_path):
    """benchmarks/latency_table.py on an A/B in turn (main, variant, variant,
    main): each variant's runs in order, the ratio of their median to the
    probe's, and "wrong" for a run whose result was wrong."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = [("ll_floor", "ll_floor", 2, 4.0, None)]
    for variant, us in (("main", 4.6), ("seg1", 4.2), ("seg1", 4.5), ("main", 4.9)):
        rows.append(("all_reduce oneshot", variant, 2, us, None))
        rows.append(("all_reduce oneshot", variant, 4, us + 1, "wrong" if us == 4.5 else None))
    jsonl = tmp_path / "ab.jsonl"
    jsonl.write_text("".join(json.dumps({"case": case, "variant": variant, "commit": "c0ffee",
                                         "ranks": ranks, "bytes_per_rank": 65536,
                                         "us_per_call": us, **({"result": result} if result
                                                               else {})}) + "\n"
                             for case, variant, ranks, us, result in rows))
    proc = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "latency_table.py"),
                           str(jsonl)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "| us per call (x LL floor) | 2 ranks, 64 KB | 4 ranks, 64 KB |"
    assert lines[2] == "| LL floor probe | 4.00 |  |"
    # medians 4.75 and 4.35 over the probe's 4.0; no probe at 4 ranks
    assert lines[3] == "| main (c0ffee): all_reduce oneshot | 4.60 / 4.90 (1.19x) | 5.60 / 5.90 |"
    assert lines[4] == "| seg1 (c0ffee): all_reduce oneshot | 4.20 / 4.50 (1.09x) | wrong |"


def test_latency_table_keeps_hidden_sizes_apart_and_shows_the_fused_call_above_the_one_shot(
        tmp_path):
    """benchmarks/latency_table.py on fused cases of two hidden sizes, two
    runs of one tree after a job that timed the one-shot alone (as
    scripts/gpu_session.sh's standing does): a row per hidden size, and a
    second table with each run's fused call minus the one-shot all_reduce
    of the same run (the one-shot line just before it, not the lone job's);
    a tree without the one-shot leaves its cells empty."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = [{"case": "all_reduce oneshot", "us_per_call": 3.0}]
    for one_shot, h4096, h8192 in ((4.0, 4.9, 5.25), (4.5, 5.0, 5.0)):
        rows.append({"case": "all_reduce oneshot", "us_per_call": one_shot})
        rows.append({"case": "all_reduce_rms_norm oneshot", "norm_hidden": 4096,
                     "us_per_call": h4096})
        rows.append({"case": "all_reduce_rms_norm oneshot", "norm_hidden": 8192,
                     "us_per_call": h8192})
    rows.append({"case": "all_reduce_rms_norm twoshot", "norm_hidden": 4096, "us_per_call": 9.0,
                 "variant": "other"})
    jsonl = tmp_path / "fused.jsonl"
    jsonl.write_text("".join(json.dumps({"variant": "main", "commit": "c0ffee", "ranks": 2,
                                         "bytes_per_rank": 16384, **row}) + "\n"
                             for row in rows))
    proc = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "latency_table.py"),
                           str(jsonl)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[2:6] == [
        "| main (c0ffee): all_reduce oneshot | 3.00 / 4.00 / 4.50 |",
        "| main (c0ffee): all_reduce_rms_norm oneshot h4096 | 4.90 / 5.00 |",
        "| main (c0ffee): all_reduce_rms_norm oneshot h8192 | 5.25 / 5.00 |",
        "| other (c0ffee): all_reduce_rms_norm twoshot h4096 | 9.00 |"]
    assert lines[7] == ("| us above the one-shot all_reduce of the same bytes, run by run "
                        "| 2 ranks, 16 KB |")
    assert lines[9:] == ["| main (c0ffee): all_reduce_rms_norm oneshot h4096 | +0.90, +0.50 |",
                         "| main (c0ffee): all_reduce_rms_norm oneshot h8192 | +1.25, +0.50 |",
                         "| other (c0ffee): all_reduce_rms_norm twoshot h4096 |  |"]


def test_docs_name_every_option_of_bench_and_tune():
    from jax_ar.tools import bench, tune

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    docs = open(os.path.join(root, "docs", "benchmarks.md")).read()
    for module in (bench, tune):
        for action in module.build_parser()._actions:
            longs = [o for o in action.option_strings if o.startswith("--") and o != "--help"]
            assert not longs or any(f"`{o}" in docs or f"/{o}" in docs for o in longs), longs
