"""One rank of the fault tests. Usage: comm_faults.py SCENARIO

The last process ("odd") is the one that misbehaves; every rank checks what
it sees and prints "fault-check ok: SCENARIO" when all was as expected.

disagree        calls that differ in size, dtype, op, algorithm, number of
                arrays, size of a multi-round message, operation, or an
                all_reduce_rms_norm's eps or row split (same bytes): an
                error naming both calls on every rank at once; later calls
                and check() fail at once; close() + setup() then gives exact
                results on new data
skip            odd skips a call and then (a) makes a different call, (b)
                waits (all_reduce, and all_reduce_rms_norm when it exists),
                (c) closes: the others fail at once (a, c) or at the
                deadline (b); odd's later call fails at once; recovery
skip_and_end    odd skips the last call and its script ends: every rank
                fails (odd through the launcher's end-of-script check)
setup_disagree  different workspace_bytes, a different library version or
                JAX_AR_ALGO, a process that skips setup (and arrives
                later): errors naming the processes; setup then works again
die             process 1 kills itself (SIGKILL) after setup; the others'
                next call fails at once naming it (CPU) or at the deadline
die_in_extra_call  process 1 makes a call the others never make and is
                killed (SIGKILL) while it waits in it; the others end their
                script: their close sees a dead peer, not one that made a
                call they skipped, and does not wait for it
die_in_setup    process 1 kills itself inside setup after creating its
                workspace (CPU) or before setup (GPU): the others' setup
                fails at once naming it
stuck           odd sleeps instead of calling; the others fail at the
                deadline and raise; the launcher must stop odd
catchable       odd sleeps instead of calling: with jax_ar.checked() the
                others catch JaxArTimeoutError (XLA's error its __cause__);
                a block that ends normally on a failed communicator raises
                too; tracing a new call on it, or on a closed one, raises
                JaxArError at trace time; other exceptions pass unchanged;
                then recovery on every rank
error_types     what each run-time failure raises (a peer that disagrees,
                never comes, closes, or a call on a communicator that has
                failed), through a jitted function's first call and through
                a call again with shapes it ran: prints "error-type KIND PATH
                STATUS TYPE" (and "error-at-trace") lines for
                tests/test_readme.py, which compares them with README's
                Errors section; comm.check() and
                jax_ar.checked() give JaxArError (JaxArTimeoutError for the
                deadline) every time
"""
import logging
import os
import signal
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_ar
from jax_ar.comm import communicator
from common import environment, global_array, log, main_guard
from comm_fault_checks import (ADVICE, ON_GPU, PROMPT_S, check_fresh_results,
                               expect_check_fails, expect_failure, last_process, me, reducer,
                               sharded, tp_mesh)

# The deadline of communicators whose timeouts the test waits for; "default"
# leaves it to JAX_AR_TIMEOUT_S or jax_ar's default.
_DEADLINE = os.environ.get("FAULT_DEADLINE_S", "2")
DEADLINE_S = jax_ar.config.resolve_timeout(None if _DEADLINE == "default" else float(_DEADLINE))


def setup(mesh, **kwargs):
    kwargs.setdefault("timeout_s", DEADLINE_S)
    return jax_ar.setup(mesh, "tp", **kwargs)


def rank_of(mesh, process):
    """The first rank of the "tp" group that `process` holds."""
    return min(i for i, d in enumerate(mesh.devices.flat) if d.process_index == process)


def kv_signal(name):
    from jax_ar import _compat

    _compat.distributed_client().key_value_set(f"fault/{name}/{me()}", "1")


def kv_wait(name, process):
    from jax_ar import _compat

    _compat.distributed_client().blocking_key_value_get(f"fault/{name}/{process}", 60_000)


