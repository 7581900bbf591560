"""One rank of the jax_ar.all_reduce_rms_norm tests.
Usage: ops_all_reduce_rms_norm.py [SUITE...]

Suites: values, general, psum, grad, vmap, bad_input. Each rank holds its
part of x (rows of a global array sharded over "tp"); residual and gamma
are replicated. residual_out is checked bit for bit against numpy's float32
rank-order sum, out against float64 (or its float8 quantization), and both
must be identical on every rank.

The communicator is set up with the smallest workspace (1 MiB) so that
large calls take several rounds through it and rows too long for one round
take the general path.
"""
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_ar
from common import (assert_equal_nan_aware, expect_error, global_array, local_shards, log,
                    SuiteSkipped, main_guard, suites_in,
                    run_communicator_suites, same_on_all_processes)
from norm_checks import (FLOAT_DTYPES, add_residual, assert_norm_close,
                         norm_float64, norm_tolerance, random_normal,
                         sum_in_rank_order)

ON_GPU = os.environ.get("JAX_AR_TEST_PLATFORM", "cpu") == "gpu"
SEED = int(os.environ.get("JAX_AR_TEST_SEED", "0"))
WORKSPACE_BYTES = 1 << 20


class Case:
    """One call: shapes, dtype, eps and optional FP8 scale, with its data."""

    def __init__(self, rng, world, shape, dtype, eps=1e-6, quant_scale=None, scale=1.0):
        self.shape, self.dtype, self.eps, self.quant_scale = shape, np.dtype(dtype), eps, quant_scale
        self.parts = [random_normal(rng, shape, dtype, scale) for _ in range(world)]
        self.residual = random_normal(rng, shape, dtype, scale)
        self.gamma = random_normal(rng, shape[-1:], dtype)

    def __str__(self):
        q = f" fp8/{self.quant_scale}" if self.quant_scale is not None else ""
        return f"{self.dtype}{self.shape} eps={self.eps}{q}"

    def global_x(self):  # rank r's part is rows [r*T, (r+1)*T) along dim 0
        return np.concatenate(self.parts, axis=0)

    def check(self, out, residual_out, what, exact_residual=True):
        """Checks the local shards of the (invariant) results."""
        self.check_local([np.asarray(s.data) for s in out.addressable_shards],
                         [np.asarray(s.data) for s in residual_out.addressable_shards],
                         what, exact_residual)

    def check_local(self, outs, residual_outs, what, exact_residual=True):
        """outs / residual_outs: this process's copies, one per local rank."""
        want_residual = add_residual(sum_in_rank_order(self.parts), self.residual)
        want_out = norm_float64(want_residual, self.gamma, self.eps)
        for rank, (got_out, got_residual) in enumerate(zip(outs, residual_outs)):
            where = f"{what} {self} (local rank {rank})"
            if exact_residual:
                assert_equal_nan_aware(got_residual, want_residual, where + " residual_out")
            else:  # psum: XLA's order of the sum; float32 rounding of each
                # partial sum is relative to the summands, not to the result
                terms = [p.astype(np.float64) for p in self.parts + [self.residual]]
                error = np.abs(got_residual.astype(np.float64) - sum(terms))
                bound = norm_tolerance(sum(np.abs(t) for t in terms), self.dtype)
                assert (error <= bound).all(), f"{where} residual_out: off by {error.max()}"
            # The norm of what was stored (the rounded residual_out)...
            assert_norm_close(got_out, norm_float64(got_residual, self.gamma, self.eps),
                              where + " out", self.quant_scale)
            if exact_residual:  # ...which is the reference's residual stream
                assert_norm_close(got_out, want_out, where + " out", self.quant_scale)
        for copies in (outs, residual_outs):
            for other in copies[1:]:
                assert_equal_nan_aware(other, copies[0], f"{what} {self}: local ranks differ")
        _checks[0] += 1
        same_on_all_processes(f"{what}-{_checks[0]}", [outs[0], residual_outs[0]])


_checks = [0]  # makes every cross-process comparison's key unique


