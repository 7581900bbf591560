"""One rank of the GPU-only checks. Usage: cuda_kernels.py SUITE [SUITE...]

Suites: sizes, back_to_back, fused, replay_after_close, timeout. Each runs on
a communicator of its own. Values are compared bit for bit with the
emulated reduction order (tests/workers/common.py) and across processes.
"""
import os
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_ar
from jax_ar import _native
from common import (DTYPES, assert_bitwise_equal, assert_equal_nan_aware, emulate_all_reduce,
                    ffi_all_reduce, global_array, local_shards, log, main_guard, run_suites,
                    suites_in, random_values, same_on_all_processes)

SEED = int(os.environ.get("JAX_AR_TEST_SEED", "0"))
# How every failure message of both backends ends (cuda/common/failure_text.h).
ADVICE = "The communicator is unusable until close() and a new setup()."


def make_mesh():
    return jax.make_mesh((jax.device_count(),), ("tp",))


def sharded_call(mesh, fn, n_in, n_out, check_vma=True):
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=tuple(P("tp") for _ in range(n_in)),
                                 out_specs=tuple(P() for _ in range(n_out)), check_vma=check_vma))


def check_exact(name, out, parts, comm, op="sum"):
    """`out` against the host's reduction of `parts`, after `comm.check()`:
    a call whose kernels gave up (a deadline passed) returns whatever its
    outputs held, and the failure, not those bytes, is what to report."""
    jax.block_until_ready(out)
    comm.check()
    want = emulate_all_reduce(parts, op)
    for device, _, data in local_shards(out):
        assert_bitwise_equal(data, want, f"{name} on {device}")
    same_on_all_processes(name, [local_shards(out)[0][2]])


def gpu_capacities(comm):
    """Bytes one launch carries on the GPU, as the CUDA module computes them
    for its handlers (`capacities`: cuda/gpu/capacity.h)."""
    return {algorithm: comm.capacity_bytes(algorithm) for algorithm in ("oneshot", "twoshot")}