def scenario_disagree(mesh):
    odd = me() == last_process()
    _, x4s = sharded(mesh, 4)
    _, x8s = sharded(mesh, 8)
    _, xbs = sharded(mesh, 4, dtype=jnp.bfloat16)
    # name -> (variant(is_odd) -> (function, args), what the error names on
    # both backends, what it names on CPU too: there the ranks' headers
    # describe their calls; GPU headers are hashes tagged with the operation)
    cases = {
        "size": (lambda o: (reducer(mesh), (x8s if o else x4s,)), ("all_reduce",),
                 ("float32[4]", "float32[8]")),
        "dtype": (lambda o: (reducer(mesh), (xbs if o else x4s,)), ("all_reduce",),
                  ("float32[4]", "bfloat16[4]")),
        "op": (lambda o: (reducer(mesh, op="max" if o else "sum"), (x4s,)), ("all_reduce",),
               ("sum", "max")),
        "algorithm": (lambda o: (reducer(mesh, algorithm="twoshot" if o else "oneshot"), (x4s,)),
                      ("all_reduce",), ("oneshot", "twoshot")),
        "arrays": (lambda o: (reducer(mesh, leaves=2 if o else 1), (x4s, x8s) if o else (x4s,)),
                   ("all_reduce",), ("2 arrays",)),
    }
    comm = setup(mesh)
    big_rows = comm.capacity_bytes("oneshot") // 4 + 1000  # two rounds through the workspace
    comm.close()
    cases["multi-round size"] = (
        lambda o: (reducer(mesh, algorithm="oneshot"),
                   (sharded(mesh, big_rows if o else 1000)[1],)),
        ("all_reduce",), ("float32[1000]",))
    if hasattr(jax_ar, "all_reduce_rms_norm"):
        cases["operation"] = (lambda o: _norm_or_reduce(mesh, o), ("all_reduce_rms_norm",), ())
        # Fused calls alike in bytes: another eps, the rows split otherwise.
        cases["norm eps"] = (lambda o: _norm(mesh, 2, 256, eps=0.5 if o else 1e-6),
                             ("all_reduce_rms_norm",), ("eps 1e-06", "eps 0.5"))
        cases["norm rows"] = (lambda o: _norm(mesh, *((4, 128) if o else (2, 256))),
                              ("all_reduce_rms_norm",), ("[2,256]", "[4,128]"))
    if hasattr(jax_ar, "reduce_scatter"):
        cases["reduce_scatter"] = (lambda o: _scatter_or_reduce(mesh, o), ("reduce_scatter",), ())
    mine = f"rank {rank_of(mesh, me())}"

    for seed, (name, (variant, shared, on_cpu)) in enumerate(cases.items()):
        comm = setup(mesh, timeout_s=30.0)  # errors must come at once, not at this deadline
        good = reducer(mesh)
        jax.block_until_ready(good(x4s))  # a good call first
        # Every rank compiles both variants (on GPUs XLA's sharded autotuning
        # waits for every process to compile a program), outside the timed part.
        compiled = {}
        try:
            for is_odd in (False, True):
                fn, args = variant(is_odd)
                compiled[is_odd] = (fn.lower(*args).compile(), args)
            call, args = compiled[odd]
            run = lambda: call(*args)  # noqa: E731
            # The ranks may leave compilation seconds apart on a busy GPU
            # machine, and a rank whose timed call starts first would count
            # its peers' compile time against PROMPT_S. A good call, which
            # ends only when every rank has come, starts them together.
            jax.block_until_ready(good(x4s))
        except jax_ar.JaxArError as early:
            # With 3 ranks, two may meet and fail while this one still
            # traces: tracing on a failed communicator raises at once.
            def run(early=early):
                raise early
        expect_failure(comm, run, f"disagree/{name}",
                       must_name=("ranks disagree", mine, "call ") + shared +
                       (() if ON_GPU else on_cpu))
        expect_failure(comm, lambda: good(x4s), f"disagree/{name}: next call",
                       must_name=("ranks disagree",))
        expect_check_fails(comm, f"disagree/{name}", must_name=("ranks disagree", ADVICE))
        comm.close()
        fresh = setup(mesh)
        check_fresh_results(mesh, seed + 100, f"disagree/{name}: after close() + setup()")
        fresh.close()


def _norm_or_reduce(mesh, odd):
    """all_reduce_rms_norm on most ranks, a plain all_reduce of the same
    float32 operand on `odd`: equal bytes, different operations. (A hidden
    size the fused kernel takes: the general path is a plain all_reduce plus
    a norm, whose exchange pairs with odd's and gives each rank the right
    result for its own call.)"""
    tokens, hidden = 2, 256
    x = global_array(np.ones((jax.device_count() * tokens, hidden), np.float32), mesh, P("tp"))
    r = global_array(np.ones((tokens, hidden), np.float32), mesh, P())
    g = global_array(np.ones((hidden,), np.float32), mesh, P())
    if odd:
        def body(x, r, g):
            return jax_ar.all_reduce(x, "tp", algorithm="oneshot"), r
    else:
        def body(x, r, g):
            return jax_ar.all_reduce_rms_norm(x, r, g, "tp", algorithm="oneshot")
    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tp"), P(), P()),
                               out_specs=(P(), P())))
    return fn, (x, r, g)


