"""bench_rank.py with a fault injected, as tests/test_tools_bench.py runs it
in place of bench's rank script (sweep.RANK_SCRIPT): bench_rank_faults.py
CONFIG.json, with JAX_AR_TEST_FAULT=MODE:RANK. The fault hits case (or size
group) 1 in rank RANK:

prepare_fails  RANK's data for case 1 cannot be made (MemoryError), as where
               one rank holds less memory: the others must not wait for it
group_raises   RANK raises at the start of size group 1 (a failure inside a
               collective, which no rank can recover from): the sweep fails
               and keeps group 0
"""
import os
import sys

from jax_ar.tools import bench_rank

import jax

mode, target = os.environ["JAX_AR_TEST_FAULT"].split(":")
target = int(target)
me = jax.process_index()

if mode == "prepare_fails":
    prepare = bench_rank.Runner._prepare

    def _prepare(self, case):
        if me == target and case["index"] == 1:
            raise MemoryError(f"injected: rank {me} cannot hold case 1")
        return prepare(self, case)

    bench_rank.Runner._prepare = _prepare
elif mode == "group_raises":
    run_group = bench_rank.Runner.run_group

    def _run_group(self, cases):
        if me == target and cases[0]["index"] > 0:
            raise RuntimeError(f"injected: rank {me} fails in size group 1")
        return run_group(self, cases)

    bench_rank.Runner.run_group = _run_group
else:
    sys.exit(f"unknown mode {mode!r}")

bench_rank.main(sys.argv[1:])
