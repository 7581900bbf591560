"""Runs a worker script in several ranks through jax_ar's launcher, and turns
its suites into test results.

Every rank's whole log is shown when any rank fails. The platform comes from
JAX_AR_TEST_PLATFORM: "cpu" (default, CI) or "gpu" (the device machine,
ranks sharing GPUs under CUDA MPS; see scripts/gpu_run.sh).

A worker made of suites (functions `suite_NAME`, run by
workers/common.py:run_suites) is launched once per configuration; each
suite is its own test id (`check_suite`), reading the marker lines every
rank prints: "@@suites planned: a b c", then "@@suite a ok", "@@suite b
skipped: why" or "@@suite c failed" (the worker stops at the first failure).
"""
from __future__ import annotations

import ast
import functools
import os
import pathlib
import re
import tempfile

import pytest

from jax_ar.tools.launch import launch

WORKERS = pathlib.Path(__file__).parent / "workers"
PLATFORM = os.environ.get("JAX_AR_TEST_PLATFORM", "cpu")
ON_GPU = PLATFORM == "gpu"


def runs_on(*platforms: str, reason: str | None = None):
    """A test file's `pytestmark`: the platforms ("cpu", "gpu") its tests run
    on. A file that does not run on one of them says why (`reason`), and is
    skipped there with it. tests/test_platforms.py checks that every test
    file says this, so a new file cannot silently miss the GPU run."""
    unknown = set(platforms) - {"cpu", "gpu"}
    if not platforms or unknown:
        raise ValueError(f"runs_on: platforms must be 'cpu' and/or 'gpu', got {platforms}")
    if len(set(platforms)) < 2 and not reason:
        raise ValueError("runs_on: a file that runs on one platform only must say why (reason=)")
    return [pytest.mark.platforms(*platforms),
            pytest.mark.skipif(PLATFORM not in platforms,
                               reason=f"{'/'.join(platforms)} only: {reason}")]


def run_ranks(worker: str, *args, processes: int = 2, devices_per_process: int = 1,
              timeout_s: float = 300.0, env: dict | None = None, expect_ok: bool = True):
    """Runs tests/workers/<worker> in `processes` ranks with
    `devices_per_process` devices each; fails the test (with every rank's
    log) unless all ranks exit 0. Returns the LaunchResult."""
    if ON_GPU and devices_per_process != 1:
        pytest.skip("on the GPU machine each rank owns one (shared) GPU")
    full_env = dict(os.environ)
    full_env.setdefault("JAX_AR_TIMEOUT_S", "60")
    full_env.update(env or {})
    with tempfile.TemporaryDirectory(prefix="jax_ar_test_logs_") as log_dir:
        result = launch(str(WORKERS / worker), [str(a) for a in args], num_processes=processes,
                        cpu_devices=None if ON_GPU else devices_per_process,
                        platform="gpu" if ON_GPU else "cpu", timeout_s=timeout_s,
                        stream=False, env=full_env, log_dir=log_dir)
        if expect_ok and not result.ok:
            pytest.fail(format_failure(result), pytrace=False)
        if result.ok:
            assert_quiet_exit(log_dir, processes)
    return result


# What gRPC and absl print when a jax.distributed process ends out of order.
_EXIT_NOISE = re.compile(r"UNAVAILABLE|Connection refused|WatchTasksAsync|WatchJobStateAsync"
                         r"|CoordinationService|Terminating process because")


def assert_quiet_exit(log_dir, processes):
    """A job whose ranks all succeeded ends without gRPC or absl lines, even
    in the raw output (the launcher drops them from what it relays)."""
    for rank in range(processes):
        with open(os.path.join(log_dir, f"rank{rank}.log"), errors="replace") as f:
            noisy = [line for line in f if _EXIT_NOISE.search(line)]
        if noisy:
            pytest.fail(f"rank {rank} succeeded but printed:\n{''.join(noisy[:10])}",
                        pytrace=False)


def format_failure(result) -> str:
    parts = [f"jax_ar launch: {result.summary()}"]
    for rank, log in enumerate(result.logs):
        parts.append(f"----- rank {rank} (exit code {result.returncodes[rank]}) -----\n"
                     f"{log.rstrip()}")
    return "\n".join(parts)


@functools.lru_cache(maxsize=None)
def suites_of(worker: str) -> list[str]:
    """The suite names of a worker, in the order it defines them (read from
    its source: pytest collects the ids without starting a rank)."""
    tree = ast.parse((WORKERS / worker).read_text())
    return [node.name[len("suite_"):] for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("suite_")]


_launches: dict = {}
_MARKER = re.compile(r"@@suite (\S+) (ok|failed|skipped: .*)$", re.M)
_PLANNED = re.compile(r"@@suites planned: (.*)$", re.M)


def check_suite(worker: str, suite: str, *args, processes: int = 2,
                devices_per_process: int = 1, timeout_s: float = 600.0,
                env: dict | None = None) -> None:
    """Passes, skips or fails as suite `suite` did on every rank of one launch
    of `worker` with these arguments (launched at the first of its suites'
    test ids and shared by the others)."""
    key = (worker, args, processes, devices_per_process, tuple(sorted((env or {}).items())))
    if key not in _launches:
        _launches.clear()  # one configuration at a time: pytest runs its ids together
        _launches[key] = run_ranks(worker, *args, processes=processes,
                                   devices_per_process=devices_per_process,
                                   timeout_s=timeout_s, env=env, expect_ok=False)
    result = _launches[key]
    planned = [m.group(1).split() for log in result.logs for m in _PLANNED.finditer(log)]
    if planned and all(suite not in p for p in planned):
        pytest.skip(f"{worker} does not run suite {suite!r} in this configuration")
    outcomes = []
    for log in result.logs:
        found = [m.group(2) for m in _MARKER.finditer(log) if m.group(1) == suite]
        outcomes.append(found[-1] if found else None)
    if all(o == "ok" for o in outcomes):
        return
    if all(o is not None and o.startswith("skipped") for o in outcomes):
        pytest.skip(outcomes[0][len("skipped: "):])
    missing = [r for r, o in enumerate(outcomes) if o is None]
    failed = [r for r, o in enumerate(outcomes) if o == "failed"]
    why = (f"suite {suite!r} failed on rank(s) {failed}" if failed else
           f"suite {suite!r} never ended on rank(s) {missing} (an earlier suite failed, or "
           "the launch did)")
    pytest.fail(f"{why}\n{format_failure(result)}", pytrace=False)