def _norm(mesh, tokens, hidden, eps=1e-6):
    """all_reduce_rms_norm of float32 [tokens, hidden] per rank (a hidden
    size the fused kernel takes)."""
    x = global_array(np.ones((jax.device_count() * tokens, hidden), np.float32), mesh, P("tp"))
    r = global_array(np.ones((tokens, hidden), np.float32), mesh, P())
    g = global_array(np.ones((hidden,), np.float32), mesh, P())
    fn = jax.jit(jax.shard_map(
        lambda x, r, g: jax_ar.all_reduce_rms_norm(x, r, g, "tp", eps=eps, algorithm="oneshot"),
        mesh=mesh, in_specs=(P("tp"), P(), P()), out_specs=(P(), P())))
    return fn, (x, r, g)


def _scatter_or_reduce(mesh, odd):
    """reduce_scatter on `odd`, all_reduce of the same operand elsewhere."""
    x = global_array(np.ones((jax.device_count() * jax.device_count() * 4,), np.float32),
                     mesh, P("tp"))
    if odd:
        fn = jax.shard_map(lambda v: jax_ar.reduce_scatter(v, "tp", tiled=True), mesh=mesh,
                           in_specs=P("tp"), out_specs=P("tp"))
    else:
        fn = jax.shard_map(lambda v: jax_ar.all_reduce(v, "tp"), mesh=mesh, in_specs=P("tp"),
                           out_specs=P())
    return jax.jit(fn), (x,)


def scenario_skip(mesh):
    odd = me() == last_process()
    odd_rank = rank_of(mesh, last_process())
    _, xs = sharded(mesh, 4)
    _, ys = sharded(mesh, 6, seed=1)
    f = reducer(mesh)

    # (a) odd skips the call on x and makes the next one (on y): all fail.
    # (Every rank compiles both programs: see scenario_disagree.)
    comm = setup(mesh, timeout_s=30.0)
    on_x, on_y = f.lower(xs).compile(), f.lower(ys).compile()
    jax.block_until_ready(on_x(xs))
    expect_failure(comm, lambda: on_y(ys) if odd else on_x(xs), "skip/then-other-call",
                   must_name=("ranks disagree", f"rank {rank_of(mesh, me())}", f"rank {odd_rank}",
                              "all_reduce"))
    comm.close()

    # (b) odd skips the call and waits: the others time out at the deadline,
    # naming themselves and odd; odd learns of it (check(), its next call).
    skip_and_wait(mesh, f, (xs,), "all_reduce")
    if hasattr(jax_ar, "all_reduce_rms_norm"):
        norm, norm_args = _norm_or_reduce(mesh, odd=False)
        skip_and_wait(mesh, norm, norm_args, "all_reduce_rms_norm")

    # (c) odd skips the call and closes: the others stop at once (CPU) and
    # odd's close() logs that a peer started a call it never made.
    deadline_c = DEADLINE_S if ON_GPU else 30.0
    kv_barrier("skip-close-setup")
    comm = setup(mesh, timeout_s=deadline_c)
    jax.block_until_ready(f(xs))
    if odd:
        records = _capture_jax_ar_errors()
        kv_wait("skip-close", 0)
        time.sleep(0.3)  # process 0 is about to call: let its call start
        comm.close()
        if not ON_GPU:  # the CPU backend reports peers that started a call it never made
            assert any("skipped" in r for r in records), f"close() did not report it: {records}"
            log(f"skip/close: close() logged: {records[0][:200]}")
    else:
        if me() == 0:
            kv_signal("skip-close")
        # GPU kernels see a closed peer only at their deadline.
        expect_failure(comm, lambda: f(xs), "skip/close",
                       must_name=(f"rank {rank_of(mesh, me())}", f"rank {odd_rank}", "call ",
                                  "timed out" if ON_GPU else "closed the communicator"),
                       within_s=deadline_c + PROMPT_S)
        comm.close()

    kv_barrier("skip-fresh-setup")
    fresh = setup(mesh)
    check_fresh_results(mesh, 7, "skip: after close() + setup()")
    fresh.close()


