"""One rank of the jax_ar.all_reduce_rms_norm tests.
Usage: ops_all_reduce_rms_norm.py [SUITE...]

Suites: values, mixed_dtypes, post_norm_bias, general, psum, auto_paths,
grad, grad_new_arguments, vmap, vmap_per_member, bad_input. Each rank holds
its part of x (rows of a global array sharded over "tp"); residual and the
scale vectors are replicated. residual_out is checked bit for bit against
numpy's float32 rank-order sum (within float32 rounding after a post-norm,
whose float64 reference is not a float32 computation), out against float64
(or its float8 quantization), and both must be identical on every rank.

The communicator is set up with the smallest workspace (1 MiB) so that
large calls take several rounds through it and rows too long for one round
take the general path.
"""
import json
import os
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_ar
from jax_ar import selection
from jax_ar.ops.rms_norm import fused_refuses
from jax_ar.selection import table as _table
from common import (assert_equal_nan_aware, environment, expect_error, global_array,
                    local_shards, log, SuiteSkipped, main_guard, norm_auto_takes_pair, suites_in,
                    run_communicator_suites, same_on_all_processes)
from norm_checks import (FLOAT32_EVALUATION, FLOAT_DTYPES, FP8, add_residual,
                         assert_norm_close, assert_within, norm_float64, norm_tolerance,
                         post_norm_float64, random_normal, scale_vector, sum_in_rank_order)

ON_GPU = os.environ.get("JAX_AR_TEST_PLATFORM", "cpu") == "gpu"
SEED = int(os.environ.get("JAX_AR_TEST_SEED", "0"))
WORKSPACE_BYTES = 1 << 20