def run_cases(mesh, cases, algorithm):
    """Every case in one jitted shard_map program (independent calls: jax_ar
    keeps them in program order on CPU); returns [(out, residual_out)]."""
    def body(*flat):
        results = []
        for i, case in enumerate(cases):
            x, residual, gamma = flat[3 * i: 3 * i + 3]
            results.append(jax_ar.all_reduce_rms_norm(x, residual, gamma, "tp", eps=case.eps,
                                                      algorithm=algorithm,
                                                      quant_scale=case.quant_scale))
        return results

    in_specs = tuple(s for _ in cases for s in (P("tp"), P(), P()))
    out_specs = [(P(), P()) for _ in cases]
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs))
    args = [a for c in cases for a in (global_array(c.global_x(), mesh, P("tp")),
                                       global_array(c.residual, mesh, P()),
                                       global_array(c.gamma, mesh, P()))]
    return f(*args)


def kernel_cases(rng, world):
    """Shapes the fused kernels take, every dtype, with and without FP8."""
    cases = []
    for dt in FLOAT_DTYPES:
        cases += [Case(rng, world, (1, 128), dt), Case(rng, world, (3, 384), dt, eps=1e-5),
                  Case(rng, world, (2, 3, 1024), dt),
                  Case(rng, world, (5, 256), dt, quant_scale=0.05),
                  Case(rng, world, (1, 2048), dt, quant_scale=2.0)]
    for _ in range(4):  # random sizes
        dt = str(rng.choice(list(FLOAT_DTYPES)))
        vector = 4 if dt == "float32" else 8
        hidden = vector * int(rng.integers(128 // vector, 4096 // vector + 1))
        cases.append(Case(rng, world, (int(rng.integers(1, 40)), hidden), dt,
                          quant_scale=[None, 0.5][int(rng.integers(0, 2))]))
    # Several rounds through the workspace, FP8 saturation
    # (|out / scale| far beyond 448) and a large hidden size.
    cases.append(Case(rng, world, (100, 1024), "bfloat16"))
    cases.append(Case(rng, world, (4, 512), "float16", quant_scale=1e-3))
    cases.append(Case(rng, world, (2, 16384), "bfloat16"))
    return cases


def suite_values(mesh, comm):
    rng = np.random.default_rng(SEED + 21)
    cases = kernel_cases(rng, comm.world_size)
    for algorithm in ("oneshot", "twoshot", "auto"):
        for case, (out, residual_out) in zip(cases, run_cases(mesh, cases, algorithm)):
            case.check(out, residual_out, algorithm)
    # Special values: a NaN in one rank's part poisons its row only, and a
    # NaN stays NaN through the FP8 quantization.
    case = Case(rng, comm.world_size, (3, 256), "float32")
    case.parts[-1][1, 7] = np.nan
    scaled = Case(rng, comm.world_size, (3, 256), "bfloat16", quant_scale=0.25)
    scaled.parts[0][0, 0] = np.nan
    for c, (out, residual_out) in zip((case, scaled), run_cases(mesh, [case, scaled], "auto")):
        c.check(out, residual_out, "specials")
        row_nan = np.isnan(np.asarray(out.addressable_shards[0].data, np.float32)).any(-1)
        assert row_nan.tolist() == [c is scaled, c is case, False], row_nan
    log(f"values: {len(cases)} cases x 3 algorithms ok")


def suite_general(mesh, comm):
    """Hidden sizes the fused kernels do not take run all_reduce + a
    separate norm, with the same arithmetic (residual_out still exact)."""
    rng = np.random.default_rng(SEED + 22)
    world = comm.world_size
    cases = [Case(rng, world, (2, 100), "float32"), Case(rng, world, (3, 64), "bfloat16"),
             Case(rng, world, (1, 20000), "float16", quant_scale=0.5),
             Case(rng, world, (2, 132), "bfloat16")]
    # A float32 row of 16384 exceeds what one call carries with 8 ranks.
    cases.append(Case(rng, world, (2, 16384), "float32"))
    for case, (out, residual_out) in zip(cases, run_cases(mesh, cases, "auto")):
        case.check(out, residual_out, "general")
    log("general: ok")


def suite_psum(mesh, comm):
    if ON_GPU:
        raise SuiteSkipped("NCCL (psum) refuses ranks sharing a GPU")
    rng = np.random.default_rng(SEED + 23)
    cases = [Case(rng, comm.world_size, (3, 256), dt) for dt in FLOAT_DTYPES]
    cases.append(Case(rng, comm.world_size, (2, 512), "bfloat16", quant_scale=0.1))
    for case, (out, residual_out) in zip(cases, run_cases(mesh, cases, "psum")):
        case.check(out, residual_out, "psum", exact_residual=False)
    log("psum: ok")


def unfused(x, residual, gamma, eps=1e-6):
    """The composition the derivatives must match: all_reduce + add + norm."""
    t = jax_ar.all_reduce(x, "tp") + residual
    v = t.astype(jnp.float32)
    out = v * jax.lax.rsqrt(jnp.mean(v * v, -1, keepdims=True) + eps) * gamma.astype(jnp.float32)
    return out.astype(x.dtype), t


def suite_grad(mesh, comm):
    if comm.psum_unavailable:  # transposes of replicated inputs are JAX's own psums
        raise SuiteSkipped(comm.psum_unavailable)
    rng = np.random.default_rng(SEED + 24)
    world = comm.world_size
    fused = lambda a, b, c: jax_ar.all_reduce_rms_norm(a, b, c, "tp")
    for dt, rtol in (("float32", 2e-5), ("bfloat16", 3e-2)):
        case = Case(rng, world, (4, 256), dt)
        weights = jnp.asarray(random_normal(rng, (4, 256), np.float32))
        args = (global_array(case.global_x(), mesh, P("tp")), global_array(case.residual, mesh, P()),
                global_array(case.gamma, mesh, P()))

        def loss_of(out, residual_out):
            return (jnp.sum(jnp.sin(out.astype(jnp.float32)) * weights)
                    + jnp.sum(residual_out.astype(jnp.float32) ** 2))

        def outer(fn, check_vma):  # grad of a function that calls shard_map
            sm = jax.shard_map(fn, mesh=mesh, in_specs=(P("tp"), P(), P()), out_specs=(P(), P()),
                               check_vma=check_vma)
            return jax.jit(jax.grad(lambda *a: loss_of(*sm(*a)), argnums=(0, 1, 2)))

        def inner(fn, check_vma):  # grad taken inside the shard_map body
            def body(a, b, c):
                return jax.grad(lambda *u: loss_of(*fn(*u)), argnums=(0, 1, 2))(a, b, c)
            return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp"), P(), P()),
                                         out_specs=(P("tp"), P(), P()), check_vma=check_vma))

        for make, check_vma in ((outer, True), (inner, True), (outer, False)):
            got = make(fused, check_vma)(*args)
            want = make(unfused, check_vma)(*args)
            for name, g, w in zip(("x", "residual", "gamma"), got, want):
                for (device, _, gd), (_, _, wd) in zip(local_shards(g), local_shards(w)):
                    scale = float(np.abs(wd.astype(np.float32)).max())
                    np.testing.assert_allclose(
                        gd.astype(np.float32), wd.astype(np.float32), rtol=rtol,
                        atol=rtol * scale,
                        err_msg=f"grad {dt} {make.__name__} check_vma={check_vma} wrt {name} "
                                f"on {device}")
    # FP8 output: a clear error instead of a gradient.
    case = Case(rng, world, (2, 128), "float32")
    args = (global_array(case.global_x(), mesh, P("tp")), global_array(case.residual, mesh, P()),
            global_array(case.gamma, mesh, P()))
    for algorithm in ("auto", "psum") if not ON_GPU else ("auto",):
        f = jax.shard_map(lambda a, b, c: jax_ar.all_reduce_rms_norm(
            a, b, c, "tp", quant_scale=0.5, algorithm=algorithm)[0].astype(jnp.float32),
            mesh=mesh, in_specs=(P("tp"), P(), P()), out_specs=P())
        expect_error(NotImplementedError, "not differentiable",
                     lambda: jax.jit(jax.grad(lambda *a: jnp.sum(f(*a))))(*args))
    log("grad: ok")


