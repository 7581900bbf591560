"""experiments/pick.py: which kernel variant of a device A/B lands;
experiments/sass_size.py: the kernels' machine code, counted;
experiments/ptxas_use.py: two builds' registers and spills, kernel by kernel;
experiments/stamps.py: a stamped launch's timeline;
experiments/chain_drift.py: a chain of fused calls against bench's
emulation, call by call; and experiments/pack_out.sh: a device command's
$OUT down to the eight files that come back."""
import importlib.util
import json
import os
import subprocess
import sys

from harness import runs_on

pytestmark = runs_on("cpu", "gpu")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FUSED = "all_reduce_rms_norm oneshot"


def ab_lines(trees):
    """JSON lines of an A/B in turn: trees = {variant: {(ranks, kb): [us per pass]}}."""
    lines = []
    for variant, cells in trees.items():
        for (ranks, kb), passes in cells.items():
            for us in passes:
                lines.append({"variant": variant, "case": FUSED, "ranks": ranks,
                              "bytes_per_rank": kb * 1024, "norm_hidden": 4096,
                              "us_per_call": us, "result": "ok"})
                lines.append({"variant": variant, "case": "all_reduce oneshot", "ranks": ranks,
                              "bytes_per_rank": kb * 1024, "us_per_call": us - 1.0,
                              "result": "ok"})
    return lines


def run_pick(tmp_path, lines, *args):
    path = tmp_path / "ab.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "pick.py"),
                           str(path), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


MAIN = {(2, 16): [4.9, 5.0], (4, 256): [11.5, 11.4], (8, 256): [34.2, 34.1]}


def test_pick_lands_the_variant_faster_at_4_and_8_ranks_from_the_faster_passes(tmp_path):
    # fast: 0.3 and 0.5 us faster at 4 and 8 ranks (best passes), even at 2;
    # slower: 0.2 us faster at 4 and 8 ranks in its better passes, whatever
    # its other passes took
    fast = {(2, 16): [4.9, 4.95], (4, 256): [11.1, 11.2], (8, 256): [33.6, 33.9]}
    slower = {(2, 16): [4.95, 5.2], (4, 256): [11.2, 11.9], (8, 256): [33.9, 35.0]}
    lines = run_pick(tmp_path, ab_lines({"main": MAIN, "fast": fast, "slower": slower}))
    assert lines[-1] == "fast"
    assert lines[0].startswith("fast: mean gain at 4 and 8 ranks +0.40 us, worst cell +0.00")
    assert lines[1].startswith("slower: mean gain at 4 and 8 ranks +0.20 us, worst cell -0.05")
    # a diagnostic left out of the candidates never lands
    assert run_pick(tmp_path, ab_lines({"main": MAIN, "fast": fast, "slower": slower}),
                    "--candidates", "slower")[-1] == "slower"


def test_pick_refuses_a_loss_at_2_ranks_a_wrong_result_and_a_missing_cell(tmp_path):
    loses_at_2 = {(2, 16): [5.05, 5.1], (4, 256): [10.4, 10.5], (8, 256): [33.0, 33.1]}
    assert run_pick(tmp_path, ab_lines({"main": MAIN, "v": loses_at_2}))[-1] == "none"
    wrong = ab_lines({"main": MAIN, "v": {(2, 16): [4.0], (4, 256): [10.0], (8, 256): [30.0]}})
    wrong[-1]["result"] = "wrong"
    report = run_pick(tmp_path, wrong)
    assert report == ["v: a result of the run was wrong", "none"]
    partial = ab_lines({"main": MAIN, "v": {(2, 16): [4.0], (4, 256): [10.0]}})
    assert run_pick(tmp_path, partial) == ["v: not every cell of main was measured", "none"]


def test_pick_keeps_hidden_sizes_apart(tmp_path):
    lines = ab_lines({"main": MAIN, "v": {(2, 16): [4.9], (4, 256): [11.0], (8, 256): [33.0]}})
    # v's only line at hidden 8192 would be a cell main lacks: left out, not compared
    lines.append(dict(lines[-2], norm_hidden=8192, us_per_call=1.0))
    report = run_pick(tmp_path, lines)
    assert report[-1] == "v" and "h8192" not in report[0]


def load_experiment(name):
    """experiments/<name>.py as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(ROOT, "experiments", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Two builds' kernels as `cuobjdump -sass` prints them (abridged): the
# anonymous namespace's hash differs between builds.
SASS = """
\tcode for sm_90
\t\tFunction : _ZN6jax_ar3gpu63_GLOBAL__N__3ee9ed3c_30_all_reduce_rms_norm_kernels_cu_b229bf0a20OneShotRmsNormKernelILb0EEEvv
\t.headerflags\t@"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                  /* 0x00000a00ff017b82 */
        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;           /* 0x0000000000007b1d */
        /*0020*/              @!P0 DADD R4, R4, R6 ;                       /* 0x0000000604048229 */
        /*0030*/                   BAR.RED.AND.DEFER_BLOCKING 0x0, P4 ;    /* 0x0000000000007b1d */
        /*0040*/                   MEMBAR.SC.SYS ;                         /* 0x0000000000007992 */
        /*0050*/                   CALL.REL.NOINC 0xa6e0 ;                 /* 0x0000007c00487944 */
        /*0060*/                   DFMA R4, R4, R4, R6 ;                   /* 0x0000000604047229 */
        /*0070*/                   EXIT ;                                  /* 0x000000000000794d */
