"""Algorithm selection: the cost model, tables on disk, tune's fit, overrides.

The first tests are pure Python (no devices); test_overrides_and_logging
traces real all_reduce calls in one process with CPU devices.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from harness import ON_GPU, run_ranks, runs_on


from jax_ar import _native, selection
from jax_ar.selection import table as _table
from jax_ar import __version__ as VERSION
from jax_ar.tools.tune import fit_curve

pytestmark = runs_on("cpu", "gpu")

SIZES = [1 << k for k in range(0, 31)]  # 1 B .. 1 GiB


@pytest.fixture(autouse=True)
def isolated_tables(tmp_path, monkeypatch):
    """No user table leaks in: an empty cache directory, no JAX_AR_TABLE."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("JAX_AR_TABLE", raising=False)
    selection.clear_cache()
    yield
    selection.clear_cache()


def capacity_of(world, workspace=64 << 20, platform="cpu"):
    """What one round carries, from the compiled module's own layout (the
    GPU one when it was built, as in CI; else the CPU one)."""
    module = _native.cpu
    if platform == "gpu":
        try:
            from jax_ar import _jax_ar_cuda as module
        except ImportError:
            pass
    capacities = module.capacities(workspace, world)
    return lambda a: capacities.get(a)  # twoshot_ll: the CUDA module's only


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
@pytest.mark.parametrize("world", [2, 3, 4, 8, 16])
def test_predictions_monotone_and_choice_deterministic(platform, world):
    table = selection.table_for(platform, None, world)
    assert table.source.startswith("defaults")
    for capacity in (None, capacity_of(world, platform=platform)):
        previous = {a: 0.0 for a in selection.candidates_for(platform)}
        for size in SIZES:
            predicted = selection.predict_all(table, size, capacity)
            for a, t in predicted.items():
                assert t >= previous[a] - 1e-9, (a, size, t, previous[a])
            previous = predicted
        choices = [selection.choose_algorithm(platform, world, s, capacity_bytes=capacity)
                   for s in SIZES]
        selection.clear_cache()
        again = [selection.choose_algorithm(platform, world, s, capacity_bytes=capacity)
                 for s in SIZES]
        assert choices == again
    # With the workspace's rounds, the largest messages go to NCCL where it
    # can run (every round of a kernel costs its latency again).
    if platform == "gpu":
        capacity = capacity_of(world, platform="gpu")
        picks = [selection.choose_algorithm("gpu", world, s, capacity_bytes=capacity)
                 for s in SIZES]
        assert picks[0] == "oneshot" and picks[-1] == "psum", picks


# What the shipped GPU curves of all_reduce's kernels must choose where psum
# cannot run (ranks sharing a GPU): the fastest kernel as measured per call
# at each world size (2, 4 and 8 ranks on one H200, 2026-12-04 and, for the
# plain two-shot, 2026-12-03, defaults.py; 512 KB and 1 MB: the one-shot in
# two or three rounds at 4 and 8 ranks). One exception: at 2 ranks and
# 4190208 bytes the plain two-shot was measured fastest (18.4 us against
# the one-shot's 24.3), but its curve there follows its NVLink line (29.5
# us), which ranks sharing one GPU cannot measure.
_KERNEL_SIZES = (1024, 4096, 16384, 65536, 131072, 262144, 524288, 1048576, 2095104, 4190208)
_MEASURED_FASTEST_KERNEL = {
    2: ("oneshot",) * 10,
    4: ("oneshot",) * 5 + ("twoshot_ll",) * 3 + ("twoshot",) * 2,
    8: ("oneshot",) * 4 + ("twoshot_ll",) * 4 + ("twoshot",) * 2,
}


@pytest.mark.parametrize("world", [2, 4, 8])
def test_gpu_kernel_defaults_reproduce_the_measured_choice(world):
    capacity = capacity_of(world, platform="gpu")
    kernels = selection.candidates_for("gpu", "auto", psum=False)
    for nbytes, fastest in zip(_KERNEL_SIZES, _MEASURED_FASTEST_KERNEL[world]):
        pick = selection.choose_algorithm("gpu", world, nbytes, capacity_bytes=capacity,
                                          candidates=kernels)
        assert pick == fastest, (nbytes, pick)


