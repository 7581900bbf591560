"""One rank of the multi-axis tests: processes stand in for hosts.
Usage: ops_multi_axis.py PROCESSES_PER_HOST [SUITE...]

Each process sets JAX_AR_HOST_ID to "host<process index // PROCESSES_PER_HOST>"
before setup, so a (node, local) mesh has one host per "node" index.

Suites: hosts, values, in_order, grad, vmap, pytree, scatter_gather,
scatter_gather_both_axes, bad_input.
all_reduce over ("node", "local") is checked bit for bit against jax_ar's
arithmetic (each host reduces in rank order; the two hosts' sums are then
added, which is exact in any order), against psum over both axes (bitwise
where the data make every order agree), across all ranks, and between the
two plans. On the GPU machine, where psum cannot run between ranks sharing a
GPU, only the suites without a cross-host psum run.
"""
import json
import logging
import os
import re
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

ON_GPU = os.environ.get("JAX_AR_TEST_PLATFORM", "cpu") == "gpu"
SEED = int(os.environ.get("JAX_AR_TEST_SEED", "0"))
PROCESSES_PER_HOST = int(sys.argv[1])
os.environ["JAX_AR_HOST_ID"] = f"host{jax.process_index() // PROCESSES_PER_HOST}"

import jax_ar  # noqa: E402
from axes_cases import run_cases  # noqa: E402
from common import Records, SuiteSkipped, environment, expect_error  # noqa: E402
from common import (DTYPES, OPS, assert_bitwise_equal, assert_close_to_float64,  # noqa: E402
                    emulate_all_reduce, global_array, log, main_guard, run_suites, suites_in, random_values,
                    same_on_all_processes)

AXES = ("node", "local")


RECORDS = Records(logging.INFO)
logging.getLogger("jax_ar").addHandler(RECORDS)
logging.getLogger("jax_ar").setLevel(logging.INFO)


def make_mesh():
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    hosts = jax.process_count() // PROCESSES_PER_HOST
    return jax.sharding.Mesh(np.array(devices).reshape(hosts, -1), AXES)


def multi_axis_reference(parts, per_host, op):
    """jax_ar's result over both axes: each host's sum in rank order, then
    the hosts' sums combined in host order, averages divided once."""
    kernel_op = "sum" if op == "avg" else op
    hosts = [emulate_all_reduce(parts[k:k + per_host], kernel_op)
             for k in range(0, len(parts), per_host)]
    total = emulate_all_reduce(hosts, kernel_op)
    if op != "avg":
        return total
    mean = total.astype(np.float32) / np.float32(len(parts))
    return mean if total.dtype == np.int32 else mean.astype(total.dtype)


def lax_reduce(op):
    return {"sum": jax.lax.psum, "avg": jax.lax.pmean, "max": jax.lax.pmax,
            "min": jax.lax.pmin}[op]


def suite_hosts(mesh, per_host):
    """Host identity decides which groups jax_ar serves: "node" spans hosts
    and falls back to psum (logged once), "local" stays inside one."""
    before = len(RECORDS.messages)
    across = jax_ar.setup(mesh, "node")
    assert not across.serves_calls and "spans several hosts" in across.fallback_reason, across
    assert len(setup_fallbacks()) == 1, RECORDS.messages[before:]
    assert jax_ar.setup(mesh, "node") is across  # idempotent, not logged again
    if not ON_GPU:  # the fallbacks below are psums
        n = mesh.devices.size
        rng = np.random.default_rng(SEED)
        parts = [random_values(rng, (5, 3), np.float32) for _ in range(n)]
        cases = {"node": (lambda x: jax_ar.all_reduce(x, "node"), [parts]),
                 # No communicator on "local" yet: the whole reduction is psum.
                 "both": (lambda x: jax_ar.all_reduce(x, AXES), [parts])}
        results = run_cases(mesh, cases)
        for r, got in results["both"].items():
            assert_bitwise_equal(got, emulate_all_reduce(parts, "sum"), f"fallback both, rank {r}")
        per_node = mesh.devices.shape[1]
        for r, got in results["node"].items():
            column = [parts[k * per_node + r % per_node] for k in range(mesh.devices.shape[0])]
            assert_bitwise_equal(got, emulate_all_reduce(column, "sum"), f"fallback node, rank {r}")
        assert len(setup_fallbacks()) == 1, RECORDS.messages
        for fragment in ("all_reduce over 'node' lowers to jax.lax.psum",
                         "all_reduce over ('node', 'local') lowers to jax.lax.psum"):
            assert sum(fragment in m for m in RECORDS.messages) == 1, (fragment, RECORDS.messages)
    inside = jax_ar.setup(mesh, "local")
    assert inside.serves_calls, inside
    assert inside.world_size == per_host_devices(mesh)
    log(f"hosts: ok ({across!r}; {inside!r})")