def kv_barrier(name):
    """Every process here before any goes on (setup's own deadline is the
    short DEADLINE_S, which a rank still sleeping through the previous
    scenario would miss)."""
    kv_signal(name)
    for process in range(jax.process_count()):
        kv_wait(name, process)


def skip_and_wait(mesh, fn, args, operation):
    odd = me() == last_process()
    odd_rank = rank_of(mesh, last_process())
    what = f"skip/wait/{operation}"
    kv_barrier(what)
    comm = setup(mesh)
    jax.block_until_ready(fn(*args))
    # Every rank's error says that a rank timed out waiting for odd.
    told = ("timed out", f"rank {odd_rank}", operation)
    if odd and ON_GPU:  # peers' failures reach a GPU rank through its next launch
        time.sleep(DEADLINE_S + PROMPT_S)
        expect_failure(comm, lambda: fn(*args), f"{what}: the skipping rank's next call",
                       must_name=told)
    elif odd:
        give_up = time.monotonic() + DEADLINE_S + 10
        while time.monotonic() < give_up:
            try:
                comm.check()
            except jax_ar.JaxArError as e:
                assert all(fragment in str(e) for fragment in (*told, ADVICE)), e
                log(f"{what}: check() reports: {str(e)[:200]}")
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"{what}: the peers' failure never reached the skipping rank")
        expect_failure(comm, lambda: fn(*args), f"{what}: the skipping rank's next call",
                       must_name=told)
    else:
        expect_failure(comm, lambda: fn(*args), what,
                       must_name=told + (f"rank {rank_of(mesh, me())}", "call "),
                       within_s=DEADLINE_S + PROMPT_S, at_least_s=DEADLINE_S * 0.9)
    comm.close()


def _capture_jax_ar_errors():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("jax_ar").addHandler(Keep(logging.ERROR))
    return records


def scenario_skip_and_end(mesh):
    """odd skips the last call and its script ends: the others fail at once
    (CPU) naming it, and odd fails too (the launcher's end-of-script check:
    a peer made a call it never made)."""
    comm = setup(mesh, timeout_s=DEADLINE_S if ON_GPU else 30.0)
    _, xs = sharded(mesh, 4)
    f = reducer(mesh)
    jax.block_until_ready(f(xs))
    if me() == last_process():
        log("fault-check ok: skip_and_end (ending without the last call)")
        return
    error = expect_failure(comm, lambda: f(xs), "skip_and_end",
                           must_name=(f"rank {rank_of(mesh, me())}",
                                      f"rank {rank_of(mesh, last_process())}", "call "),
                           within_s=DEADLINE_S + PROMPT_S if ON_GPU else PROMPT_S)
    stop_like_a_program(error, "skip_and_end")