@pytest.mark.parametrize("world", [2, 4, 8, 16])
def test_two_shot_kernel_is_what_the_cuda_handler_runs(world):
    """The plan names the kernel the CUDA handler runs: algorithm="twoshot"
    is the two-shot over LL packets for small messages and the plain
    two-shot for large ones, switching once (above 512 KB, at most at 2 MB
    per call); CPU devices have the plain kernel only."""
    capacity = capacity_of(world, platform="gpu")
    two_shot = selection.candidates_for("gpu", "twoshot")
    assert two_shot == ("twoshot_ll", "twoshot")
    picks = [selection.choose_algorithm("gpu", world, nbytes, capacity_bytes=capacity,
                                        candidates=two_shot) for nbytes in SIZES]
    switch = picks.index("twoshot")
    assert set(picks[:switch]) == {"twoshot_ll"} and set(picks[switch:]) == {"twoshot"}, picks
    assert (1 << 19) < SIZES[switch] <= (1 << 21), (world, SIZES[switch])
    assert selection.candidates_for("cpu", "twoshot") == ("twoshot",)
    assert "twoshot_ll" not in selection.candidates_for("cpu")
    assert _native.ALGORITHM_CODES["twoshot_ll"] == 3


def test_rounds_are_predicted_as_full_rounds_plus_the_rest():
    table = selection.default_table("gpu", "NVIDIA H200", 8)
    cap = 1 << 20
    one = table.round_us("oneshot", cap)
    assert selection.predict_us(table, "oneshot", 3 * cap + 16, cap) == pytest.approx(
        3 * one + table.round_us("oneshot", 16))
    assert selection.predict_us(table, "oneshot", 2 * cap, cap) == pytest.approx(2 * one)
    # psum has no workspace: never rounds.
    assert selection.predict_us(table, "psum", 3 * cap, cap) == table.round_us("psum", 3 * cap)


def write(path, doc):
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return str(path)


def valid_doc(platform="cpu", kind="cpu", world=2, **changes):
    table = selection.default_table(platform, kind, world)
    doc = _table.table_to_json(table, VERSION, {"note": "kept, ignored"})
    doc.update(changes)
    return doc


def test_table_round_trip_and_lookup_order(tmp_path, monkeypatch):
    # A table that makes psum the cheapest at every size.
    doc = valid_doc()
    doc["algorithms"]["psum"] = [{"up_to_bytes": None, "latency_us": 0.0, "us_per_mb": 0.0}]
    cache_file = _table.table_path("cpu", "cpu", 2)
    os.makedirs(os.path.dirname(cache_file))
    write(type(tmp_path)(cache_file), doc)
    assert selection.table_for("cpu", "cpu", 2).source == cache_file
    assert selection.choose_algorithm("cpu", 2, 4096, device_kind="cpu") == "psum"
    # Another world size has no file: defaults.
    assert selection.table_for("cpu", "cpu", 4).source.startswith("defaults")
    # JAX_AR_TABLE names a file, or forces the defaults over the cache.
    doc["algorithms"]["psum"] = [{"up_to_bytes": None, "latency_us": 1e9, "us_per_mb": 0.0}]
    other = write(tmp_path / "mine.json", doc)
    monkeypatch.setenv("JAX_AR_TABLE", other)
    assert selection.table_for("cpu", "cpu", 2).source == other
    assert selection.choose_algorithm("cpu", 2, 4096, device_kind="cpu") != "psum"
    monkeypatch.setenv("JAX_AR_TABLE", "default")
    assert selection.table_for("cpu", "cpu", 2).source.startswith("defaults")


def bad_segments(**segment):
    doc = valid_doc()
    doc["algorithms"]["twoshot"] = segment.pop("curve")
    return doc


