"""One rank of the communicator lookup tests. Usage: comm_lookup.py [SUITE...]

A call uses the communicator whose groups are exactly the devices, in rank
order, of its axis; several communicators of one axis name coexist in one
program. Suites: two device orders of one mesh; disjoint sub-meshes (one
communicator per pipeline stage, all named "tp"); a mesh never set up (an
error at trace time, naming the function, the axis and the devices); a
mesh of another shape with the same groups; a larger communicator serving
a sub-mesh of one of its groups; a jitted function reused in shard_maps
over two device orders (checked again when lowered); eager shard_map and
jax.set_mesh; a shard_map nested in another (given the AbstractMesh); a
shard_map over an AbstractMesh (jax.lax, logged); a shard_map that leaves a
mesh axis automatic (jax.lax, logged); close() of one of two. Results are compared bit for bit with numpy references of
the mesh's rank order (exact data: every summation order agrees).
"""
import logging
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

import jax_ar
from axes_cases import run_cases
from common import (Records, SuiteSkipped, assert_bitwise_equal, expect_error, global_array, log,
                    main_guard, random_values, run_suites, suites_in)

ON_GPU = os.environ.get("JAX_AR_TEST_PLATFORM", "cpu") == "gpu"
SEED = int(os.environ.get("JAX_AR_TEST_SEED", "0"))
HIDDEN = 128  # all_reduce_rms_norm: a row the fused kernel takes


def mesh_of(devices, axes=("tp",), shape=None):
    return Mesh(np.array(devices, dtype=object).reshape(shape or (len(devices),)), axes)


def ids(mesh):
    return [d.id for d in mesh.devices.flat]


def local_ranks_of(mesh):
    return any(d.process_index == jax.process_index() for d in mesh.devices.flat)


def collective_cases(n, rng):
    """{name: (fn, [per-rank inputs], per-rank expected)} of every
    collective over "tp" of an n-rank mesh, in that mesh's rank order."""
    parts = [random_values(rng, (n, 3), np.float32) for _ in range(n)]
    wide = [random_values(rng, (2, 3 * n), np.float32) for _ in range(n)]
    xs = [random_values(rng, (2, HIDDEN), np.float32) for _ in range(n)]
    residual = random_values(rng, (2, HIDDEN), np.float32)
    total = np.sum(np.stack(parts), axis=0)  # integer-valued: exact in any order
    x_total = np.sum(np.stack(xs), axis=0) + residual
    wide_total = np.sum(np.stack(wide), axis=0)
    gathered = np.stack(parts)
    return {
        "all_reduce": (lambda v: jax_ar.all_reduce(v, "tp"), [parts], [total] * n),
        "all_reduce max": (lambda v: jax_ar.all_reduce(v, "tp", op="max"), [parts],
                           [np.max(np.stack(parts), axis=0)] * n),
        "reduce_scatter": (lambda v: jax_ar.reduce_scatter(v, "tp"), [parts],
                           [total[j] for j in range(n)]),
        "reduce_scatter tiled": (lambda v: jax_ar.reduce_scatter(v, "tp", -1, tiled=True),
                                 [wide], [wide_total[:, 3 * j:3 * j + 3] for j in range(n)]),
        "all_gather": (lambda v: jax_ar.all_gather(v, "tp"), [parts], [gathered] * n),
        "all_gather tiled -1": (lambda v: jax_ar.all_gather(v, "tp", axis=-1, tiled=True),
                                [parts], [np.concatenate(parts, axis=-1)] * n),
        "all_reduce_rms_norm residual_out": (
            lambda v, r: jax_ar.all_reduce_rms_norm(v, r, jnp.ones(HIDDEN), "tp")[1],
            [xs, [residual] * n], [x_total] * n),
    }


def check_cases(mesh, cases, what):
    results = run_cases(mesh, {k: (fn, args) for k, (fn, args, _) in cases.items()})
    for name, per_rank in results.items():
        for rank, got in per_rank.items():
            assert_bitwise_equal(got, cases[name][2][rank],
                                 f"{what}: {name} on rank {rank} of mesh {ids(mesh)}")