def scenario_setup_disagree(mesh):
    odd = me() == last_process()
    mine, theirs = f"process {me()}", f"process {0 if odd else last_process()}"

    def expect_setup_error(what, kind, must_name, within_s=PROMPT_S, **kwargs):
        start = time.monotonic()
        try:
            jax_ar.setup(mesh, "tp", **kwargs)
        except kind as e:
            took = time.monotonic() - start
            for fragment in ("jax_ar", *must_name):
                assert fragment in str(e), f"{what}: error does not mention {fragment!r}: {e}"
            assert took <= within_s, f"{what}: error after {took:.2f} s: {e}"
            log(f"{what}: failed as expected after {took:.2f} s: {str(e)[:300]}")
            return
        raise AssertionError(f"{what}: setup succeeded; expected {kind.__name__}")

    # The bounds time the detection, not start-up skew (a GPU rank's first
    # setup waited 13 s for a peer still initializing CUDA under MPS).
    kv_barrier("setup-disagree")
    expect_setup_error("setup/workspace_bytes", jax_ar.JaxArError,
                       ("workspace_bytes", mine, theirs),
                       workspace_bytes=(2 << 20) if odd else (1 << 20), timeout_s=30.0)

    saved = communicator.__version__
    if odd:
        communicator.__version__ = "0.0.0-other"
    try:
        expect_setup_error("setup/version", jax_ar.JaxArError, ("version", mine, theirs),
                           timeout_s=30.0)
    finally:
        communicator.__version__ = saved

    # Processes that would pick algorithms differently (JAX_AR_ALGO) could
    # meet psum on one side and a kernel on the other: setup refuses.
    with environment("JAX_AR_ALGO", "psum" if odd else None):
        expect_setup_error("setup/JAX_AR_ALGO", jax_ar.JaxArError, ("JAX_AR_ALGO", mine, theirs),
                           timeout_s=30.0)

    # odd skips setup: the others time out naming it; odd, arriving later,
    # learns at once that they gave up (it joins the same, failed setup).
    if odd:
        time.sleep(DEADLINE_S + 1.0)
        expect_setup_error("setup/late", jax_ar.JaxArError, ("failed", "process 0"),
                           timeout_s=30.0)
    else:
        expect_setup_error("setup/missing", jax_ar.JaxArTimeoutError,
                           (mine, f"process {last_process()}", "never got there"),
                           within_s=DEADLINE_S + PROMPT_S, timeout_s=DEADLINE_S)

    fresh = setup(mesh, timeout_s=30.0)
    check_fresh_results(mesh, 3, "setup: after the failed setups")
    fresh.close()


def scenario_die(mesh):
    # On CPU a long deadline shows that the death is noticed at once; GPU
    # kernels notice it only at their deadline.
    comm = setup(mesh, timeout_s=DEADLINE_S if ON_GPU else 30.0)
    _, xs = sharded(mesh, 4)
    f = reducer(mesh)
    jax.block_until_ready(f(xs))
    victim = 1  # not process 0: JAX ends every process when its coordinator dies
    if me() == victim:
        log("killing myself")
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)  # the victim is gone before the call
    # The CPU backend sees the process gone; GPU kernels wait for their deadline.
    error = expect_failure(comm, lambda: f(xs), "die",
                           must_name=(f"rank {rank_of(mesh, me())}", f"rank {rank_of(mesh, victim)}",
                                      "call ", "timed out" if ON_GPU else "has exited"),
                           within_s=(DEADLINE_S + PROMPT_S) if ON_GPU else PROMPT_S)
    expect_check_fails(comm, "die")
    comm.close()
    stop_like_a_program(error, "die")


def scenario_die_in_extra_call(mesh):
    comm = setup(mesh, timeout_s=30.0)  # a close that waited for the dead rank would show
    _, xs = sharded(mesh, 4)
    f = reducer(mesh)
    jax.block_until_ready(f(xs))
    victim = 1
    if me() == victim:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()
        log("an extra call, killed in it")
        jax.block_until_ready(f(xs))
        raise AssertionError("the extra call returned")
    time.sleep(1.5)  # the victim started its call and died in it
    start = time.monotonic()
    skipped = communicator.close_all()  # what the launcher's end-of-script check does
    took = time.monotonic() - start
    assert not skipped, f"a killed peer was taken for a program that made an extra call: {skipped}"
    assert ON_GPU or took < PROMPT_S, f"close waited {took:.1f} s for a dead peer"
    stop_like_a_program(f"ended cleanly after its peer died ({comm})", "die_in_extra_call")


def scenario_die_in_setup(mesh):
    victim = 1
    if me() == victim:
        if ON_GPU:
            log("killing myself before setup")
            os.kill(os.getpid(), signal.SIGKILL)
        from jax_ar.comm.cpu_backend import CpuBackend

        def die_instead_of_mapping(self, *args):
            log("killing myself inside setup, after creating my workspace")
            os.kill(os.getpid(), signal.SIGKILL)

        CpuBackend.open = die_instead_of_mapping
    start = time.monotonic()
    try:
        jax_ar.setup(mesh, "tp", timeout_s=30.0)
    except jax_ar.JaxArError as e:
        took = time.monotonic() - start
        assert f"process {victim}" in str(e) and "exited" in str(e), e
        assert took < PROMPT_S, f"die_in_setup: error after {took:.2f} s: {e}"
        log(f"die_in_setup: failed as expected after {took:.2f} s: {str(e)[:300]}")
        stop_like_a_program(str(e), "die_in_setup")
    raise AssertionError("die_in_setup: setup succeeded without the victim")