BAD_TABLES = {
    "not json": ("{not json", "cannot be read as JSON"),
    "not a table": ({"hello": 1}, "not a jax_ar algorithm table"),
    "schema version": (valid_doc(schema_version=99), "schema_version=99"),
    "jax_ar version": (valid_doc(jax_ar_version="0.0.1"), "jax_ar_version='0.0.1'"),
    "device kind": (valid_doc(device_kind="NVIDIA H100 80GB HBM3"), "device_kind="),
    "world size": (valid_doc(world_size=8), "world_size=8"),
    "platform": (valid_doc(platform="gpu"), "platform='gpu'"),
    "missing algorithm": ({**valid_doc(), "algorithms": {"oneshot": [], "psum": []}},
                         "exactly ['oneshot', 'twoshot', 'psum', 'fused_oneshot'"),
    "schema 1 with norm curves": (valid_doc(schema_version=1),
                                  "exactly ['oneshot', 'twoshot', 'psum'] (schema 1)"),
    "schema version type": (valid_doc(schema_version="2"), "schema_version='2'"),
    "negative slope": (bad_segments(curve=[
        {"up_to_bytes": None, "latency_us": 1.0, "us_per_mb": -1.0}]), "must not be negative"),
    "open middle": (bad_segments(curve=[
        {"up_to_bytes": None, "latency_us": 1.0, "us_per_mb": 1.0},
        {"up_to_bytes": None, "latency_us": 1.0, "us_per_mb": 1.0}]), "must be an integer"),
    "closed end": (bad_segments(curve=[
        {"up_to_bytes": 100, "latency_us": 1.0, "us_per_mb": 1.0}]), "up_to_bytes null"),
    "decreasing ends": (bad_segments(curve=[
        {"up_to_bytes": 100, "latency_us": 1.0, "us_per_mb": 1.0},
        {"up_to_bytes": 50, "latency_us": 1.0, "us_per_mb": 1.0},
        {"up_to_bytes": None, "latency_us": 1.0, "us_per_mb": 1.0}]), "above 100"),
    "nan": (bad_segments(curve=[
        {"up_to_bytes": None, "latency_us": float("nan"), "us_per_mb": 1.0}]), "finite"),
    "negative time": (bad_segments(curve=[
        {"up_to_bytes": None, "latency_us": -5.0, "us_per_mb": 1.0}]), "negative time"),
    # What json or float() cannot take is a TableError too, not a crash.
    "integer beyond any float": (bad_segments(curve=[
        {"up_to_bytes": None, "latency_us": 10 ** 400, "us_per_mb": 1.0}]),
        "latency_us must be a finite number, got 1000"),
    "integer of 5000 digits": ('{"schema": "jax_ar.algorithm_table", "x": ' + "9" * 5000 + "}",
                               "integer of too many digits"),
    "deep nesting": ("[" * 100000 + "]" * 100000, "nest too deeply"),
    "size beyond int64": (bad_segments(curve=[
        {"up_to_bytes": 10 ** 400, "latency_us": 1.0, "us_per_mb": 1.0},
        {"up_to_bytes": None, "latency_us": 1.0, "us_per_mb": 1.0}]), "at most 2**63 - 1"),
    "time beyond any float": (bad_segments(curve=[
        {"up_to_bytes": 1 << 62, "latency_us": 1e308, "us_per_mb": 1e308},
        {"up_to_bytes": None, "latency_us": 1.0, "us_per_mb": 1.0}]), "beyond any float"),
    "extra field": (bad_segments(curve=[
        {"up_to_bytes": None, "latency_us": 1.0, "us_per_mb": 1.0, "x": 1}]), "exactly"),
}


@pytest.mark.parametrize("case", list(BAD_TABLES))
def test_bad_table_is_rejected_naming_the_file(case, tmp_path, monkeypatch):
    doc, message = BAD_TABLES[case]
    path = write(tmp_path / "table.json", doc)
    monkeypatch.setenv("JAX_AR_TABLE", path)
    with pytest.raises(_table.TableError) as info:
        selection.choose_algorithm("cpu", 2, 1024, device_kind="cpu")
    assert path in str(info.value) and message in str(info.value), str(info.value)
    # Never silently replaced by the defaults on a later call either.
    with pytest.raises(_table.TableError):
        selection.table_for("cpu", "cpu", 2)