class Case:
    """One call: shapes, dtypes, eps, scale_offset, optional post_gamma, bias
    and FP8 scale, with its data."""

    def __init__(self, rng, world, shape, dtype, eps=1e-6, quant_scale=None, scale=1.0,
                 residual_dtype=None, gamma_dtype=None, offset=0.0, post_norm=False,
                 bias=False):
        self.shape, self.dtype, self.eps, self.quant_scale = shape, np.dtype(dtype), eps, quant_scale
        self.residual_dtype = np.dtype(residual_dtype or dtype)
        gamma_dtype = np.dtype(gamma_dtype or dtype)
        self.offset = offset
        self.parts = [random_normal(rng, shape, dtype, scale) for _ in range(world)]
        self.residual = random_normal(rng, shape, self.residual_dtype, scale)
        # Around 1 with the offset (Gemma's zero-centred scale), else around 0.
        self.gamma = random_normal(rng, shape[-1:], gamma_dtype, 0.3 if offset else 1.0)
        self.post_gamma = (random_normal(rng, shape[-1:], gamma_dtype, 0.3 if offset else 1.0)
                           if post_norm else None)
        self.bias = random_normal(rng, shape[-1:], gamma_dtype, scale) if bias else None

    def __str__(self):
        q = f" fp8/{self.quant_scale}" if self.quant_scale is not None else ""
        extra = "".join([f" residual={self.residual_dtype}" * (self.residual_dtype != self.dtype),
                         f" gamma={self.gamma.dtype}" * (self.gamma.dtype != self.dtype),
                         f" offset={self.offset}" * bool(self.offset),
                         " post_norm" * (self.post_gamma is not None),
                         " bias" * (self.bias is not None)])
        return f"{self.dtype}{self.shape} eps={self.eps}{q}{extra}"

    def kwargs(self):
        return dict(eps=self.eps, quant_scale=self.quant_scale, scale_offset=self.offset)

    def vectors(self):
        """(gamma, post_gamma, bias) as passed (None for those not given)."""
        return self.gamma, self.post_gamma, self.bias

    def global_x(self):  # rank r's part is rows [r*T, (r+1)*T) along dim 0
        return np.concatenate(self.parts, axis=0)

    def reference(self, pair=False):
        """(residual_out reference, its bound (0: bit for bit)): float32
        rank-order sum (+ bias in float32), post-norm in float64, residual
        added and rounded. pair: the sum rounded to x's dtype first, as
        jax_ar.all_reduce then jax_ar.rms_norm compute."""
        total = sum_in_rank_order(self.parts)
        if pair:
            total = total.astype(self.dtype).astype(np.float32)
        if self.bias is not None:
            total = total + scale_vector(self.bias)
        if self.post_gamma is None:
            return add_residual(total, self.residual), 0.0
        post = post_norm_float64(total, scale_vector(self.post_gamma, self.offset), self.eps)
        ref = post + self.residual.astype(np.float64)
        # float32 evaluation of the post-norm, then one rounding of the sum.
        bound = (norm_tolerance(ref, self.residual_dtype)
                 + FLOAT32_EVALUATION * np.abs(post))
        return ref, bound

    def check(self, out, residual_out, what, exact_residual=True, pair=False):
        """Checks the local shards of the (invariant) results."""
        self.check_local([np.asarray(s.data) for s in out.addressable_shards],
                         [np.asarray(s.data) for s in residual_out.addressable_shards],
                         what, exact_residual, pair)

    def check_local(self, outs, residual_outs, what, exact_residual=True, pair=False):
        """outs / residual_outs: this process's copies, one per local rank."""
        want_residual, bound = self.reference(pair)
        gamma = scale_vector(self.gamma, self.offset)
        for rank, (got_out, got_residual) in enumerate(zip(outs, residual_outs)):
            where = f"{what} {self} (local rank {rank})"
            assert got_residual.dtype == self.residual_dtype, (where, got_residual.dtype)
            assert got_out.dtype == (FP8 if self.quant_scale is not None else self.dtype), \
                (where, got_out.dtype)
            if not exact_residual:  # psum: XLA's order of the sum; float32 rounding of each
                # partial sum is relative to the summands, not to the result
                terms = [p.astype(np.float64) for p in self.parts + [self.residual]]
                if self.bias is not None:
                    terms.append(scale_vector(self.bias).astype(np.float64))
                if self.post_gamma is None:
                    bound = norm_tolerance(sum(np.abs(t) for t in terms), self.residual_dtype)
                    want_residual = sum(terms)
                else:
                    bound = bound + norm_tolerance(sum(np.abs(t) for t in terms),
                                                   np.float32) * 4
            if np.ndim(bound) == 0 and bound == 0 and exact_residual:
                assert_equal_nan_aware(got_residual, want_residual, where + " residual_out")
            else:
                assert_within(got_residual, want_residual, bound, where + " residual_out")
            # The norm of what was stored (the rounded residual_out)...
            assert_norm_close(got_out, norm_float64(got_residual, gamma, self.eps),
                              where + " out", self.quant_scale)
        for copies in (outs, residual_outs):
            for other in copies[1:]:
                assert_equal_nan_aware(other, copies[0], f"{what} {self}: local ranks differ")
        _checks[0] += 1
        same_on_all_processes(f"{what}-{_checks[0]}", [outs[0].view(np.uint8),
                                                       residual_outs[0]])


_checks = [0]  # makes every cross-process comparison's key unique


def run_cases(mesh, cases, algorithm):
    """Every case in one jitted shard_map program (independent calls: jax_ar
    keeps them in program order on CPU); returns [(out, residual_out)]."""
    given = [[v is not None for v in case.vectors()] for case in cases]

    def body(*flat):
        results, it = [], iter(flat)
        for case, present in zip(cases, given):
            x, residual = next(it), next(it)
            gamma, post_gamma, bias = (next(it) if p else None for p in present)
            results.append(jax_ar.all_reduce_rms_norm(x, residual, gamma, "tp",
                                                      algorithm=algorithm, post_gamma=post_gamma,
                                                      bias=bias, **case.kwargs()))
        return results

    in_specs, args = [], []
    for case in cases:
        in_specs += [P("tp"), P()]
        args += [global_array(case.global_x(), mesh, P("tp")), global_array(case.residual, mesh, P())]
        for v in case.vectors():
            if v is not None:
                in_specs.append(P())
                args.append(global_array(v, mesh, P()))
    out_specs = [(P(), P()) for _ in cases]
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=tuple(in_specs), out_specs=out_specs))
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


