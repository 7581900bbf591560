"""Selection as all_reduce sees it: algorithm=, JAX_AR_ALGO, JAX_AR_TABLE and
JAX_AR_LOG, checked on the lowered program (which kernel, or psum)."""
import json
import logging
import os
import re
import tempfile

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_ar
from common import Records, global_array, log, main_guard
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


def main(argv):
    mesh = jax.make_mesh((jax.device_count(),), ("tp",))
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