def test_negative_intercept_of_a_later_segment_is_accepted(tmp_path, monkeypatch):
    """latency_us is a segment's intercept: a later segment's may be negative
    (tune's fit makes such lines) while its predictions are not."""
    doc = bad_segments(curve=[
        {"up_to_bytes": 1 << 20, "latency_us": 5.0, "us_per_mb": 1.0},
        {"up_to_bytes": None, "latency_us": -50.0, "us_per_mb": 60.0}])
    monkeypatch.setenv("JAX_AR_TABLE", write(tmp_path / "table.json", doc))
    table = selection.table_for("cpu", "cpu", 2)
    assert table.round_us("twoshot", 1 << 20) > 0 and table.round_us("twoshot", 1 << 30) > 0


def test_error_messages_cut_long_values_short(tmp_path, monkeypatch):
    doc = bad_segments(curve=[
        {"up_to_bytes": None, "latency_us": 10 ** 4000, "us_per_mb": 1.0}])
    monkeypatch.setenv("JAX_AR_TABLE", write(tmp_path / "table.json", doc))
    with pytest.raises(_table.TableError) as info:
        selection.table_for("cpu", "cpu", 2)
    assert "(4001 characters)" in str(info.value) and len(str(info.value)) < 600, info.value


def test_schema_1_table_loads_with_default_norm_curves(tmp_path, monkeypatch):
    """A table tuned before the norm paths were selected keeps serving its
    all-reduce curves; the norm paths take the shipped defaults."""
    doc = valid_doc(schema_version=1)
    for name in _table.NORM_PATHS:
        del doc["algorithms"][name]
    doc["algorithms"]["psum"] = [{"up_to_bytes": None, "latency_us": 0.0, "us_per_mb": 0.0}]
    path = write(tmp_path / "old.json", doc)
    monkeypatch.setenv("JAX_AR_TABLE", path)
    table = selection.table_for("cpu", "cpu", 2)
    assert table.source.startswith(path) and "fused_oneshot" in table.source, table.source
    assert selection.choose_algorithm("cpu", 2, 4096, device_kind="cpu") == "psum"
    defaults = selection.default_table("cpu", "cpu", 2)
    for name in _table.NORM_PATHS:
        assert table.curves[name] == defaults.curves[name]


# What the shipped GPU curves of all_reduce_rms_norm's paths must choose:
# the fastest path as measured per call at each world size (2, 4 and 8
# ranks on one H100, 2026-12-05, up to 512 KB; on one H200, 2026-12-05 at
# 1 MB, 2026-12-04 at 2 MB and 2026-12-03 beyond; defaults.py): K = 1024 bytes of x per
# rank. The fused two-shot was measured at hidden 4096 and 8192, and its
# curve takes the slower from 16 KB to 2 MB; at 8 ranks and 256 KB the
# pair (20.60 us) and the two-shot (20.68 and 20.92) tied. At 1 MB, one
# H200 with the LL two-shot up to 2 MB (fllmax): the two-shot fastest at
# 2, 4 and 8 ranks.
_MEASURED_BEST = {
    2: {16: "fused_oneshot", 256: "fused_oneshot", 512: "fused_oneshot", 1024: "fused_twoshot",
        2048: "fused_twoshot", 4096: "fused_twoshot", 8192: "composed", 32768: "composed"},
    4: {16: "fused_oneshot", 128: "fused_oneshot", 256: "fused_oneshot", 512: "fused_twoshot",
        1024: "fused_twoshot", 2048: "fused_twoshot", 4096: "fused_twoshot", 8192: "composed",
        32768: "composed"},
    8: {16: "fused_oneshot", 64: "fused_oneshot", 128: "composed", 256: "composed",
        512: "fused_twoshot", 1024: "fused_twoshot", 2048: "fused_twoshot", 4096: "fused_twoshot",
        8192: "composed", 32768: "composed"},
}