def scenario_stuck(mesh):
    comm = setup(mesh)
    _, xs = sharded(mesh, 4)
    f = reducer(mesh)
    jax.block_until_ready(f(xs))
    if me() == last_process():
        log("sleeping instead of calling")
        time.sleep(600)
    error = expect_failure(comm, lambda: f(xs), "stuck",
                           must_name=("timed out", f"rank {rank_of(mesh, me())}",
                                      f"rank {rank_of(mesh, last_process())}", "all_reduce"),
                           within_s=DEADLINE_S + PROMPT_S, at_least_s=DEADLINE_S * 0.9)
    stop_like_a_program(error, "stuck")


def scenario_catchable(mesh):
    odd = me() == last_process()
    comm = setup(mesh)
    _, xs = sharded(mesh, 4)
    f = reducer(mesh)
    jax.block_until_ready(f(xs))
    with jax_ar.checked(comm):  # a good call: nothing raised
        jax.block_until_ready(f(xs))
    if odd:
        time.sleep(DEADLINE_S + PROMPT_S)  # skips the call; its peers time out
    else:
        start = time.monotonic()
        try:
            with jax_ar.checked(comm):
                jax.block_until_ready(f(xs))
            raise AssertionError("catchable: no error from a call that a peer skipped")
        except jax_ar.JaxArTimeoutError as e:
            took = time.monotonic() - start
            cause = e.__cause__
            assert "timed out" in str(e), e
            if ON_GPU:
                # A kernel cannot fail its XLA call: it gives up at its
                # deadline and records why, and checked()'s comm.check()
                # raises that record (docs/guarantees.md).
                assert cause is None or not isinstance(cause, jax_ar.JaxArError), repr(cause)
            else:  # the CPU handler returns an error status: XLA's error is the cause
                assert cause is not None and not isinstance(cause, jax_ar.JaxArError), repr(cause)
                assert "jax_ar:" in str(cause), (cause, e)
            assert DEADLINE_S * 0.9 <= took <= DEADLINE_S + PROMPT_S, took
            log(f"catchable: JaxArTimeoutError after {took:.2f} s, from "
                f"{type(cause).__name__}: {str(cause or e).splitlines()[0][:120]}")
    # The communicator stays failed on every rank (odd learns of it from its
    # peers' published failure): a block that raises nothing itself still
    # ends in JaxArError (its comm.check()), and so does a call traced now.
    give_up = time.monotonic() + DEADLINE_S + 10
    while True:
        try:
            with jax_ar.checked(comm):
                if ON_GPU and odd:  # a GPU rank learns of its peers' failure in its next launch
                    jax.block_until_ready(f(xs))
        except jax_ar.JaxArError as e:
            assert "has failed" in str(e), e
            break
        assert time.monotonic() < give_up, "catchable: the failure never reached this rank"
        time.sleep(0.05)
    try:
        reducer(mesh, op="max").lower(xs)
        raise AssertionError("catchable: traced a call on a failed communicator")
    except jax_ar.JaxArError as e:
        assert "has failed" in str(e), e
    try:  # not jax_ar's: passes unchanged
        with jax_ar.checked():
            raise KeyError("unrelated")
    except KeyError:
        pass
    comm.close()
    try:
        reducer(mesh, op="min").lower(xs)
        raise AssertionError("catchable: traced a call on a closed communicator")
    except jax_ar.JaxArError as e:
        assert "was closed" in str(e), e
    fresh = setup(mesh, timeout_s=30.0)  # odd may still be asleep
    check_fresh_results(mesh, 11, "catchable: after close() + setup()")
    fresh.close()


# The failures of scenario_error_types: what the odd process does instead
# of the call its peers make, and the status code XLA puts before the
# message (cuda/cpu's handlers choose it).
ERROR_KINDS = {
    "disagree": "FAILED_PRECONDITION",  # odd calls with another shape
    "never_came": "DEADLINE_EXCEEDED",  # odd sleeps past the deadline
    "closed": "ABORTED",  # odd closes the communicator
    "failed_earlier": "FAILED_PRECONDITION",  # every rank calls again after a failure
}