\t\t..........
\t\tFunction : _ZN6jax_ar3gpu63_GLOBAL__N__9f00aa11_30_all_reduce_rms_norm_kernels_cu_01c2d3e413TwoShotKernelEv
        /*0000*/                   EXIT ;                                  /* 0x000000000000794d */
\t\tFunction : _ZN6jax_ar3gpu44_GLOBAL__N__7bb856bc_11_rms_norm_cu_kRmsNorm13RmsNormKernelEv
        /*0000*/                   EXIT ;                                  /* 0x000000000000794d */
"""


def test_sass_size_counts_each_kernel_and_drops_the_build_hash():
    counts = load_experiment("sass_size").kernel_counts(SASS)
    assert counts == {
        "_ZN6jax_ar3gpu20OneShotRmsNormKernelILb0EEEvv":
            {"instructions": 8, "barriers": 2, "double": 2, "calls": 1},
        "_ZN6jax_ar3gpu13TwoShotKernelEv": {"instructions": 1},
        "_ZN6jax_ar3gpu13RmsNormKernelEv": {"instructions": 1},
    }


def ptxas_log(build_hash, one_spill):
    """What `-Xptxas -v` prints for two kernels of one file (abridged): each
    kernel's own frame line, then a called function's."""
    lines = []
    for kernel, spill in (("9OneKernelEv", one_spill), ("9TwoKernelEv", 0)):
        name = f"_ZN6jax_ar3gpu46_GLOBAL__N__{build_hash}_11_rms_norm_cu_1234abcd{kernel}"
        lines += [
            f"ptxas info    : Compiling entry function '{name}' for 'sm_90'",
            f"ptxas info    : Function properties for {name}",
            f"    48 bytes stack frame, {spill} bytes spill stores, {spill // 2} bytes spill loads",
            "ptxas info    : Used 128 registers, used 1 barriers, 48 bytes cumulative stack size",
            "ptxas info    : Compile time = 95.1 ms",
            "ptxas info    : Function properties for _ZN6jax_ar3gpu6Waiter5CheckEi",
            "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
        ]
    return "\n".join(lines) + "\n"


def test_ptxas_use_reports_each_kernels_own_spills_across_builds(tmp_path):
    # The two builds differ in the namespace's hash and in OneKernel's spills;
    # the callee's zero-spill line after each kernel's own is not the kernel's.
    (tmp_path / "a.log").write_text(ptxas_log("0f1e2d3c", 24))
    (tmp_path / "b.log").write_text(ptxas_log("9a8b7c6d", 80))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "ptxas_use.py"),
                           str(tmp_path / "a.log"), str(tmp_path / "b.log")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "OneKernel" in lines[0]
    assert lines[1].endswith("a.log: 128 registers, 48 B frame, spill 24 / 12 B")
    assert lines[2].endswith("b.log: 128 registers, 48 B frame, spill 80 / 40 B")
    assert lines[3:] == ["1 of 2 kernels differ"]


def test_stamps_reads_each_block_from_its_earliest_start():
    # Two stamped blocks of the fused kernel at 2 ranks (rank 0 block 0, rank
    # 1 block 0), two warps each; the all_reduce's warp never reached t3.
    log = [
        "===== fstamp, 2 ranks (06:00:00): --bytes 512K",
        "[rank 0] stamp fused rank 0 launch 4000 block 0 warp 0 of 2 bytes 524288: "
        "1000 1100 1900 2300 2350 2400",
        "[rank 0] stamp fused rank 0 launch 4000 block 0 warp 1 of 2 bytes 524288: "
        "1010 1200 2000 2310 2360 2420",
        "[rank 1] stamp fused rank 1 launch 4000 block 0 warp 0 of 2 bytes 524288: "
        "50 150 750 1150 1200 1250",
        "[rank 1] stamp fused rank 1 launch 4000 block 0 warp 1 of 2 bytes 524288: "
        "60 260 850 1160 1210 1270",
        "[rank 0] per call: something else",
        "[rank 0] stamp all_reduce rank 0 launch 4000 block 1 warp 0 of 1 bytes 524288: "
        "500 600 900 0 950 1000",
        # tstamp's line for a turn: t1 to t3 are the turn's
        "[rank 0] stamp fused_t1 rank 0 launch 4000 block 0 warp 0 of 1 bytes 524288: "
        "1000 1700 2100 2250 2350 2400",
    ]
    stamps = load_experiment("stamps")
    table = stamps.summarize(stamps.read_blocks(log))
    count, fused = table[("fstamp", 2, "fused", 524288)]
    # rank 0: sent 200, first in 900, last in 1000, summed 1310, end 1420, tail 420;
    # rank 1: 210, 700, 800, 1110, 1220, 420; medians of the two
    assert count == 2
    assert fused == {"sent": 205, "first in": 800, "last in": 900, "summed": 1210,
                     "end": 1320, "tail": 420}
    count, all_reduce = table[("fstamp", 2, "all_reduce", 524288)]
    assert count == 1 and all_reduce["last in"] == 400 and all_reduce["tail"] == 100
    assert all_reduce["summed"] != all_reduce["summed"]  # NaN: never reached
    count, turn = table[("fstamp", 2, "fused_t1", 524288)]
    assert count == 1 and turn["sent"] == 700 and turn["last in"] == 1100
    assert turn["summed"] == 1250 and turn["tail"] == 300


def test_stamps_turns_are_each_warps_own():
    # tstamp's turn lines of one fused block, two warps that started their
    # turns apart; t1 start, t2 last packet in, t3 row sum, t5 the launch's end.
    def line(turn, warp, t):
        return (f"[rank 0] stamp fused_t{turn} rank 0 launch 4000 block 0 warp {warp} of 2 "
                f"bytes 1048576: " + " ".join(str(v) for v in t))
    log = [
        "===== tstamp, 2 ranks (06:00:00): --bytes 1M",
        line(0, 0, [0, 100, 300, 400, 900, 1000]),
        line(1, 0, [0, 500, 800, 850, 900, 1000]),
        line(0, 1, [0, 200, 600, 650, 900, 1100]),
        line(1, 1, [0, 700, 760, 1000, 900, 1100]),
        # a turn whose row sum was never stamped: left out
        line(2, 1, [0, 1050, 1060, 0, 900, 1100]),
    ]
    spans = load_experiment("stamps").warp_turns(log)
    # warp 0: turn 0 200 / 100 / 100 (to turn 1's start), turn 1 300 / 50 / 150 (to the end);
    # warp 1: turn 0 400 / 50 / 50, turn 1 60 / 240 / 50 (to turn 2's start, 1050)
    assert spans[("tstamp", 2, "fused", 1048576, 0)] == (300, 75, 75)
    assert spans[("tstamp", 2, "fused", 1048576, 1)] == (180, 145, 100)
    assert ("tstamp", 2, "fused", 1048576, 2) not in spans


def test_chain_drift_follows_the_chain_call_by_call(tmp_path):
    """experiments/chain_drift.py in two ranks, a few calls: each variant's
    outputs against bench_data's emulation after as many calls, none of
    them off the tolerance, and one JSON line for every call where a
    variant differs from it at all."""
    out = tmp_path / "drift.jsonl"
    env = dict(os.environ, JAX_AR_TIMEOUT_S="60")
    proc = subprocess.run(
        [sys.executable, "-m", "jax_ar", "launch", "-n", "2", "--timeout", "240",
         os.path.join(ROOT, "experiments", "chain_drift.py"), "--hidden", "256", "--bytes", "8K",
         "--chain", "4", "--variants", "fused_twoshot,pair", "--json", str(out)],
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for variant in ("fused_twoshot", "pair"):
        assert f"{variant}: first call off the tolerance: none of 4" in proc.stdout, proc.stdout
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(line["off_out"] == line["off_residual"] == 0 and line["differ"] > 0
               and 1 <= line["call"] <= 4 for line in lines), lines


def run_pack_out(out, *names):
    return subprocess.run(["bash", os.path.join(ROOT, "experiments", "pack_out.sh"), str(out),
                           *names], capture_output=True, text=True, timeout=60)


def test_pack_out_keeps_the_named_files_and_packs_the_rest_whole(tmp_path):
    import tarfile
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "rank0.log").write_text("rank 0\n")
    for name in ("summary.txt", "bench.log", "results.tar.gz", "standing.jsonl"):
        (out / name).write_text(name + "\n")
    proc = run_pack_out(out, "summary.txt", "standing.jsonl", "absent.txt")
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out)) == ["rest.tgz", "standing.jsonl", "summary.txt"]
    assert (out / "summary.txt").read_text() == "summary.txt\n"
    with tarfile.open(out / "rest.tgz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert {"bench.log", "results.tar.gz", "logs/rank0.log"} <= set(members)
        assert tar.extractfile(members["logs/rank0.log"]).read() == b"rank 0\n"


def test_pack_out_leaves_a_folder_alone_when_eight_would_not_hold_it(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    names = [f"f{i}.txt" for i in range(8)]
    for name in names + ["extra.log"]:
        (out / name).write_text(name)
    proc = run_pack_out(out, *names)
    assert proc.returncode == 2 and "more than 8" in proc.stderr
    assert sorted(os.listdir(out)) == sorted(names + ["extra.log"])
    assert run_pack_out(out, *names, "extra.log").returncode == 0  # nothing to pack
