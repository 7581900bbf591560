"""Bad and odd input to the public API: every case returns the right result
or raises a clear Python exception, and none crashes the process (the cases
run in launched ranks, so a crash fails the test with the case it hit).

See tests/workers/ops_fuzz.py for the cases.
"""
from harness import ON_GPU, run_ranks, runs_on

pytestmark = runs_on("cpu", "gpu")


# Each case compiles a program; GPU compiles are slower, so fewer random ones.
RANDOM_CASES = 20 if ON_GPU else 100
SEED = 0


def test_fuzz_public_api():
    result = run_ranks("ops_fuzz.py", RANDOM_CASES, SEED, processes=2, timeout_s=600)
    for log in result.logs:
        assert "fuzz-check ok" in log, log