def auto_takes_pair(comm, case) -> bool:
    """Whether algorithm="auto" runs this case as the pair (common.py)."""
    plain = case.quant_scale is None and case.post_gamma is None and case.bias is None
    return norm_auto_takes_pair(comm, case.shape, case.dtype, case.residual_dtype, plain)


def check_cases(mesh, comm, cases, algorithm, what=None):
    for case, (out, residual_out) in zip(cases, run_cases(mesh, cases, algorithm)):
        case.check(out, residual_out, what or algorithm,
                   pair=algorithm == "auto" and auto_takes_pair(comm, case))


def suite_values(mesh, comm):
    rng = np.random.default_rng(SEED + 21)
    cases = kernel_cases(rng, comm.world_size)
    for algorithm in ("oneshot", "twoshot", "auto"):
        check_cases(mesh, comm, cases, algorithm)
    # Special values: a NaN in one rank's part poisons its row only, and a
    # NaN stays NaN through the FP8 quantization.
    case = Case(rng, comm.world_size, (3, 256), "float32")
    case.parts[-1][1, 7] = np.nan
    scaled = Case(rng, comm.world_size, (3, 256), "bfloat16", quant_scale=0.25)
    scaled.parts[0][0, 0] = np.nan
    for c, (out, residual_out) in zip((case, scaled), run_cases(mesh, [case, scaled], "auto")):
        c.check(out, residual_out, "specials", pair=auto_takes_pair(comm, c))
        row_nan = np.isnan(np.asarray(out.addressable_shards[0].data, np.float32)).any(-1)
        assert row_nan.tolist() == [c is scaled, c is case, False], row_nan
    log(f"values: {len(cases)} cases x 3 algorithms ok")


def suite_large_values(mesh, comm):
    """Rows whose squares float32 cannot sum: squares that overflow it, and
    tiny values beside an eps at float32's smallest normal number, whose
    squares are subnormal. The fused kernels sum such a row again in double
    (a float32 sum turned overflowing rows into zeros), in a block shared
    with rows that float32 serves (3 rows of 256) and in a cluster a row
    (2 rows of 512 vectors: the fused one-shot's clusters). The fuzz cases
    could not catch it here: each of their rows with special values also
    holds a NaN or inf."""
    rng = np.random.default_rng(SEED + 29)
    cases = []
    # (dtype, shape, a second row overflowing through its residual)
    for dt, shape, huge_residual in (("float32", (3, 256), True), ("bfloat16", (3, 256), True),
                                     ("float32", (2, 2048), False),
                                     ("bfloat16", (2, 4096), False)):
        case = Case(rng, comm.world_size, shape, dt)
        for part in case.parts:
            part[0, 5] = 1e38 / comm.world_size  # summed over ranks: about 1e38
        if huge_residual:
            case.residual[1, :] = 2e38
        cases.append(case)
    for dt, shape in (("float32", (3, 256)), ("bfloat16", (2, 4096))):
        cases.append(Case(rng, comm.world_size, shape, dt, eps=1.2e-38, scale=1e-20))
    for algorithm in ("oneshot", "twoshot"):
        for c, (out, residual_out) in zip(cases, run_cases(mesh, cases, algorithm)):
            what = f"large values {algorithm} {c}"
            want_residual, _ = c.reference()
            got_residual = np.asarray(residual_out.addressable_shards[0].data)
            assert_equal_nan_aware(got_residual, want_residual, what + " residual_out")
            # Next to a huge value the other outputs of its row underflow to
            # subnormals, which XLA:CPU flushes: those are not compared.
            got = np.asarray(out.addressable_shards[0].data)
            want = norm_float64(got_residual, scale_vector(c.gamma), c.eps)
            small = (np.abs(want) < 1.1754944e-38) & (np.abs(got.astype(np.float64)) <= 1.2e-38)
            assert_norm_close(got, np.where(small, got.astype(np.float64), want), what + " out")
    log("large_values: ok")