def suite_vmap(mesh, comm):
    rng = np.random.default_rng(SEED + 25)
    world = comm.world_size
    cases = [Case(rng, world, (2, 256), "bfloat16") for _ in range(3)]
    x = np.stack([c.global_x() for c in cases], axis=1)  # [world*2, batch, 256]
    residual = np.stack([c.residual for c in cases])  # [batch, 2, 256]
    gamma = cases[0].gamma
    for c in cases:
        c.gamma = gamma

    def body(a, b, g):
        return jax.vmap(lambda u, v: jax_ar.all_reduce_rms_norm(u, v, g, "tp"),
                        in_axes=(1, 0))(a, b)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp"), P(), P()),
                              out_specs=(P(), P())))
    out, residual_out = f(global_array(x, mesh, P("tp")), global_array(residual, mesh, P()),
                          global_array(gamma, mesh, P()))
    outs = [np.asarray(s.data) for s in out.addressable_shards]
    residual_outs = [np.asarray(s.data) for s in residual_out.addressable_shards]
    for b, c in enumerate(cases):
        c.check_local([o[b] for o in outs], [r[b] for r in residual_outs], f"vmap {b}")
    log("vmap: ok")


def suite_bad_input(mesh, comm):
    world = comm.world_size
    x = global_array(np.ones((world * 2, 128), np.float32), mesh, P("tp"))
    r = global_array(np.ones((2, 128), np.float32), mesh, P())
    g = global_array(np.ones((128,), np.float32), mesh, P())

    def call(fn, *args):
        args = args or (x, r, g)
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P("tp"), P(), P()),
                                     out_specs=(P(), P())))(*args)

    arn = jax_ar.all_reduce_rms_norm
    expect_error(ValueError, "residual has shape (2, 64)",
                 lambda: call(lambda a, b, c: arn(a, b[:, :64], c, "tp")))
    expect_error(ValueError, "gamma has shape (127,)",
                 lambda: call(lambda a, b, c: arn(a, b, c[:127], "tp")))
    expect_error(TypeError, "residual has dtype bfloat16",
                 lambda: call(lambda a, b, c: arn(a, b.astype(jnp.bfloat16), c, "tp")))
    expect_error(TypeError, "gamma has dtype float16",
                 lambda: call(lambda a, b, c: arn(a, b, c.astype(jnp.float16), "tp")))
    expect_error(TypeError, "x has dtype int32",
                 lambda: call(lambda a, b, c: arn(a.astype(jnp.int32), b.astype(jnp.int32),
                                                  c.astype(jnp.int32), "tp")))
    for eps in (0.0, -1.0, float("nan"), float("inf")):
        expect_error(ValueError, "eps must be positive",
                     lambda: call(lambda a, b, c: arn(a, b, c, "tp", eps=eps)))
    for scale, kind, fragment in ((0.0, ValueError, "positive"), (-2.0, ValueError, "positive"),
                                  (float("nan"), ValueError, "positive"),
                                  (np.ones(2, np.float32), ValueError, "scalar"),
                                  (np.ones((1, 1), np.float32), ValueError, "scalar"),
                                  ("1.0", TypeError, "quant_scale"),
                                  (np.int32(3), TypeError, "float dtype"),
                                  (True, TypeError, "quant_scale")):
        expect_error(kind, fragment,
                     lambda: call(lambda a, b, c: arn(a, b, c, "tp", quant_scale=scale)))
    expect_error(ValueError, "algorithm must be",
                 lambda: call(lambda a, b, c: arn(a, b, c, "tp", algorithm="ring")))
    expect_error(ValueError, "outside jax.shard_map", lambda: jax.jit(
        lambda a, b, c: arn(a, b, c, "tp"))(np.ones((2, 128), np.float32),
                                            np.ones((2, 128), np.float32),
                                            np.ones(128, np.float32)))
    log("bad_input: ok")


SUITES = suites_in(globals())


def main(argv):
    run_communicator_suites(SUITES, argv, workspace_bytes=WORKSPACE_BYTES)


if __name__ == "__main__":
    main_guard(main)