@pytest.mark.parametrize("world", [2, 4, 8])
def test_gpu_norm_defaults_reproduce_the_measured_choice(world):
    """The shipped GPU curves choose, at each world size measured, the path
    that was fastest there; every path's prediction grows with the size."""
    table = selection.default_table("gpu", "NVIDIA H200", world)
    def best(nbytes):
        return min(selection.NORM_PATHS, key=lambda p: table.call_us(p, nbytes))
    for kib, path in _MEASURED_BEST[world].items():
        assert best(kib << 10) == path, (world, kib)
    assert best(64 << 20) == "composed"
    for path in selection.NORM_PATHS:
        times = [table.call_us(path, s) for s in SIZES]
        assert all(b >= a for a, b in zip(times, times[1:])), path
    # What the file form keeps is what load_table reads back.
    for path in selection.NORM_PATHS:
        _table._parse_curve(_table.table_to_json(table, VERSION)["algorithms"][path])


def test_gpu_norm_defaults_between_and_beyond_the_measured_world_sizes():
    """World sizes not measured lie between their measured neighbours at
    every size (never cheaper with more ranks), and beyond 8 grow with n."""
    tables = {n: selection.default_table("gpu", "NVIDIA H200", n) for n in range(2, 17)}
    for path in selection.NORM_PATHS:
        for nbytes in SIZES:
            times = [tables[n].call_us(path, nbytes) for n in range(2, 17)]
            assert all(b >= a for a, b in zip(times, times[1:])), (path, nbytes)
    assert tables[6].call_us("fused_oneshot", 256 << 10) == pytest.approx(
        (tables[4].call_us("fused_oneshot", 256 << 10)
         + tables[8].call_us("fused_oneshot", 256 << 10)) / 2)


def test_missing_table_file_is_an_error(tmp_path, monkeypatch):
    path = str(tmp_path / "nowhere.json")
    monkeypatch.setenv("JAX_AR_TABLE", path)
    with pytest.raises(_table.TableError, match="does not exist"):
        selection.table_for("cpu", "cpu", 2)


def test_fit_is_monotone_and_close_on_noisy_measurements():
    rng = np.random.default_rng(0)
    sizes = [1024 << k for k in range(19)]
    for latency, gbps in ((5.5, 50.0), (20.0, 300.0)):
        truth = [max(latency, 2.0 + s / (gbps * 1e3)) for s in sizes]
        measured = [t * (1 + 0.1 * rng.standard_normal()) for t in truth]
        measured[3] *= 5  # one sample disturbed by the OS
        curve = fit_curve(list(zip(sizes, measured)))
        predicted = [curve.predict(s) for s in [1] + sizes + [sizes[-1] * 4]]
        assert all(b >= a for a, b in zip(predicted, predicted[1:])), predicted
        errors = [abs(curve.predict(s) - t) / t for s, t in zip(sizes, truth)]
        assert np.median(errors) < 0.1 and max(errors) < 0.5, errors
        # What tune writes is what load_table accepts.
        _table._parse_curve([{"up_to_bytes": s.up_to_bytes, "latency_us": s.latency_us,
                              "us_per_mb": s.us_per_mb} for s in curve.segments])


def test_fit_with_a_knot_pooled_to_zero_passes_the_tables_check():
    """Measurements so noisy that the fit's first knot pools to 0 us (a busy
    CPU machine's psum, as CI saw on 2026-12-07): the segment after it must
    still predict no negative time at that knot in the file tune writes
    (table_to_json, as JSON text) once read back, or tune would refuse its
    own table."""
    defaults = selection.default_table("cpu", "cpu", 2)
    for points in (
            [(1024, 583.5530141960288), (2048, 1301.4897564282135), (4096, 2734.4512215036557),
             (8192, 27.499223441649026), (16384, 119.89621570910239)],
            [(1024, 2785.86313836585), (2048, 1359.8398505387465), (4096, 62.01099927351474),
             (8192, 1304.1542581094543), (16384, 1591.3683663928446)]):
        curve = fit_curve(points)
        assert curve.segments[0].latency_us == 0.0  # the pooled knot this is about
        table = _table.Table("cpu", "cpu", 2, {**defaults.curves, "psum": curve}, "tune")
        written = json.loads(json.dumps(_table.table_to_json(table, VERSION)))
        read = _table._parse_curve(written["algorithms"]["psum"])
        assert read == curve  # the file keeps the fitted figures
        predicted = [read.predict(s) for s in [1] + [b for b, _ in points] + [1 << 20]]
        assert min(predicted) >= 0 and predicted == sorted(predicted), predicted