def suite_mixed_dtypes(mesh, comm):
    """Every (x, residual) dtype pair, gammas of other dtypes and Gemma's
    scale_offset, on every algorithm: out in x's dtype, residual_out in the
    residual's (a float32 residual beside 16-bit x runs in the fused
    kernel; other pairs take the general path, the same arithmetic)."""
    rng = np.random.default_rng(SEED + 26)
    world = comm.world_size
    cases = []
    for x_dt in FLOAT_DTYPES:
        for r_dt in FLOAT_DTYPES:
            g_dt = ("float32", "bfloat16", "float16")[len(cases) % 3]
            cases.append(Case(rng, world, (3, 512), x_dt, residual_dtype=r_dt, gamma_dtype=g_dt,
                              offset=(0.0, 1.0)[len(cases) % 2]))
    # Gemma/Llama mixed precision: bfloat16 partials, a float32 stream and
    # float32 weights; several rounds through the workspace; FP8 output.
    cases += [Case(rng, world, (70, 2048), "bfloat16", residual_dtype="float32",
                   gamma_dtype="float32", offset=1.0),
              Case(rng, world, (4, 4096), "float16", residual_dtype="float32",
                   gamma_dtype="float32", quant_scale=0.1),
              Case(rng, world, (2, 8192), "bfloat16", residual_dtype="float32")]
    for algorithm in ("oneshot", "twoshot", "auto"):
        check_cases(mesh, comm, cases, algorithm, f"mixed {algorithm}")
    log(f"mixed_dtypes: {len(cases)} cases x 3 algorithms ok")


def suite_post_norm_bias(mesh, comm):
    """post_gamma (Gemma 2/3's post-norm before the residual add) and bias
    (added once, after the reduction), alone and together, with mixed
    dtypes, FP8, several rounds, and on the general and psum paths."""
    rng = np.random.default_rng(SEED + 27)
    world = comm.world_size
    cases = []
    for i, dt in enumerate(FLOAT_DTYPES):
        for post_norm, bias in ((True, False), (False, True), (True, True)):
            cases.append(Case(rng, world, (3, 256 * (i + 1)), dt, post_norm=post_norm, bias=bias,
                              offset=(0.0, 1.0)[len(cases) % 2]))
    cases += [Case(rng, world, (40, 1024), "bfloat16", residual_dtype="float32",
                   gamma_dtype="float32", offset=1.0, post_norm=True, bias=True),
              Case(rng, world, (5, 512), "bfloat16", quant_scale=0.05, post_norm=True,
                   bias=True),
              Case(rng, world, (2, 16384), "float16", residual_dtype="float32", post_norm=True)]
    for algorithm in ("oneshot", "twoshot", "auto"):
        check_cases(mesh, comm, cases, algorithm, f"post/bias {algorithm}")
    # Hidden sizes the kernel does not take: the general path.
    general = [Case(rng, world, (2, 100), "float32", post_norm=True, bias=True, offset=1.0),
               Case(rng, world, (3, 72), "bfloat16", residual_dtype="float32", post_norm=True)]
    check_cases(mesh, comm, general, "auto", "post/bias general")
    if not ON_GPU:
        psum = [Case(rng, world, (3, 256), "bfloat16", residual_dtype="float32",
                     post_norm=True, bias=True, offset=1.0)]
        for case, (out, residual_out) in zip(psum, run_cases(mesh, psum, "psum")):
            case.check(out, residual_out, "post/bias psum", exact_residual=False)
    log(f"post_norm_bias: {len(cases)} cases x 3 algorithms ok")


def lowered_targets(mesh, case, algorithm="auto"):
    """The jax_ar custom calls in the lowered program of one call."""
    f = jax.jit(jax.shard_map(
        lambda a, b, c: jax_ar.all_reduce_rms_norm(a, b, c, "tp", algorithm=algorithm),
        mesh=mesh, in_specs=(P("tp"), P(), P()), out_specs=(P(), P())))
    text = f.lower(global_array(case.global_x(), mesh, P("tp")),
                   global_array(case.residual, mesh, P()),
                   global_array(case.gamma, mesh, P())).as_text()
    return sorted(set(re.findall(r"custom_call @(jax_ar_\w+)", text)) - {"jax_ar_order"})