def setup_fallbacks():
    return [m for m in RECORDS.messages if "spans several hosts" in m and "psum serves it" in m]


def per_host_devices(mesh):
    return mesh.devices.shape[1]


def suite_values(mesh, per_host):
    n = mesh.devices.size
    L = per_host_devices(mesh)
    rng = np.random.default_rng(SEED + 1)
    cases, lax_cases, expected, exact = {}, {}, {}, {}

    def add(name, algorithm, op, parts, integer_valued):
        cases[name] = (lambda x, a=algorithm, o=op: jax_ar.all_reduce(x, AXES, op=o,
                                                                      algorithm=a), [parts])
        lax_cases[name] = (lambda x, o=op: lax_reduce(o)(x, AXES), [parts])
        expected[name] = multi_axis_reference(parts, L, op)
        exact[name] = integer_valued

    for algorithm in ("oneshot", "twoshot"):  # plan (a) and plan (b)
        for dt, dtype in DTYPES.items():
            for op in OPS:
                for shape, integer_valued in (((7, 3), True), ((1000,), False)):
                    parts = [random_values(rng, shape, dtype, integer_valued) for _ in range(n)]
                    add(f"{algorithm}/{op}/{dt}{shape}", algorithm, op, parts, integer_valued)
    # auto: plan (a) for small messages, plan (b) for large ones (several
    # protocol rounds too); "psum" is XLA's all the way.
    for size in (64, 300_000):
        for op in ("sum", "avg"):
            parts = [random_values(rng, (size,), np.float32) for _ in range(n)]
            add(f"auto/{op}/{size}", "auto", op, parts, True)
    for op in OPS:
        parts = [random_values(rng, (33,), np.float32) for _ in range(n)]
        add(f"psum/{op}", "psum", op, parts, True)

    results = run_cases(mesh, cases)
    lax_results = None if ON_GPU else run_cases(mesh, lax_cases)  # separate program
    digests = []
    for name, per_rank in sorted(results.items()):
        parts = cases[name][1][0]
        for r, got in per_rank.items():
            what = f"{name} on rank {r}"
            if name.startswith("psum/"):
                assert_close_to_float64(got, parts, name.split("/")[1], what)
            else:
                assert_bitwise_equal(got, expected[name], what)
            if lax_results is not None and exact[name]:
                assert_bitwise_equal(got, lax_results[name][r], what + " vs psum")
            elif not name.startswith("psum/"):
                # psum's own order and roundings differ (16-bit floats round
                # at each step there): both must be near float64 instead.
                assert_close_to_float64(got, parts, name.split("/")[1], what)
        first = next(iter(per_rank.values()))
        for r, got in per_rank.items():  # the same bits on every local rank
            assert_bitwise_equal(got, first, f"{name}: rank {r} vs this process's first")
        digests.append(first)
    same_on_all_processes("values", digests)
    log(f"values: {len(cases)} cases ok")