def suite_two_device_orders():
    """Two meshes with one axis name and size, devices in two orders, both
    set up: each call runs with its own mesh's ranks."""
    devices = jax.devices()
    n = len(devices)
    forward, backward = mesh_of(devices), mesh_of(devices[::-1])
    a, b = jax_ar.setup(forward, "tp"), jax_ar.setup(backward, "tp")
    assert a is not b and a.comm_id != b.comm_id, (a, b)
    rng = np.random.default_rng(SEED + 1)
    for _ in range(2):  # and back again: neither hides the other
        for mesh in (forward, backward):
            check_cases(mesh, collective_cases(n, rng), "two device orders")
    a.close()
    b.close()
    log("two_device_orders: ok")


def suite_disjoint_submeshes():
    """One communicator per pipeline stage, all on axis "tp": stages whose
    groups span the processes (devices interleaved), and stages of one
    process each (on one process, both stages run there)."""
    devices = jax.devices()
    n = len(devices)
    if n < 4 or n % 2:
        raise AssertionError(f"needs an even number of devices, 4 or more (got {n})")
    interleaved = [mesh_of(devices[0::2]), mesh_of(devices[1::2])]
    comms = [jax_ar.setup(m, "tp") for m in interleaved]
    rng = np.random.default_rng(SEED + 2)
    for mesh in interleaved + interleaved[::-1]:
        check_cases(mesh, collective_cases(n // 2, rng), "interleaved stages")
    for c in comms:
        c.close()
    # Stages of contiguous devices: a process sets up and calls only the
    # stages whose devices it owns.
    stages = [mesh_of(devices[: n // 2]), mesh_of(devices[n // 2:])]
    mine = [m for m in stages if all(d.process_index == jax.process_index()
                                      for d in m.devices.flat)]
    spanning = [m for m in stages if local_ranks_of(m) and m not in mine]
    comms = [jax_ar.setup(m, "tp") for m in mine + spanning]
    for mesh in mine + spanning:
        check_cases(mesh, collective_cases(n // 2, rng), "contiguous stages")
    for c in comms:
        c.close()
    log(f"disjoint_submeshes: ok ({len(mine)} stage(s) of this process alone)")


def suite_never_set_up():
    """A mesh never set up, next to one of the same axis name that is: every
    public function raises at trace time, naming itself, the axis, the
    devices and jax_ar.setup."""
    devices = jax.devices()
    n = len(devices)
    done = mesh_of(devices)
    comm = jax_ar.setup(done, "tp")
    other = mesh_of(devices[1:] + devices[:1])  # every rank moved: never set up
    x = global_array(np.ones((n * 2, HIDDEN), np.float32), other, P("tp"))
    g = jnp.ones(HIDDEN, np.float32)
    calls = {
        "jax_ar.all_reduce": lambda v: jax_ar.all_reduce(v, "tp"),
        "jax_ar.reduce_scatter": lambda v: jax_ar.reduce_scatter(v, "tp", 1, tiled=True),
        "jax_ar.all_gather": lambda v: jax_ar.all_gather(v, "tp", to="invarying"),
        "jax_ar.all_reduce_rms_norm": lambda v: jax_ar.all_reduce_rms_norm(v, v, g, "tp")[0],
    }
    shown = "[" + str(ids(other)) + "]"
    for what, fn in calls.items():
        program = jax.jit(jax.shard_map(fn, mesh=other, in_specs=P("tp"), out_specs=P()))
        for fragment in (what + ":", "'tp'", shown, "jax_ar.setup(mesh, 'tp')"):
            expect_error(ValueError, fragment, lambda: program.trace(x))
    # Several axes, none set up: all_reduce and the scatter / gather
    # compositions say so too.
    if n % 2 == 0:
        grid = mesh_of(devices, ("x", "y"), (2, n // 2))
        y = global_array(np.ones((n, n), np.float32), grid, P(("x", "y")))
        for what, fn in {
                "jax_ar.all_reduce": lambda v: jax_ar.all_reduce(v, ("x", "y")),
                "jax_ar.reduce_scatter": lambda v: jax_ar.reduce_scatter(v, ("x", "y"), 1, True),
                "jax_ar.all_gather": lambda v: jax_ar.all_gather(v, ("x", "y"), to="invarying"),
        }.items():
            program = jax.jit(jax.shard_map(fn, mesh=grid, in_specs=P(("x", "y")),
                                            out_specs=P()))
            for fragment in (what + ":", "no communicator for any of the axes ('x', 'y')"):
                expect_error(ValueError, fragment, lambda: program.trace(y))
    # The mesh that was set up still works.
    check_cases(done, collective_cases(n, np.random.default_rng(SEED + 3)), "set-up mesh")
    comm.close()
    log("never_set_up: ok")


def suite_same_groups_other_mesh():
    """A communicator is its devices in rank order: a (1, n) mesh over
    ("dp", "tp") has the groups of the (n,) mesh along "tp", so it finds
    (and setup returns) the same communicator."""
    devices = jax.devices()
    n = len(devices)
    flat = mesh_of(devices)
    comm = jax_ar.setup(flat, "tp")
    wide = mesh_of(devices, ("dp", "tp"), (1, n))
    assert jax_ar.setup(wide, "tp") is comm
    rng = np.random.default_rng(SEED + 4)
    check_cases(wide, collective_cases(n, rng), "(1, n) mesh")
    comm.close()
    log("same_groups_other_mesh: ok")


def suite_larger_communicator():
    """A communicator over a (2, n/2) mesh's "tp" groups serves a shard_map
    over one of those groups alone (the groups are exactly the call's); a
    group in another order is not one of them."""
    devices = jax.devices()
    n = len(devices)
    grid = mesh_of(devices, ("dp", "tp"), (2, n // 2))
    comm = jax_ar.setup(grid, "tp")
    rng = np.random.default_rng(SEED + 5)
    rows = [list(row) for row in grid.devices]
    for row in rows:  # a process calls the groups it holds every device of
        if all(d.process_index == jax.process_index() for d in row):
            check_cases(mesh_of(row), collective_cases(n // 2, rng), "a group alone")
    reordered = mesh_of(rows[0][::-1])
    if all(d.process_index == jax.process_index() for d in reordered.devices.flat):
        x = global_array(np.ones((n // 2,), np.float32), reordered, P("tp"))
        program = jax.jit(jax.shard_map(lambda v: jax_ar.all_reduce(v, "tp"), mesh=reordered,
                                        in_specs=P("tp"), out_specs=P()))
        expect_error(ValueError, "no communicator for axis 'tp'", lambda: program.trace(x))
    comm.close()
    log("larger_communicator: ok")


def suite_reused_jaxpr():
    """A jitted function traced once and called in shard_maps over two
    device orders: jax reuses its jaxpr (made for the first), so the
    lowering names the second's communicator; results follow each mesh."""
    devices = jax.devices()
    n = len(devices)
    forward, backward = mesh_of(devices), mesh_of(devices[::-1])
    comms = {id(m): jax_ar.setup(m, "tp") for m in (forward, backward)}
    inner = jax.jit(lambda v: jax_ar.all_gather(v, "tp", tiled=True, to="invarying"))
    x = np.arange(n * 3, dtype=np.float32)
    for mesh in (forward, backward, forward):
        program = jax.jit(jax.shard_map(inner, mesh=mesh, in_specs=P("tp"), out_specs=P()))
        xs = global_array(x, mesh, P("tp"))
        text = program.lower(xs).as_text()
        named = set(re.findall(r"comm_id = (\d+)", text))
        assert named == {str(comms[id(mesh)].comm_id)}, (named, comms[id(mesh)])
        out = program(xs)
        for s in out.addressable_shards:
            assert_bitwise_equal(np.asarray(s.data), x, f"reused jaxpr on mesh {ids(mesh)}")
    for c in comms.values():
        c.close()
    log("reused_jaxpr: ok")


def suite_eager_and_set_mesh():
    """Eager shard_map (no jit) and jax.set_mesh with a shard_map given no
    mesh find their mesh's communicator too."""
    devices = jax.devices()
    n = len(devices)
    forward, backward = mesh_of(devices), mesh_of(devices[::-1])
    comms = [jax_ar.setup(m, "tp") for m in (forward, backward)]
    x = np.arange(n * 2, dtype=np.float32)
    gather = lambda v: jax_ar.all_gather(v, "tp", tiled=True, to="invarying")
    for mesh in (forward, backward):
        xs = global_array(x, mesh, P("tp"))
        outs = {"eager": jax.shard_map(gather, mesh=mesh, in_specs=P("tp"), out_specs=P())(xs)}
        with jax.set_mesh(mesh):
            outs["set_mesh"] = jax.jit(jax.shard_map(gather, in_specs=P("tp"),
                                                     out_specs=P()))(xs)
        for how, out in outs.items():
            for s in out.addressable_shards:
                assert_bitwise_equal(np.asarray(s.data), x, f"{how} on mesh {ids(mesh)}")
    for c in comms:
        c.close()
    log("eager_and_set_mesh: ok")


def suite_nested_shard_map():
    """A shard_map over "y" inside one over "x" (the inner one given no
    mesh: jax passes it the AbstractMesh), for two device orders of the
    (2, n/2) mesh: the inner calls find the outer mesh's devices."""
    devices = jax.devices()
    n = len(devices)
    rng = np.random.default_rng(SEED + 7)
    for order in (devices, devices[::-1]):
        grid = mesh_of(order, ("x", "y"), (2, n // 2))
        comm = jax_ar.setup(grid, "y")
        x = random_values(rng, (4, n), np.float32)

        def inner(u):
            return (jax_ar.all_reduce(u, "y"),
                    jax_ar.all_gather(u, "y", axis=1, tiled=True, to="invarying"))

        def outer(v):
            return jax.shard_map(inner, in_specs=P(None, "y"), out_specs=(P(), P()),
                                 axis_names={"y"})(v)

        program = jax.jit(jax.shard_map(outer, mesh=grid, in_specs=P("x"),
                                        out_specs=(P("x"), P("x")), axis_names={"x"}))
        xs = global_array(x, grid, P("x", "y"))
        text = program.lower(xs).as_text()  # jax_ar's kernels, not a jax.lax fallback
        assert {"jax_ar_all_reduce", "jax_ar_all_gather"} <= set(
            re.findall(r"@(jax_ar_\w+)", text)), text[:2000]
        summed, gathered = program(xs)
        halves = np.split(x, 2)  # rows of x-index 0 and 1
        want_sum = np.concatenate([np.sum(np.split(h, n // 2, axis=1), axis=0) for h in halves])
        for s in summed.addressable_shards:
            assert_bitwise_equal(np.asarray(s.data), want_sum[s.index], f"nested sum {ids(grid)}")
        for s in gathered.addressable_shards:
            assert_bitwise_equal(np.asarray(s.data), x[s.index], f"nested gather {ids(grid)}")
        comm.close()
    log("nested_shard_map: ok")


def suite_abstract_mesh():
    """A shard_map over an AbstractMesh outside jax.set_mesh: the devices
    are unknown while tracing, so the call is jax.lax's, logged once."""
    if ON_GPU:
        raise SuiteSkipped("jax.lax's all_gather is NCCL's, which refuses ranks sharing a GPU")
    devices = jax.devices()
    n = len(devices)
    mesh = mesh_of(devices[::-1])
    comm = jax_ar.setup(mesh, "tp")
    records = Records(logging.INFO)
    logger = logging.getLogger("jax_ar")
    level = logger.level
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    try:
        x = np.arange(n * 2, dtype=np.float32)
        out = jax.jit(jax.shard_map(lambda v: jax_ar.all_gather(v, "tp", tiled=True,
                                                                to="invarying"),
                                    mesh=mesh.abstract_mesh, in_specs=P("tp"),
                                    out_specs=P()))(global_array(x, mesh, P("tp")))
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    for s in out.addressable_shards:
        assert_bitwise_equal(np.asarray(s.data), x, "AbstractMesh")
    assert any("jax.lax" in m and "AbstractMesh" in m for m in records.messages), records.messages
    comm.close()
    log("abstract_mesh: ok")


def suite_partial_manual():
    """A shard_map manual over "tp" only, leaving "dp" (2 devices)
    automatic: XLA would gather a kernel's operand over "dp", so the calls
    are jax.lax's, logged, with psum's values and result sharding; a
    shard_map manual over both axes runs jax_ar's kernels."""
    if ON_GPU:
        raise SuiteSkipped("jax.lax's collectives are NCCL's, which refuse ranks sharing a GPU")
    devices = jax.devices()
    n = len(devices)
    grid = mesh_of(devices, ("dp", "tp"), (2, n // 2))
    comm = jax_ar.setup(grid, "tp")
    x = random_values(np.random.default_rng(SEED + 8), (4, n), np.float32)
    xs = global_array(x, grid, P("dp", "tp"))
    records = Records(logging.INFO)
    logging.getLogger("jax_ar").addHandler(records)
    try:
        results = {}
        for name, reduce, manual in (("jax_ar", jax_ar.all_reduce, {"tp"}),
                                     ("psum", jax.lax.psum, {"tp"}),
                                     ("jax_ar, every axis manual", jax_ar.all_reduce, None)):
            in_specs = P(None, "tp") if manual else P("dp", "tp")
            out_specs = P() if manual else P("dp")
            program = jax.jit(jax.shard_map(lambda v: reduce(v, "tp"), mesh=grid,
                                            in_specs=in_specs, out_specs=out_specs,
                                            **({"axis_names": manual} if manual else {})))
            kernels = set(re.findall(r"@(jax_ar_\w+)", program.lower(xs).as_text()))
            assert ("jax_ar_all_reduce" in kernels) == (manual is None), (name, kernels)
            results[name] = program(xs)
    finally:
        logging.getLogger("jax_ar").removeHandler(records)
    want = np.sum(np.split(x, n // 2, axis=1), axis=0)  # [4, 2]: the sum over "tp"
    for name, out in results.items():
        assert out.sharding.spec == results["psum"].sharding.spec, (name, out.sharding)
        for s in out.addressable_shards:
            assert_bitwise_equal(np.asarray(s.data), want[s.index], f"partial manual: {name}")
    assert any("leaves mesh axes ['dp'] automatic" in m for m in records.messages), \
        records.messages
    comm.close()
    log("partial_manual: ok")


def suite_close_one_of_two():
    """close() of one of two communicators of "tp": its mesh raises at trace
    time (jax_ar's error type: the communicator existed), the other's calls go
    on, and a new setup serves it again."""
    devices = jax.devices()
    n = len(devices)
    forward, backward = mesh_of(devices), mesh_of(devices[::-1])
    keep, drop = jax_ar.setup(forward, "tp"), jax_ar.setup(backward, "tp")
    drop.close()
    x = global_array(np.ones(n, np.float32), backward, P("tp"))
    program = jax.jit(jax.shard_map(lambda v: jax_ar.all_reduce(v, "tp"), mesh=backward,
                                    in_specs=P("tp"), out_specs=P()))
    expect_error(jax_ar.JaxArError, "was closed; call jax_ar.setup(mesh, 'tp') again",
                 lambda: program.trace(x))
    rng = np.random.default_rng(SEED + 6)
    check_cases(forward, collective_cases(n, rng), "the other one")
    again = jax_ar.setup(backward, "tp")
    check_cases(backward, collective_cases(n, rng), "set up again")
    keep.close()
    again.close()
    log("close_one_of_two: ok")


SUITES = suites_in(globals())


def main(argv):
    log(f"{jax.device_count()} devices, {jax.process_count()} processes")
    run_suites(SUITES, argv or list(SUITES))


if __name__ == "__main__":
    main_guard(main)