def suite_sizes(mesh):
    """Sizes around and above one launch's capacity, on a 1 MiB workspace so
    that several rounds are cheap; a pytree of more leaves than one launch
    takes; then the default workspace with one array as large as it."""
    n = jax.device_count()
    rng = np.random.default_rng(SEED + 11)
    comm = jax_ar.setup(mesh, "tp", workspace_bytes=1 << 20)
    assert comm.serves_calls, comm
    caps = gpu_capacities(comm)
    for algorithm, cap in caps.items():
        for nbytes in (4, cap - 16, cap, cap + 16, 2 * cap + 4, 3 * cap - 8):
            for dt in ("float32", "bfloat16"):
                size = max(1, nbytes // DTYPES[dt].itemsize)
                x = random_values(rng, (n * size,), DTYPES[dt])
                f = sharded_call(mesh, lambda v: (jax_ar.all_reduce(v, "tp", algorithm=algorithm),), 1, 1)
                out, = f(global_array(x, mesh, P("tp")))
                check_exact(f"sizes/{algorithm}/{dt}/{nbytes}", out, np.split(x, n), comm)
    # 60 leaves of mixed dtypes and odd sizes in one call (several launches).
    leaves = [random_values(rng, (n * (1 + 37 * i % 101),), DTYPES[("float32", "bfloat16", "float16", "int32")[i % 4]])
              for i in range(60)]
    for algorithm in ("oneshot", "twoshot"):
        f = sharded_call(mesh, lambda *vs: tuple(jax_ar.all_reduce(list(vs), "tp", algorithm=algorithm)),
                         len(leaves), len(leaves))
        outs = f(*[global_array(v, mesh, P("tp")) for v in leaves])
        for i, (leaf, out) in enumerate(zip(leaves, outs)):
            check_exact(f"sizes/pytree/{algorithm}/{i}", out, np.split(leaf, n), comm)
    comm.close()

    comm = jax_ar.setup(mesh, "tp")
    size = comm.workspace_bytes // 4  # float32 elements: as many bytes as the workspace
    x = random_values(rng, (n * size,), np.float32)
    for algorithm in ("oneshot", "twoshot"):
        f = sharded_call(mesh, lambda v: (jax_ar.all_reduce(v, "tp", algorithm=algorithm),), 1, 1)
        out, = f(global_array(x, mesh, P("tp")))
        check_exact(f"sizes/workspace/{algorithm}", out, np.split(x, n), comm)
    check_ll_two_shot_chunks(mesh, comm, rng)
    comm.close()
    log("sizes: ok")


def check_ll_two_shot_chunks(mesh, comm, rng):
    """The LL two-shot's kernel itself (algorithm code 3, whatever the cost
    model picks): from 16 KB a rank's chunk is rounded up to 512 bytes, so
    the last rank's is shorter (cuda/gpu/all_reduce.cc LLTwoShotChunk), or
    held to what a launch's slot carries. Sizes where the rounding moves the
    cut, one launch's capacity, and one vector past it."""
    n = jax.device_count()
    cap = comm.capacity_bytes("twoshot_ll")
    ll_two_shot = ffi_all_reduce(comm, "twoshot_ll")
    f = sharded_call(mesh, lambda v: (ll_two_shot(v),), 1, 1, check_vma=False)
    for nbytes in (n * (16 << 10) + 48, 523264, cap - 16, cap + 16):
        for dt in ("float32", "bfloat16"):
            size = nbytes // DTYPES[dt].itemsize
            x = random_values(rng, (n * size,), DTYPES[dt])
            out, = f(global_array(x, mesh, P("tp")))
            check_exact(f"sizes/twoshot_ll/{dt}/{nbytes}", out, np.split(x, n), comm)


def suite_back_to_back(mesh):
    """1,000 dependent calls in one jitted program (250 loop iterations of
    two one-shot and two two-shot calls, enough commands per iteration for
    XLA to record the body as a CUDA graph), run twice: launch numbers and
    buffer parity advance on the device, through graph replays when command
    buffers are on. Logs how often the handler ran in the second run (a
    handful under graphs, 1,000 without)."""
    n = jax.device_count()
    comm = jax_ar.setup(mesh, "tp")
    rng = np.random.default_rng(SEED + 12)
    small = random_values(rng, (n * 8192,), ml_dtypes.bfloat16)   # 16 KB per rank
    large = random_values(rng, (n * 300_000,), np.float32)        # 1.2 MB per rank
    iterations, calls_per_iteration = 250, 2
    # Scaling by a power of two is exact, so the emulation below matches bit
    # for bit; 1/n keeps the values from growing geometrically.
    shrink = 1.0 / n if n & (n - 1) == 0 else 0.5

    def body(a, b):
        def step(_, carry):
            ya, yb = carry
            for _ in range(calls_per_iteration):
                ya = jax_ar.all_reduce(ya * shrink + a, "tp", algorithm="oneshot")
                yb = jax_ar.all_reduce(yb * shrink + b, "tp", algorithm="twoshot")
            return ya, yb
        return jax.lax.fori_loop(0, iterations, step, (jnp.zeros_like(a), jnp.zeros_like(b)))

    f = sharded_call(mesh, body, 2, 2, check_vma=False)
    args = [global_array(v, mesh, P("tp")) for v in (small, large)]
    handler_calls = _native.backend_module("gpu").handler_calls
    for run in range(2):
        before = handler_calls()
        start = time.perf_counter()
        ya, yb = f(*args)
        ya.block_until_ready()
        log(f"back_to_back run {run}: {2 * iterations * calls_per_iteration} calls in "
            f"{time.perf_counter() - start:.3f} s, handler ran {handler_calls() - before} times")
    for name, x, out in (("oneshot/bf16", small, ya), ("twoshot/f32", large, yb)):
        parts = np.split(x, n)
        y = np.zeros_like(parts[0])
        for _ in range(iterations * calls_per_iteration):
            y = emulate_all_reduce([(y.astype(np.float32) * shrink + p.astype(np.float32)).astype(x.dtype)
                                    for p in parts], "sum")
        for device, _, data in local_shards(out):
            assert_equal_nan_aware(data, y, f"back_to_back/{name} on {device}")
        same_on_all_processes(f"back_to_back/{name}", [local_shards(out)[0][2]])
    comm.check()
    comm.close()
    log("back_to_back: ok")


def fused_reference(parts, residual, gamma, eps, quantize, scale, post_gamma=None, bias=None):
    """all_reduce + bias + post-norm + residual + RMSNorm as the fused kernel
    defines it, in numpy (gamma, post_gamma, bias: float32 [G, H], group g
    for rows [g T / G, (g + 1) T / G)): (out, residual_out, bound on
    residual_out's error). residual_out is exact (bound 0) without a
    post-norm, whose float64 reference is not a float32 computation."""
    dtype = parts[0].dtype
    rows_per_group = parts[0].shape[0] // gamma.shape[0]
    per_row = lambda v: np.repeat(v, rows_per_group, axis=0)  # noqa: E731
    t = parts[0].astype(np.float32)
    for p in parts[1:]:
        t = t + p.astype(np.float32)
    if bias is not None:
        t = t + per_row(bias)
    bound = 0.0
    if post_gamma is None:
        residual_out = (t + residual.astype(np.float32)).astype(residual.dtype)
    else:
        t64 = t.astype(np.float64)
        post = t64 / np.sqrt(np.mean(t64 * t64, axis=-1, keepdims=True) + eps) * per_row(post_gamma)
        residual_out = post + residual.astype(np.float64)
        ulp = 2.0**-23 if residual.dtype == np.float32 else 2.0**-7
        bound = (ulp + 1e-5) * (np.abs(residual_out) + np.abs(post))
    v = (residual_out.astype(residual.dtype) if post_gamma is not None else residual_out
         ).astype(np.float64)
    y = v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps) * per_row(gamma)
    if quantize:
        return np.clip(y / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn), residual_out, bound
    return y.astype(dtype), residual_out, bound