def suite_in_order(mesh, per_host):
    """On CPU, the psums that serve jax_ar calls keep their place among
    jax_ar's kernel calls: every all-reduce XLA runs takes its operand from
    the jax_ar_order chain, and the next kernel call waits for its result.
    Unordered, one device of a process blocks in a kernel call waiting for a
    sibling that is inside a psum waiting for the first (CI saw it hang).
    The program is then run a few times against numpy."""
    if ON_GPU:
        raise SuiteSkipped("the chain exists on CPU only (GPUs run one stream in order)")
    n = mesh.devices.size
    L = per_host_devices(mesh)
    rng = np.random.default_rng(SEED + 7)
    parts = {name: [random_values(rng, (64,), np.float32) for _ in range(n)]
             for name in ("both", "local", "psum", "local_again")}
    cases = {  # independent calls: only the chain orders them
        "both": (lambda x: jax_ar.all_reduce(x, AXES), [parts["both"]]),
        "local": (lambda x: jax_ar.all_reduce(x, "local"), [parts["local"]]),
        "psum": (lambda x: jax_ar.all_reduce(x, AXES, algorithm="psum"), [parts["psum"]]),
        "local_again": (lambda x: jax_ar.all_reduce(x, "local"), [parts["local_again"]]),
    }
    text = lowered_text(mesh, cases)
    produced_by = dict(re.findall(r"(%[\w#]+)(?::\d+)? = stablehlo\.custom_call @(\w+)", text))
    psum_operands = re.findall(r'"stablehlo\.all_reduce"\((%[\w#]+)', text)
    assert len(psum_operands) >= 2, text  # the plan's psum over 'node' and the psum case
    unordered = [v for v in psum_operands if produced_by.get(v.split("#")[0]) != "jax_ar_order"]
    assert not unordered, f"psum operands {unordered} are not chained after a jax_ar call:\n{text}"
    for _ in range(3):
        results = run_cases(mesh, cases)
        for name, per_rank in results.items():
            for r, got in per_rank.items():
                if name.startswith("local"):
                    host = r // L * L
                    want = emulate_all_reduce(parts[name][host:host + L], "sum")
                else:
                    want = multi_axis_reference(parts[name], L, "sum")
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6,
                                           err_msg=f"{name} on rank {r}")
    log(f"in_order: ok ({len(psum_operands)} psums chained)")


def lowered_text(mesh, cases):
    """The StableHLO of run_cases' program for `cases`."""
    spec = P(tuple(mesh.axis_names))
    names = list(cases)

    def body(*xs):
        return tuple(cases[k][0](x[0])[None] for k, x in zip(names, xs))

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=tuple(spec for _ in names),
                              out_specs=tuple(spec for _ in names), check_vma=False))
    n = mesh.devices.size
    zeros = np.zeros((n, 64), np.float32)
    return f.lower(*[global_array(zeros, mesh, spec) for _ in names]).as_text()


def suite_grad(mesh, per_host):
    """Gradients of sum(c * all_reduce(x)) with a different c on every rank:
    every rank's x receives the sum of all c (divided by the rank count for
    avg), with check_vma on and off, inside and outside shard_map."""
    n = mesh.devices.size
    rng = np.random.default_rng(SEED + 2)
    x = [random_values(rng, (4, 3), np.float32, integer_valued=False) for _ in range(n)]
    c = [random_values(rng, (4, 3), np.float32) for _ in range(n)]
    total_c = np.sum(np.stack(c), axis=0)
    for check_vma in (True, False):
        cases = {}
        for algorithm in ("oneshot", "twoshot"):
            for op in ("sum", "avg"):
                f = lambda u, a=algorithm, o=op: jax_ar.all_reduce(u, AXES, op=o, algorithm=a)
                cases[f"{algorithm}/{op}"] = (
                    lambda u, w, f=f: jax.grad(lambda v: jnp.sum(w * f(v)))(u), [x, c])
        results = run_cases(mesh, cases, check_vma=check_vma)
        for name, per_rank in results.items():
            want = total_c / (n if name.endswith("avg") else 1)
            for r, got in per_rank.items():
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6,
                                           err_msg=f"grad {name} check_vma={check_vma}")
    spec = P(AXES)
    xs = global_array(np.concatenate(x), mesh, spec)
    f = jax.shard_map(lambda u: jax_ar.all_reduce(u, AXES, algorithm="twoshot"), mesh=mesh,
                      in_specs=spec, out_specs=P())
    got = jax.jit(jax.grad(lambda v: jnp.sum(jnp.asarray(c[0]) * f(v))))(xs)
    for s in got.addressable_shards:
        np.testing.assert_allclose(np.asarray(s.data), c[0], rtol=1e-6,
                                   err_msg="outer grad over both axes")
    log("grad: ok")


def suite_vmap(mesh, per_host):
    n = mesh.devices.size
    rng = np.random.default_rng(SEED + 3)
    parts = [random_values(rng, (3, 5), np.float32) for _ in range(n)]
    cases = {a: (lambda v, a=a: jax.vmap(lambda row: jax_ar.all_reduce(row, AXES,
                                                                       algorithm=a))(v), [parts])
             for a in ("oneshot", "twoshot")}
    results = run_cases(mesh, cases)
    want = multi_axis_reference(parts, per_host_devices(mesh), "sum")
    for name, per_rank in results.items():
        for r, got in per_rank.items():
            assert_bitwise_equal(got, want, f"vmap {name} on rank {r}")
    log("vmap: ok")