def check_float16_sum_beyond_range(mesh, world, what):
    """float16 partials whose sum over ranks passes float16's 65504 while the
    sum plus the float32 residual does not: the float32 sum of the contract
    (never the pair's float16 one, which would be inf)."""
    partial, hidden = 40000.0, 512  # a float16 value; world * it > 65504
    x = np.full((2 * world, hidden), partial, np.float16)
    residual = np.full((2, hidden), 1000.0 - partial * world, np.float32)
    f = jax.jit(jax.shard_map(
        lambda a, b, c: jax_ar.all_reduce_rms_norm(a, b, c, "tp"),
        mesh=mesh, in_specs=(P("tp"), P(), P()), out_specs=(P(), P())))
    out, residual_out = f(global_array(x, mesh, P("tp")), global_array(residual, mesh, P()),
                          global_array(np.ones(hidden, np.float32), mesh, P()))
    for device, _, got in local_shards(residual_out):
        np.testing.assert_array_equal(got, np.full(got.shape, 1000.0, np.float32),
                                      err_msg=f"{what}: float16 residual_out on {device}")
    for device, _, got in local_shards(out):  # 1000 / sqrt(1000^2 + eps) rounds to 1
        np.testing.assert_array_equal(got, np.ones(got.shape, np.float16),
                                      err_msg=f"{what}: float16 out on {device}")


def suite_auto_paths(mesh, comm):
    """algorithm="auto" follows the cost table between the fused kernel and
    the pair (jax_ar.all_reduce, then jax_ar.rms_norm): a table where the
    pair is cheapest runs the pair (its values: the sum rounded to x's
    dtype before the residual add), one where fused is runs the kernel; and
    the pair never stands in where it cannot (FP8, post-norm, bias) or
    where its rounding could overflow (float16 x)."""
    rng = np.random.default_rng(SEED + 28)
    world = comm.world_size
    # JAX_AR_TABLE names each table below in turn; after the block it is as it was.
    with tempfile.TemporaryDirectory() as directory, environment("JAX_AR_TABLE", None):
        for cheapest in ("composed", "fused_twoshot"):
            table = selection.default_table(comm.platform, comm.groups[0][0].device_kind, world)
            doc = _table.table_to_json(table, jax_ar.__version__)
            for name in selection.NORM_PATHS:
                latency = 1.0 if name == cheapest else 1000.0
                doc["algorithms"][name] = [{"up_to_bytes": None, "latency_us": latency,
                                            "us_per_mb": 0.0}]
            path = os.path.join(directory, f"{cheapest}.json")
            with open(path, "w") as f:
                json.dump(doc, f)
            os.environ["JAX_AR_TABLE"] = path
            selection.clear_cache()
            jax.clear_caches()
            cases = [Case(rng, world, (3, 512), dt) for dt in FLOAT_DTYPES]
            cases.append(Case(rng, world, (2, 1024), "bfloat16", residual_dtype="float32"))
            for case in cases:
                pair = cheapest == "composed" and np.dtype(case.dtype) != np.float16
                targets = lowered_targets(mesh, case)
                want = (["jax_ar_add_rms_norm", "jax_ar_all_reduce"] if pair
                        else ["jax_ar_all_reduce_rms_norm"])
                assert targets == want, (cheapest, str(case), targets)
                assert auto_takes_pair(comm, case) == pair, str(case)
            check_cases(mesh, comm, cases, "auto", f"auto ({cheapest} cheapest)")
            check_float16_sum_beyond_range(mesh, world, f"auto ({cheapest} cheapest)")
            others = [Case(rng, world, (3, 512), "bfloat16", quant_scale=0.5),
                      Case(rng, world, (3, 512), "bfloat16", post_norm=True),
                      Case(rng, world, (3, 512), "bfloat16", bias=True)]
            check_cases(mesh, comm, others, "auto", f"auto fused-only ({cheapest} cheapest)")
            if not comm.psum_unavailable:  # the pair's derivatives are its ops' own
                case = Case(rng, world, (4, 256), "float32", residual_dtype="float32")
                args = (global_array(case.global_x(), mesh, P("tp")),
                        global_array(case.residual, mesh, P()), global_array(case.gamma, mesh, P()))
                weights = jnp.asarray(random_normal(rng, (4, 256), np.float32))

                def grads(fn):
                    sm = jax.shard_map(fn, mesh=mesh, in_specs=(P("tp"), P(), P()),
                                       out_specs=(P(), P()))
                    loss = lambda *a: (jnp.sum(jnp.sin(sm(*a)[0]) * weights)  # noqa: E731
                                       + jnp.sum(sm(*a)[1] ** 2))
                    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*args)

                got = grads(lambda a, b, c: jax_ar.all_reduce_rms_norm(a, b, c, "tp"))
                want = grads(lambda a, b, c: unfused(a, b, c))
                for name, g, w in zip(("x", "residual", "gamma"), got, want):
                    for (device, _, gd), (_, _, wd) in zip(local_shards(g), local_shards(w)):
                        np.testing.assert_allclose(
                            gd, wd, rtol=2e-5, atol=2e-5 * float(np.abs(wd).max()),
                            err_msg=f"auto ({cheapest} cheapest) grad wrt {name} on {device}")
    selection.clear_cache()
    jax.clear_caches()
    log("auto_paths: ok")


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
    # The warning says which limit the call missed.
    limits = jax_ar._native.limits(comm.platform)
    bounds = f"[{limits['fused_min_hidden']}, {limits['fused_max_hidden']}]"
    for hidden, dtype, why, todo in (
            (100, "float32", f"hidden size 100 is outside the fused kernel's {bounds}",
             "pad the hidden dimension"),
            (20000, "float16", f"hidden size 20000 is outside the fused kernel's {bounds}", ""),
            (132, "bfloat16", "hidden size 132 is not a multiple of 8 for bfloat16",
             "pad the hidden dimension")):
        x = jax.ShapeDtypeStruct((2, hidden), np.dtype(dtype))
        reason = fused_refuses(x, x, comm)
        assert (reason.why, reason.todo) == (why, todo), (hidden, dtype, reason)
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