def fused_program(mesh, comm, hidden, algorithm, out_dtype, eps, quantize=False, post=False,
                  with_bias=False):
    """The FFI target jax_ar_all_reduce_rms_norm in a jitted shard_map of
    (x rows split over "tp", residual, gamma, scale, then post_gamma and
    bias where given) -> (out, residual_out), both replicated."""
    # Absent vectors are [0, H] constants inside the program, as the
    # primitive makes them: XLA:GPU's compiler crashes on a zero-size entry
    # parameter (scripts/repro/xla_gpu_zero_size_param.py).
    def body(xs, r, g, sc, *present):
        present = list(present)
        absent = jnp.zeros((0, hidden), jnp.float32)
        pg = present.pop(0) if post else absent
        b = present.pop(0) if with_bias else absent
        return jax.ffi.ffi_call(
            "jax_ar_all_reduce_rms_norm",
            (jax.ShapeDtypeStruct(xs.shape, out_dtype), jax.ShapeDtypeStruct(r.shape, r.dtype)))(
            xs, r, g, pg, b, sc, comm_id=np.int64(comm.comm_id),
            algorithm=np.int32(_native.ALGORITHM_CODES[algorithm]), eps=np.float32(eps),
            quantize=np.int32(quantize))

    return jax.jit(jax.shard_map(body, mesh=mesh,
                                 in_specs=(P("tp"),) + (P(),) * (3 + int(post) + int(with_bias)),
                                 out_specs=(P(), P()), check_vma=False))