def suite_pytree(mesh, per_host):
    """Several dtypes and an empty leaf in one call: each dtype travels as
    one message; results keep the tree's structure."""
    n = mesh.devices.size
    L = per_host_devices(mesh)
    rng = np.random.default_rng(SEED + 4)
    leaves = [("float32", (3, 5)), ("bfloat16", (17,)), ("float32", (2,)), ("int32", (4, 2)),
              ("float16", (9,)), ("float32", (0,))]
    parts = [[random_values(rng, shape, DTYPES[dt]) for dt, shape in leaves] for _ in range(n)]
    per_leaf = [[p[i] for p in parts] for i in range(len(leaves))]
    cases = {}
    for algorithm in ("oneshot", "twoshot"):
        for op in ("sum", "max"):
            def fn(*xs, a=algorithm, o=op):
                tree = {"a": list(xs[:3]), "b": (xs[3], {"c": xs[4]}), "e": xs[5]}
                out = jax_ar.all_reduce(tree, AXES, op=o, algorithm=a)
                assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(tree)
                return jax.tree_util.tree_leaves(out)
            for i in range(len(leaves)):  # one case per leaf: run_cases wants one array
                cases[f"{algorithm}/{op}/leaf {i}"] = (lambda *xs, i=i, fn=fn: fn(*xs)[i],
                                                       per_leaf)
    for name, per_rank in run_cases(mesh, cases).items():
        op, i = name.split("/")[1], int(name.split(" ")[-1])
        want = multi_axis_reference(per_leaf[i], L, op)
        for r, got in per_rank.items():
            assert_bitwise_equal(got, want, f"pytree {name} rank {r}")
    log("pytree: ok")


def suite_scatter_gather(mesh, per_host):
    """reduce_scatter / all_gather over the intra-host axis of the 2-D mesh."""
    n = mesh.devices.size
    L = per_host_devices(mesh)
    rng = np.random.default_rng(SEED + 5)
    parts = [random_values(rng, (2, 3 * L), np.float32) for _ in range(n)]
    cases = {
        "reduce_scatter": (lambda x: jax_ar.reduce_scatter(x, "local", 1, True), [parts]),
        "all_gather": (lambda x: jax_ar.all_gather(x, "local"), [parts]),
    }
    results = run_cases(mesh, cases)
    for r in results["reduce_scatter"]:
        host, i = divmod(r, L)
        group = parts[host * L:(host + 1) * L]
        total = emulate_all_reduce(group, "sum")
        assert_bitwise_equal(results["reduce_scatter"][r], total[:, 3 * i:3 * i + 3],
                             f"reduce_scatter over local, rank {r}")
        assert_bitwise_equal(results["all_gather"][r], np.stack(group),
                             f"all_gather over local, rank {r}")
    log("scatter_gather: ok")


def suite_scatter_gather_both_axes(mesh, per_host):
    """reduce_scatter and all_gather over ("node", "local") and ("local",
    "node"): jax_ar's kernels inside each host, XLA's collective across
    hosts ("node" falls back), in lax's rank order over the tuple; bit for
    bit against numpy (exact data) and jax.lax."""
    if ON_GPU:
        raise SuiteSkipped("the cross-host steps are psums")
    n = mesh.devices.size
    hosts, local = mesh.devices.shape
    rng = np.random.default_rng(SEED + 9)
    cases, expected, lax_cases = {}, {}, {}
    for axes in (AXES, AXES[::-1]):
        def index(r, axes=axes):  # rank r's position along the tuple
            node, loc = divmod(r, local)
            return node * local + loc if axes == AXES else loc * hosts + node
        order = sorted(range(n), key=index)
        for dt in ("float32", "bfloat16", "int32"):
            parts = [random_values(rng, (2, 3 * n), DTYPES[dt]) for _ in range(n)]
            total = emulate_all_reduce(parts, "sum")
            name = f"reduce_scatter {axes} {dt}"
            cases[name] = (lambda v, axes=axes: jax_ar.reduce_scatter(v, axes, -1, True), [parts])
            lax_cases[name] = (lambda v, axes=axes: jax.lax.psum_scatter(
                v, axes, scatter_dimension=1, tiled=True), [parts])
            expected[name] = {r: total[:, 3 * index(r):3 * index(r) + 3] for r in range(n)}
            rows = [random_values(rng, (3,), DTYPES[dt]) for _ in range(n)]
            name = f"all_gather {axes} {dt}"
            cases[name] = (lambda v, axes=axes: jax_ar.all_gather(v, axes), [rows])
            lax_cases[name] = (lambda v, axes=axes: jax.lax.all_gather(v, axes), [rows])
            expected[name] = {r: np.stack([rows[q] for q in order]) for r in range(n)}
    ours, theirs = run_cases(mesh, cases), run_cases(mesh, lax_cases)
    for name, per_rank in ours.items():
        for r, got in per_rank.items():
            assert_bitwise_equal(got, expected[name][r], f"{name} rank {r}")
            assert_bitwise_equal(got, theirs[name][r], f"{name} rank {r} vs lax")
    log(f"scatter_gather_both_axes: {len(cases)} cases ok")