def scenario_error_types(mesh):
    """Every rank, for each failure of ERROR_KINDS and each way of calling
    (PATH "first": a jitted function's first call for these shapes; "again":
    a call with shapes the function already ran, JAX's C++ fast path),
    logs "error-type KIND PATH STATUS TYPE" with the exception's type as
    module.name. Only the ranks that make the failing call log (odd makes
    none for never_came and closed). A first call on a communicator that
    has failed is traced, and fails there, as jax_ar's own error:
    "error-at-trace failed_earlier TYPE"."""
    odd = me() == last_process()
    xs = {rows: sharded(mesh, rows)[1] for rows in (4, 6, 8)}
    for path in ("first", "again"):
        for kind, status in ERROR_KINDS.items():
            kv_barrier(f"error-types/{path}/{kind}")
            comm = setup(mesh, timeout_s=DEADLINE_S if kind == "never_came" else 30.0)
            f = reducer(mesh)  # a new function: its first call of a shape traces and compiles
            if path == "again":
                for x in xs.values():
                    jax.block_until_ready(f(x))
            disagreeing = lambda: f(xs[8] if odd else xs[4])  # noqa: E731
            if kind == "failed_earlier":
                _expect_jax_ar_failure(comm, disagreeing, "error_types/failed_earlier (first)")
                call = lambda: f(xs[4])  # noqa: E731
                if path == "first":  # tracing a call on the failed communicator: jax_ar's own
                    try:
                        f(xs[6])
                        raise AssertionError("error_types: traced a call on a failed "
                                             "communicator")
                    except jax_ar.JaxArError as e:
                        assert "has failed" in str(e), e
                        log(f"error-at-trace {kind} {type(e).__module__}.{type(e).__qualname__}")
                    comm.close()
                    continue
            else:
                call = disagreeing if kind == "disagree" else (lambda: f(xs[4]))
            if odd and kind == "never_came":
                time.sleep(DEADLINE_S + PROMPT_S)
            elif odd and kind == "closed":
                kv_wait(f"error-types-closing/{path}", 0)
                time.sleep(0.3)  # process 0 is about to call: let its call start
                comm.close()
            else:
                if kind == "closed" and me() == 0:
                    kv_signal(f"error-types-closing/{path}")
                error = _expect_jax_ar_failure(comm, call, f"error_types/{kind}/{path}")
                assert str(error).startswith(f"{status}: jax_ar:"), \
                    f"error_types/{kind}/{path}: {type(error).__name__}: {str(error)[:300]}"
                log(f"error-type {kind} {path} {status} "
                    f"{type(error).__module__}.{type(error).__qualname__}")
                # The same failure as one type: comm.check(), and jax_ar.checked()
                # around a call on the failed communicator.
                try:
                    comm.check()
                    raise AssertionError(f"error_types/{kind}/{path}: comm.check() passed")
                except jax_ar.JaxArError as e:
                    assert isinstance(e, jax_ar.JaxArTimeoutError) == (kind == "never_came"), \
                        repr(e)
                try:
                    with jax_ar.checked(comm):
                        jax.block_until_ready(f(xs[4]))
                    raise AssertionError(f"error_types/{kind}/{path}: checked() passed")
                except jax_ar.JaxArError:  # from XLA's error, or at trace time
                    pass
            if not comm.closed:
                comm.close()


def _expect_jax_ar_failure(comm, call, what):
    """call() must fail with XLA's error (not jax_ar's own) of a jax_ar
    failure; returns it."""
    try:
        jax.block_until_ready(call())
    except jax_ar.JaxArError:
        raise
    except Exception as error:  # XLA's, whichever type
        assert jax_ar.errors.runtime_failure_text(error) is not None, f"{what}: {error!r}"
        return error
    raise AssertionError(f"{what}: the call returned")


def stop_like_a_program(error, scenario):
    """Ends this rank with the error, as a real program would; the launcher
    then ends the job (its peers may be dead or stuck, so this process would
    otherwise wait in jax.distributed's shutdown)."""
    log(f"fault-check ok: {scenario}")
    raise RuntimeError(error)


def main(argv):
    log(f"pid {os.getpid()}")
    name = argv[0]
    globals()[f"scenario_{name}"](tp_mesh())
    log(f"fault-check ok: {name}")
    sys.stdout.flush()


if __name__ == "__main__":
    main_guard(main)