def test_overrides_and_logging():
    if ON_GPU:
        pytest.skip("the tracing checks run on CPU devices")
    run_ranks("selection_auto.py", processes=1, devices_per_process=2, timeout_s=300)


def test_processes_that_would_choose_differently_fail_setup_saying_why():
    """Another table (JAX_AR_TABLE, tune's cache) or JAX_AR_ALGO on one
    process: setup's error names both processes, where each side's table
    came from (not only digests), what JAX_AR_ALGO each has as typed, and
    advises the same JAX_AR_TABLE / JAX_AR_ALGO, not the same mesh."""
    if ON_GPU:
        pytest.skip("the checks run on CPU devices")
    run_ranks("selection_auto.py", "disagree", processes=2, devices_per_process=1,
              timeout_s=300)


@pytest.mark.parametrize("typed,value", [(" OneShot ", "oneshot"), ("PSUM", "psum"),
                                         ("\tAuto\n", None), ("", None)])
def test_jax_ar_algo_takes_any_case_and_blanks(typed, value, monkeypatch):
    from jax_ar import config
    monkeypatch.setenv("JAX_AR_ALGO", typed)
    assert config.algorithm_override() == value


def test_a_bad_jax_ar_algo_is_shown_as_typed(monkeypatch):
    from jax_ar import config
    monkeypatch.setenv("JAX_AR_ALGO", " Fastest ")
    with pytest.raises(ValueError) as info:
        config.algorithm_override()
    assert str(info.value).endswith("got ' Fastest '"), info.value


@pytest.mark.parametrize("value,level,said", [("info", 20, ""), ("Error", 40, ""),
                                                (" warn ", 30, ""), ("NOTSET", 0, ""),
                                                ("bogus", 0, "is not a log level")])
def test_log_level_from_the_environment(value, level, said):
    """JAX_AR_LOG sets the "jax_ar" logger's level; a value that is no level
    is said on stderr and changes nothing (import jax_ar still works)."""
    probe = "import jax_ar; print(jax_ar.config.logger.level)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=dict(os.environ, JAX_AR_LOG=value), timeout=120, check=True)
    assert done.stdout.split() == [str(level)], done
    assert said in done.stderr and (said or "JAX_AR_LOG" not in done.stderr), done.stderr


@pytest.mark.parametrize("world,picks", [
    # What was measured fastest by the median on the 2-core VM with nothing
    # else running (benchmarks/interleaved.py, docs/benchmarks.md,
    # 2026-12-01; jax_ar/selection/defaults.py). At 2 ranks 1K is a tie
    # (one-shot 6.5 us, two-shot 6.7).
    (2, {"oneshot": (1 << 10, 1 << 10), "twoshot": (2 << 10, 2 << 20),
         "psum": (4 << 20, 16 << 20)}),
    (4, {"oneshot": (1 << 10, 2 << 10), "twoshot": (4 << 10, 4 << 20),
         "psum": (8 << 20, 8 << 20)}),
])
def test_cpu_defaults_pick_what_was_measured_fastest(world, picks):
    capacity = capacity_of(world, workspace=8 << 20, platform="cpu")  # the CPU default
    for algorithm, (low, high) in picks.items():
        size = low
        while size <= high:
            got = selection.choose_algorithm("cpu", world, size, capacity_bytes=capacity)
            assert got == algorithm, (world, size, got)
            size *= 2