def suite_table_file(mesh, per_host):
    """JAX_AR_TABLE naming a table of the intra-host world size (as tune
    writes one): an all-reduce over both axes predicts its part inside a
    host from that file and the psum across hosts from the shipped table
    (a file of one world size cannot serve both; it was rejected)."""
    if ON_GPU:
        raise SuiteSkipped("the psum across hosts cannot run where ranks share a GPU")
    from jax_ar import selection
    from jax_ar.selection import defaults, table as table_file

    n, L = mesh.devices.size, per_host_devices(mesh)
    kind = jax.devices()[0].device_kind
    doc = table_file.table_to_json(defaults.default_table("cpu", kind, L), jax_ar.__version__)
    path = os.path.join(tempfile.mkdtemp(), f"table-n{L}.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    rng = np.random.default_rng(SEED + 9)
    parts = [random_values(rng, (300,), np.float32, True) for _ in range(n)]
    want = multi_axis_reference(parts, L, "sum")
    selection.clear_cache()
    try:
        with environment("JAX_AR_TABLE", path):
            results = run_cases(mesh, {"auto": (lambda x: jax_ar.all_reduce(x, AXES), [parts])})
    finally:
        selection.clear_cache()
    for r, got in results["auto"].items():
        assert_bitwise_equal(got, want, f"JAX_AR_TABLE of {L} ranks, {n // L} hosts, rank {r}")
    log("table_file: ok")


def suite_bad_input(mesh, per_host):
    n = mesh.devices.size
    x = global_array(np.ones((n * 4,), np.float32), mesh, P(AXES))

    def run(fn):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P(AXES), out_specs=P(AXES)))(x)

    expect_error(ValueError, "names an axis twice",
                 lambda: run(lambda v: jax_ar.all_reduce(v, ("local", "local"))))
    expect_error(ValueError, "must be a multiple of the size of axes ('node', 'local')",
                 lambda: run(lambda v: jax_ar.reduce_scatter(v[:n - 1], AXES, tiled=True)))
    other = jax.sharding.Mesh(mesh.devices, ("x", "y"))
    expect_error(ValueError, "no communicator for any of the axes", lambda: jax.jit(
        jax.shard_map(lambda v: jax_ar.all_reduce(v, ("x", "y")), mesh=other,
                      in_specs=P(("x", "y")), out_specs=P()))(
            global_array(np.ones((n,), np.float32), other, P(("x", "y")))))
    log("bad_input: ok")


SUITES = suites_in(globals())
GPU_SUITES = ("hosts", "scatter_gather", "bad_input")  # no psum between ranks sharing a GPU


def main(argv):
    mesh = make_mesh()
    log(f"{jax.device_count()} devices, {jax.process_count()} processes, "
        f"{PROCESSES_PER_HOST} per host: mesh {dict(mesh.shape)}")
    names = argv[1:] or [s for s in SUITES if not ON_GPU or s in GPU_SUITES]
    if "hosts" not in names:
        names = ["hosts"] + names  # sets up the communicators
    run_suites(SUITES, names, mesh, PROCESSES_PER_HOST)


if __name__ == "__main__":
    main_guard(main)
