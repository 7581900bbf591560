"""Selection as all_reduce sees it: algorithm=, JAX_AR_ALGO, JAX_AR_TABLE and
JAX_AR_LOG, checked on the lowered program (which kernel, or psum).

With the argument `disagree` (2 processes): processes that would choose
algorithms differently (another table, another JAX_AR_ALGO) fail setup with
an error that says where each side's table came from and what to set."""
import json
import logging
import os
import re
import tempfile

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_ar
from common import Records, environment, global_array, log, main_guard
from jax_ar import config, selection
from jax_ar.selection import table as _table
from jax_ar import __version__ as VERSION


def lowered_algorithm(mesh, n_elements, algorithm="auto"):
    """Which algorithm the lowered program of one all_reduce uses."""
    x = global_array(np.ones((mesh.size * n_elements,), np.float32), mesh, P("tp"))
    f = jax.jit(jax.shard_map(lambda v: jax_ar.all_reduce(v, "tp", algorithm=algorithm),
                              mesh=mesh, in_specs=P("tp"), out_specs=P()))
    text = f.lower(x).as_text()
    codes = set(re.findall(r"algorithm = (\d+) : i32", text))
    has_psum = "all_reduce" in text.replace("jax_ar_all_reduce", "")
    if has_psum and not codes:
        return "psum"
    assert len(codes) == 1 and not has_psum, text
    return {"1": "oneshot", "2": "twoshot"}[codes.pop()]