def unfused_general(x, residual, gamma, post_gamma=None, bias=None, eps=1e-6, offset=0.0):
    """The composition the derivatives with the new arguments must match:
    all_reduce of float32 x (+ bias), post-norm, add, norm, in jnp."""
    f32 = jnp.float32
    rms = lambda v: v * jax.lax.rsqrt(jnp.mean(v * v, -1, keepdims=True) + eps)  # noqa: E731
    t = jax_ar.all_reduce(x.astype(f32), "tp")
    if bias is not None:
        t = t + bias.astype(f32)
    if post_gamma is not None:
        t = rms(t) * (post_gamma.astype(f32) + offset)
    residual_out = (t + residual.astype(f32)).astype(residual.dtype)
    out = rms(residual_out.astype(f32)) * (gamma.astype(f32) + offset)
    return out.astype(x.dtype), residual_out


def suite_grad_new_arguments(mesh, comm):
    """Gradients with post_gamma, bias, scale_offset, a float32 residual and
    float32 weights beside bfloat16 x, against jax.grad of the jnp
    composition; with and without check_vma, outside and inside shard_map."""
    if comm.psum_unavailable:  # transposes of replicated inputs are JAX's own psums
        raise SuiteSkipped(comm.psum_unavailable)
    rng = np.random.default_rng(SEED + 29)
    world = comm.world_size
    specs = (P("tp"), P(), P(), P(), P())
    for dt, r_dt, rtol in (("float32", "float32", 2e-5), ("bfloat16", "float32", 3e-2)):
        case = Case(rng, world, (4, 256), dt, residual_dtype=r_dt, gamma_dtype="float32",
                    offset=1.0, post_norm=True, bias=True)
        weights = jnp.asarray(random_normal(rng, (4, 256), np.float32))
        args = (global_array(case.global_x(), mesh, P("tp")),
                global_array(case.residual, mesh, P()),
                *(global_array(v, mesh, P()) for v in case.vectors()))

        def loss_of(out, residual_out):
            return (jnp.sum(jnp.sin(out.astype(jnp.float32)) * weights)
                    + jnp.sum(residual_out.astype(jnp.float32) ** 2))

        fused = lambda a, b, c, d, e: jax_ar.all_reduce_rms_norm(  # noqa: E731
            a, b, c, "tp", post_gamma=d, bias=e, scale_offset=1.0)
        general = lambda a, b, c, d, e: unfused_general(a, b, c, d, e, offset=1.0)  # noqa: E731

        def outer(fn, check_vma):
            sm = jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=(P(), P()),
                               check_vma=check_vma)
            return jax.jit(jax.grad(lambda *a: loss_of(*sm(*a)), argnums=tuple(range(5))))

        def inner(fn, check_vma):
            def body(*a):
                return jax.grad(lambda *u: loss_of(*fn(*u)), argnums=tuple(range(5)))(*a)
            return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=specs,
                                         check_vma=check_vma))

        for make, check_vma in ((outer, True), (inner, True), (outer, False)):
            got = make(fused, check_vma)(*args)
            want = make(general, check_vma)(*args)
            for name, g, w in zip(("x", "residual", "gamma", "post_gamma", "bias"), got, want):
                assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
                for (device, _, gd), (_, _, wd) in zip(local_shards(g), local_shards(w)):
                    scale = float(np.abs(wd.astype(np.float32)).max())
                    np.testing.assert_allclose(
                        gd.astype(np.float32), wd.astype(np.float32), rtol=rtol,
                        atol=rtol * scale,
                        err_msg=f"grad {dt} {make.__name__} check_vma={check_vma} wrt {name} "
                                f"on {device}")
    log("grad_new_arguments: ok")


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
    for b, c in enumerate(cases):  # auto chooses per member, as for one call of its shape
        c.check_local([o[b] for o in outs], [r[b] for r in residual_outs], f"vmap {b}",
                      pair=auto_takes_pair(comm, c))
    log("vmap: ok")