def check_fused_layouts(mesh, comm, rng):
    """A row's outputs are the same bits however its launch spread rows over
    threads: one row alone (its threads over a cluster of blocks, one
    vector each), 128 / (2 n) rows at n ranks (the most that still have a
    cluster each, of two blocks: row_plan.h PlanFusedClusterRow and
    layout.h BlockCap), 48 rows (one block a row, two vectors a thread at
    hidden 8192), those 48 rows two-shot, and 8 rows two-shot (over LL
    packets, a group row a cluster; the readers make out from residual_out
    and the owner's inverse RMS): the row's sums of squares add in one
    order whatever the plan."""
    n = jax.device_count()
    eps = 1e-6
    many = 48
    layouts = (("one row", "oneshot", 1), ("two-block clusters", "oneshot", 64 // n),
               ("oneshot", "oneshot", many), ("twoshot", "twoshot", many),
               ("two-shot clusters", "twoshot", 8))
    for dtype, residual_dtype, hidden, post in (("bfloat16", "bfloat16", 4096, False),
                                                ("bfloat16", "bfloat16", 8192, False),
                                                ("bfloat16", "float32", 8192, True),
                                                ("float16", "float16", 6144, False)):
        dt, rdt = DTYPES[dtype], DTYPES[residual_dtype]
        x = rng.standard_normal((n, many, hidden)).astype(dt)
        residual = rng.standard_normal((many, hidden)).astype(rdt)
        gamma = (1 + 0.1 * rng.standard_normal((1, hidden))).astype(np.float32)
        vectors = [(1 + 0.1 * rng.standard_normal((1, hidden))).astype(np.float32)] if post else []
        results = {}
        for name, algorithm, tokens in layouts:
            f = fused_program(mesh, comm, hidden, algorithm, dt, eps, post=post)
            outs = f(global_array(x[:, :tokens].reshape(n * tokens, hidden), mesh, P("tp")),
                     global_array(residual[:tokens], mesh, P()), global_array(gamma, mesh, P()),
                     jnp.float32(1), *[global_array(v, mesh, P()) for v in vectors])
            jax.block_until_ready(outs)
            comm.check()
            results[name] = [local_shards(o)[0][2] for o in outs]
        case = f"fused layouts/{dtype}+{residual_dtype}/{hidden}/post{int(post)}"
        for name, _, rows in layouts[:2] + layouts[3:]:
            for what, got, want in zip(("out", "residual_out"), results[name],
                                       results["oneshot"]):
                assert_bitwise_equal(got, want[:rows], f"{case}: {what} of {name} against oneshot")
        same_on_all_processes(case, results["oneshot"])
    log("fused layouts: ok")


def suite_fused(mesh):
    """The FFI target jax_ar_all_reduce_rms_norm called directly (the Python
    primitive lives elsewhere): residual_out bit for bit (within float32
    rounding after a post-norm), out within the norm's rounding, every rank
    the same bits; several launches on a small workspace; a float32
    residual beside 16-bit x, post_gamma, bias and groups of rows with
    their own scale vectors (vmap over stacked layers)."""
    n = jax.device_count()
    rng = np.random.default_rng(SEED + 13)
    eps = 1e-6
    for workspace in (None, 4 << 20):
        comm = jax_ar.setup(mesh, "tp", workspace_bytes=workspace)
        # (x dtype, residual dtype, tokens, hidden, groups, post_gamma, bias)
        cases = [("bfloat16", "bfloat16", 1, 4096, 1, False, False),
                 ("bfloat16", "bfloat16", 37, 16384, 1, False, False),
                 ("float16", "float16", 64, 128, 1, False, False),
                 ("float32", "float32", 5, 8192, 1, False, False),
                 ("bfloat16", "bfloat16", 200, 1024, 1, False, False),
                 ("bfloat16", "float32", 3, 4096, 1, False, False),
                 ("float16", "float32", 40, 2048, 4, False, True),
                 ("bfloat16", "float32", 6, 8192, 3, True, True),
                 ("float32", "float32", 8, 1024, 2, True, False),
                 ("bfloat16", "bfloat16", 12, 16384, 2, True, True),
                 ("bfloat16", "bfloat16", 160, 4096, 1, False, False)]
        # On the default workspace the two-shot runs over LL packets in
        # the cases of up to 2 MB of x per rank with rows of one or two
        # vectors a thread (hidden up to 8192 in 16-bit types, 4096 in
        # float32), over plain data and flags in the others (hidden 16384,
        # float32 8192): both kernels, at every world size. The 160 rows
        # of hidden 4096 (1.25 MB) are more group rows than the block cap
        # has clusters for: one 512-thread block a row, rows in turns.
        if workspace is not None:
            # Several launches per call (groups straddle them; the two-shot
            # runs its plain kernel in every case here); with
            # 8 ranks the 16384-wide rows do not fit the LL region, so
            # one-shot calls run two-shot.
            cases = [("bfloat16", "bfloat16", 300, 2048, 1, False, False),
                     ("float32", "float32", 33, 4096, 1, False, False),
                     ("bfloat16", "bfloat16", 9, 16384, 1, False, False),
                     ("bfloat16", "float32", 300, 2048, 5, True, True),
                     ("float16", "float32", 10, 16384, 2, True, False)]
        for dtype, residual_dtype, tokens, hidden, groups, post, with_bias in cases:
            dt, rdt = DTYPES[dtype], DTYPES[residual_dtype]
            x = rng.standard_normal((n * tokens, hidden)).astype(dt)
            residual = rng.standard_normal((tokens, hidden)).astype(rdt)
            gamma = (1 + 0.1 * rng.standard_normal((groups, hidden))).astype(np.float32)
            post_gamma = ((1 + 0.1 * rng.standard_normal((groups, hidden))).astype(np.float32)
                          if post else None)
            bias = (rng.standard_normal((groups, hidden)).astype(np.float32) if with_bias
                    else None)
            for algorithm in ("oneshot", "twoshot"):
                for quantize in (False, True):
                    scale = np.float32(0.05)
                    out_dtype = ml_dtypes.float8_e4m3fn if quantize else dt

                    vectors = [v for v, on in ((post_gamma, post), (bias, with_bias)) if on]
                    f = fused_program(mesh, comm, hidden, algorithm, out_dtype, eps, quantize,
                                      post, with_bias)
                    out, residual_out = f(global_array(x, mesh, P("tp")),
                                          global_array(residual, mesh, P()),
                                          global_array(gamma, mesh, P()), jnp.float32(scale),
                                          *[global_array(v, mesh, P()) for v in vectors])
                    # A kernel that gave up (a deadline: ranks sharing one GPU
                    # whose blocks cannot all be resident at once) leaves its
                    # outputs undefined and records why: name that, not the
                    # values (an 8-rank case read zeros on 2026-12-01 with four
                    # test files sharing the H200).
                    jax.block_until_ready((out, residual_out))
                    comm.check()
                    want_out, want_res, bound = fused_reference(
                        np.split(x, n), residual, gamma, eps, quantize, scale,
                        post_gamma if post else None, bias if with_bias else None)
                    name = (f"fused/{algorithm}/{dtype}+{residual_dtype}/{tokens}x{hidden}/"
                            f"g{groups}/post{int(post)}/bias{int(with_bias)}/q{int(quantize)}")
                    for device, _, data in local_shards(residual_out):
                        assert data.dtype == rdt, (name, data.dtype)
                        if post:
                            error = np.abs(data.astype(np.float64) - want_res)
                            assert (error <= bound).all(), \
                                f"{name} residual_out on {device}: off by {error.max()}"
                        else:
                            assert_bitwise_equal(data, want_res, f"{name} residual_out on {device}")
                    if post:  # out is the norm of what residual_out holds
                        v = local_shards(residual_out)[0][2].astype(np.float64)
                        y = v / np.sqrt(np.mean(v * v, -1, keepdims=True) + eps) * np.repeat(
                            gamma, tokens // groups, axis=0)
                        want_out = (np.clip(y / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
                                    if quantize else y.astype(dt))
                    for device, _, data in local_shards(out):
                        got, want = data.astype(np.float64), want_out.astype(np.float64)
                        ulp = {np.dtype(np.float32): 2**-21, DTYPES["bfloat16"]: 2**-7,
                               DTYPES["float16"]: 2**-10}[dt]
                        tol = (2**-3 * np.abs(want) + 2**-9) if quantize else (ulp * np.abs(want) + ulp)
                        bad = np.abs(got - want) > tol
                        assert not bad.any(), (f"{name} out on {device}: {bad.sum()} elements off, "
                                               f"first got {got[bad][0]} want {want[bad][0]}")
                    same_on_all_processes(name, [local_shards(out)[0][2].view(np.uint8),
                                                 local_shards(residual_out)[0][2]])
        if workspace is None:
            check_fused_layouts(mesh, comm, rng)
        comm.check()
        comm.close()
    log("fused: ok")


def suite_replay_after_close(mesh):
    """A compiled program kept across close(): running it again must not
    touch the freed workspaces. It either fails with jax_ar's error (XLA
    re-records the command buffer, so the handler runs and finds no
    communicator) or its kernels find their token gone and write all-ones
    bits; it never crashes, hangs or returns a plausible wrong value."""
    n = jax.device_count()
    comm = jax_ar.setup(mesh, "tp")
    x = np.arange(n * 1024, dtype=np.float32)
    f = sharded_call(mesh, lambda v: (jax_ar.all_reduce(v, "tp", algorithm="oneshot"),), 1, 1)
    xs = global_array(x, mesh, P("tp"))
    compiled = f.lower(xs).compile()
    out, = compiled(xs)
    check_exact("replay/before", out, np.split(x, n), comm)
    comm.close()
    try:
        out, = compiled(xs)
        data = local_shards(out)[0][2]
        assert (data.view(np.uint32) == 0xFFFFFFFF).all(), f"stale launch returned {data[:4]}"
        log("replay after close: stale kernels wrote all-ones")
    except Exception as e:  # noqa: BLE001 - XLA wraps the handler's error
        assert "jax_ar" in str(e), e
        log(f"replay after close: handler refused ({str(e).splitlines()[0][:120]})")
    comm = jax_ar.setup(mesh, "tp")
    out, = sharded_call(mesh, lambda v: (jax_ar.all_reduce(v, "tp"),), 1, 1)(xs)
    check_exact("replay/after setup", out, np.split(x, n), comm)
    comm.close()
    log("replay_after_close: ok")


def suite_timeout(mesh):
    """Rank 1 skips a call: the others' kernels give up after timeout_s and
    every rank's error names jax_ar, itself and rank 1; nothing hangs, and a
    new setup after close() works again."""
    from jax_ar import _compat

    n = jax.device_count()
    me = jax.process_index()
    client = _compat.distributed_client()
    timeout_s = 3.0
    comm = jax_ar.setup(mesh, "tp", timeout_s=timeout_s)
    x = np.ones((n * 4096,), np.float32)
    xs = global_array(x, mesh, P("tp"))
    f = sharded_call(mesh, lambda v: (jax_ar.all_reduce(v, "tp", algorithm="oneshot"),), 1, 1)
    out, = f(xs)
    check_exact("timeout/warmup", out, np.split(x, n), comm)
    # Compiled by every rank now: XLA's sharded autotuning makes a program
    # that only some processes compile wait for the others forever.
    g = sharded_call(mesh, lambda v: (jax_ar.all_reduce(v * 2, "tp"),), 1, 1).lower(xs).compile()

    def expect_failure(where):
        try:
            comm.check()
        except jax_ar.JaxArError as e:
            text = str(e)
            # Rank 1 is the one every other rank timed out waiting for.
            for fragment in ("jax_ar", f"rank {me}", "rank 1", "timed out", "all_reduce", "call ",
                             ADVICE):
                assert fragment in text, f"{where}: {fragment!r} missing from: {text}"
            log(f"{where}: {text[:200]}")
            return
        raise AssertionError(f"{where}: comm.check() did not raise")

    def call_that_fails():
        # GPU kernels give up and record the failure (check() reports it);
        # the CPU backend raises from the call itself.
        start = time.perf_counter()
        try:
            f(xs)[0].block_until_ready()
        except Exception as e:  # noqa: BLE001 - XLA wraps the handler's error
            assert "jax_ar" in str(e), e
        return time.perf_counter() - start

    if me != 1:
        waited = call_that_fails()
        assert waited < timeout_s + 15, f"the call took {waited:.1f} s"
        expect_failure("skipped peer")
        # Another program records its command buffer now, so its handler runs
        # and refuses the broken communicator.
        try:
            g(xs)[0].block_until_ready()
        except Exception as e:  # noqa: BLE001 - XLA wraps the handler's error
            assert all(fragment in str(e) for fragment in
                       ("jax_ar", "failed earlier", f"rank {me}", "timed out", ADVICE)), e
        else:
            raise AssertionError("a call on a failed communicator did not raise")
        client.key_value_set(f"test/timeout/{me}", "done")
    else:
        for p in range(n):
            if p != 1:
                client.blocking_key_value_get(f"test/timeout/{p}", 120_000)
        waited = call_that_fails()  # its peers gave up and told it so
        assert waited < timeout_s + 15, f"the call took {waited:.1f} s"
        if jax.devices()[0].platform == "gpu":
            expect_failure("the skipping rank")
    # Nobody frees a workspace that a peer's kernel may still write to.
    client.key_value_set(f"test/timeout_end/{me}", "done")
    for p in range(n):
        client.blocking_key_value_get(f"test/timeout_end/{p}", 120_000)
    comm.close()
    comm = jax_ar.setup(mesh, "tp")
    out, = sharded_call(mesh, lambda v: (jax_ar.all_reduce(v, "tp"),), 1, 1)(xs)
    check_exact("timeout/after new setup", out, np.split(x, n), comm)
    comm.close()
    log("timeout: ok")


SUITES = suites_in(globals())


def main(argv):
    mesh = make_mesh()
    log(f"{jax.device_count()} devices, {jax.process_count()} processes on "
        f"{jax.devices()[0].device_kind}")
    run_suites(SUITES, argv or list(SUITES), mesh)


if __name__ == "__main__":
    main_guard(main)