def table_file(directory, cheapest):
    table = selection.default_table("cpu", "cpu", 2)
    doc = _table.table_to_json(table, VERSION)
    for name in doc["algorithms"]:
        latency = 1.0 if name == cheapest else 1000.0
        doc["algorithms"][name] = [{"up_to_bytes": None, "latency_us": latency,
                                    "us_per_mb": 1.0}]
    path = os.path.join(directory, f"{cheapest}.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def disagree(mesh):
    with tempfile.TemporaryDirectory(prefix=f"selection_disagree_{jax.process_index()}_") as tmp:
        disagree_in(mesh, tmp)


def disagree_in(mesh, tmp):
    me = jax.process_index()
    odd = me == 1
    platform = "gpu" if jax.devices()[0].platform in ("gpu", "cuda") else "cpu"
    kind = jax.devices()[0].device_kind
    doc = _table.table_to_json(selection.default_table(platform, kind, 2), VERSION)
    doc["algorithms"]["psum"] = [{"up_to_bytes": None, "latency_us": 0.0, "us_per_mb": 0.0}]
    tuned = os.path.join(tmp, "tuned.json")
    with open(tuned, "w") as f:
        json.dump(doc, f)
    os.makedirs(os.path.join(tmp, "cache", "jax_ar"))
    cached = os.path.join(tmp, "cache", "jax_ar", os.path.basename(
        _table.table_path(platform, kind, 2)))
    with open(cached, "w") as f:
        json.dump(doc, f)
    empty_cache = os.path.join(tmp, "empty")

    def expect(what, must_name, must_not_name=(), **kwargs):
        selection.clear_cache()
        try:
            jax_ar.setup(mesh, "tp", timeout_s=30.0, **kwargs)
        except jax_ar.JaxArError as e:
            text = str(e)
            for fragment in ("process 0", "process 1", *must_name):
                assert fragment in text, f"{what}: error does not mention {fragment!r}: {text}"
            for fragment in must_not_name:
                assert fragment not in text, f"{what}: error mentions {fragment!r}: {text}"
            log(f"{what}: {text}")
        else:
            raise AssertionError(f"{what}: setup succeeded; expected JaxArError")

    # Each side's table by where it came from, and what to set on every process
    # (not the advice for another mesh, axis or workspace_bytes).
    advice = ("same JAX_AR_TABLE", "same JAX_AR_ALGO", "cache")
    with environment("XDG_CACHE_HOME", empty_cache), environment("JAX_AR_ALGO", None):
        with environment("JAX_AR_TABLE", tuned if odd else "default"):
            expect("table file vs default", ("cost_table", f"JAX_AR_TABLE={tuned}" if odd else
                                             "the shipped defaults (JAX_AR_TABLE=default)",
                                             "selection_disagree_1_", "JAX_AR_TABLE=default",
                                             *advice), ("workspace_bytes",))
        with environment("JAX_AR_TABLE", None), \
                environment("XDG_CACHE_HOME", os.path.join(tmp, "cache") if odd else empty_cache):
            expect("cached file vs none", (f"the tuned file {cached} (from the cache)" if odd else
                                           "the shipped defaults (no JAX_AR_TABLE, no tuned file",
                                           "selection_disagree_1_", *advice), ("workspace_bytes",))
        with environment("JAX_AR_TABLE", "default"):
            # What the user typed, not the lowercased value.
            with environment("JAX_AR_ALGO", " OneShot " if odd else None):
                expect("JAX_AR_ALGO set vs unset", ("JAX_AR_ALGO: ", "' OneShot '",
                                                    "unset (auto)", *advice),
                       ("workspace_bytes", "cost_table"))
            # Both kinds at once: both pieces of advice.
            with environment("JAX_AR_ALGO", "psum" if odd else None):
                expect("JAX_AR_ALGO and workspace_bytes", ("JAX_AR_ALGO", "workspace_bytes",
                                                           "same mesh", *advice),
                       workspace_bytes=(2 << 20) if odd else (1 << 20))
            # The same table from different files of the same content agrees.
            with environment("JAX_AR_TABLE", tuned):
                selection.clear_cache()
                jax_ar.setup(mesh, "tp", timeout_s=30.0).close()
    selection.clear_cache()
    log("disagree: ok")


def main(argv):
    mesh = jax.make_mesh((jax.device_count(),), ("tp",))
    if argv == ["disagree"]:
        return disagree(mesh)
    jax_ar.setup(mesh, "tp")
    os.environ.pop("JAX_AR_ALGO", None)
    os.environ["JAX_AR_TABLE"] = "default"

    # Explicit algorithms are used as given.
    for name in ("oneshot", "twoshot", "psum"):
        assert lowered_algorithm(mesh, 100, name) == name, name
    # JAX_AR_ALGO replaces "auto", never an explicit choice; a bad value is an error.
    for name in ("oneshot", "twoshot", "psum"):
        os.environ["JAX_AR_ALGO"] = name
        assert lowered_algorithm(mesh, 101) == name, name
    os.environ["JAX_AR_ALGO"] = "psum"
    assert lowered_algorithm(mesh, 102, "twoshot") == "twoshot"
    os.environ["JAX_AR_ALGO"] = "fastest"
    try:
        lowered_algorithm(mesh, 103)
    except ValueError as e:
        assert "JAX_AR_ALGO" in str(e), e
    else:
        raise AssertionError("JAX_AR_ALGO=fastest should raise ValueError")
    del os.environ["JAX_AR_ALGO"]
    log("overrides: ok")

    # "auto" follows the table JAX_AR_TABLE names; a bad table stops tracing.
    with tempfile.TemporaryDirectory() as tmp:
        for cheapest in ("psum", "twoshot", "oneshot"):
            os.environ["JAX_AR_TABLE"] = table_file(tmp, cheapest)
            selection.clear_cache()
            assert lowered_algorithm(mesh, 104 + len(cheapest)) == cheapest, cheapest
        bad = os.path.join(tmp, "bad.json")
        with open(bad, "w") as f:
            f.write("[]")
        os.environ["JAX_AR_TABLE"] = bad
        selection.clear_cache()
        try:
            lowered_algorithm(mesh, 120)
        except _table.TableError as e:
            assert bad in str(e), e
        else:
            raise AssertionError("a malformed table should stop tracing")
    os.environ["JAX_AR_TABLE"] = "default"
    selection.clear_cache()
    log("tables: ok")

    # JAX_AR_LOG=info: one line per choice and size class, with predicted times.
    records = Records()
    config.logger.addHandler(records)
    config.logger.setLevel(logging.INFO)
    for n_elements in (1000, 1001, 1020, 5000):  # 4000..4080 bytes share a class
        lowered_algorithm(mesh, n_elements)
    choices = [m for m in records.messages if "predicted" in m]
    assert len(choices) == 2, records.messages
    assert all("oneshot" in m and "twoshot" in m and "psum" in m and " us" in m
               for m in choices), choices
    log("logging: ok")


if __name__ == "__main__":
    main_guard(main)