def suite_vmap_per_member(mesh, comm):
    """Stacked layers under vmap: a gamma (post_gamma, bias, FP8 scale) per
    batch member, served by the fused kernel's groups of rows (the FP8 scale
    by the general path); nested vmaps; and a shared gamma with per-member
    post_gamma."""
    rng = np.random.default_rng(SEED + 30)
    world = comm.world_size
    layers = 3
    cases = [Case(rng, world, (2, 256), "bfloat16", residual_dtype="float32",
                  gamma_dtype="float32", offset=1.0, post_norm=True, bias=True)
             for _ in range(layers)]
    stack = lambda get: np.stack([get(c) for c in cases])  # noqa: E731
    x = stack(lambda c: c.global_x())                     # [L, world*2, 256]
    residual = stack(lambda c: c.residual)                # [L, 2, 256]
    gamma, post_gamma, bias = (stack(lambda c, i=i: c.vectors()[i]) for i in range(3))

    def per_layer(a, b, g, pg, bi):
        return jax_ar.all_reduce_rms_norm(a, b, g, "tp", post_gamma=pg, bias=bi,
                                          scale_offset=1.0)

    specs = (P(None, "tp"), P(), P(), P(), P())
    f = jax.jit(jax.shard_map(jax.vmap(per_layer), mesh=mesh, in_specs=specs,
                              out_specs=(P(), P())))
    args = [global_array(x, mesh, P(None, "tp"))] + [global_array(v, mesh, P())
                                                     for v in (residual, gamma, post_gamma, bias)]
    text = f.lower(*args).as_text()
    assert "jax_ar_all_reduce_rms_norm" in text, "per-member gamma must stay fused"
    out, residual_out = f(*args)
    outs = [np.asarray(s.data) for s in out.addressable_shards]
    residual_outs = [np.asarray(s.data) for s in residual_out.addressable_shards]
    for b, c in enumerate(cases):
        c.check_local([o[b] for o in outs], [r[b] for r in residual_outs], f"vmap member {b}")

    # Nested: [2 stacks, 3 layers], x shared by the inner level; gamma
    # shared by the outer one, post_gamma per member of both.
    nested = [[Case(rng, world, (2, 128), "float32", post_norm=True) for _ in range(layers)]
              for _ in range(2)]
    for stack_cases in nested:
        for c in stack_cases:
            c.parts = stack_cases[0].parts
            c.gamma = nested[0][0].gamma
    xs = np.stack([s[0].global_x() for s in nested])                 # [2, world*2, 128]
    rs = np.stack([np.stack([c.residual for c in s]) for s in nested])  # [2, 3, 2, 128]
    pgs = np.stack([np.stack([c.post_gamma for c in s]) for s in nested])  # [2, 3, 128]
    g = nested[0][0].gamma

    def body(a, r, pg, gm):
        inner = jax.vmap(lambda rr, p: jax_ar.all_reduce_rms_norm(a, rr, gm, "tp", post_gamma=p),
                         in_axes=(0, 0))
        return inner(r, pg)

    f = jax.jit(jax.shard_map(jax.vmap(body, in_axes=(0, 0, 0, None)), mesh=mesh,
                              in_specs=(P(None, "tp"), P(), P(), P()), out_specs=(P(), P())))
    out, residual_out = f(global_array(xs, mesh, P(None, "tp")), global_array(rs, mesh, P()),
                          global_array(pgs, mesh, P()), global_array(g, mesh, P()))
    outs = [np.asarray(s.data) for s in out.addressable_shards]
    residual_outs = [np.asarray(s.data) for s in residual_out.addressable_shards]
    for i, stack_cases in enumerate(nested):
        for j, c in enumerate(stack_cases):
            c.check_local([o[i, j] for o in outs], [r[i, j] for r in residual_outs],
                          f"nested vmap {i},{j}")

    # A quant_scale per member: the general path.
    scales = [0.05, 0.5, 2.0]
    cases = [Case(rng, world, (2, 256), "bfloat16", quant_scale=q) for q in scales]
    f = jax.jit(jax.shard_map(
        jax.vmap(lambda a, b, c, q: jax_ar.all_reduce_rms_norm(a, b, c, "tp", quant_scale=q)),
        mesh=mesh, in_specs=(P(None, "tp"), P(), P(), P()), out_specs=(P(), P())))
    out, residual_out = f(global_array(stack(lambda c: c.global_x()), mesh, P(None, "tp")),
                          global_array(stack(lambda c: c.residual), mesh, P()),
                          global_array(stack(lambda c: c.gamma), mesh, P()),
                          global_array(np.asarray(scales, np.float32), mesh, P()))
    outs = [np.asarray(s.data) for s in out.addressable_shards]
    residual_outs = [np.asarray(s.data) for s in residual_out.addressable_shards]
    for b, c in enumerate(cases):
        c.check_local([o[b] for o in outs], [r[b] for r in residual_outs], f"vmap fp8 {b}")
    log("vmap_per_member: ok")


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
    expect_error(TypeError, "residual has dtype int32",
                 lambda: call(lambda a, b, c: arn(a, b.astype(jnp.int32), c, "tp")))
    expect_error(TypeError, "gamma has dtype int32",
                 lambda: call(lambda a, b, c: arn(a, b, c.astype(jnp.int32), "tp")))
    expect_error(ValueError, "post_gamma has shape (64,)",
                 lambda: call(lambda a, b, c: arn(a, b, c, "tp", post_gamma=c[:64])))
    expect_error(TypeError, "bias has dtype int32",
                 lambda: call(lambda a, b, c: arn(a, b, c, "tp", bias=c.astype(jnp.int32))))
    expect_error(TypeError, "scale_offset must be a Python float",
                 lambda: call(lambda a, b, c: arn(a, b, c, "tp", scale_offset=None)))
    expect_error(TypeError, "x has dtype int32",
                 lambda: call(lambda a, b, c: arn(a.astype(jnp.int32), b.astype(jnp.int32),
                                                  c.astype(jnp.int32), "tp")))
    for eps in (0.0, -1.0, float("nan"), float("inf")):
        expect_error(ValueError, "eps must be positive",
                     lambda: call(lambda a, b, c: arn(a, b, c, "tp", eps=eps)))
    expect_error(ValueError, "below float32's smallest normal number",
                 lambda: call(lambda a, b, c: arn(a, b, c, "tp", eps=1e-40)))
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
