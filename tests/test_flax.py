"""jax_ar.flax: RMSNorm against flax.nnx.RMSNorm (parameter, checkpoints both
ways, outputs for each dtype combination) and a Gemma-style norm,
AllReduceRMSNorm inside shard_map (post_norm, mixed dtypes, stacked layers
under nnx.vmap and nnx.scan), RowParallelLinear against flax.nnx.Linear, in
one launch of two ranks (workers/flax_modules.py)."""
import pytest

from harness import check_suite, runs_on
from norm_skips import fused_target_missing

pytest.importorskip("flax")

pytestmark = runs_on("cpu", "gpu")

WORKER = "flax_modules.py"


SUITES = ["rms_norm", "gemma_norm", "all_reduce_rms_norm", "stacked_layers",
          "row_parallel_linear"]


@pytest.mark.parametrize("suite", SUITES)
def test_flax_modules(suite):
    missing = fused_target_missing()
    if missing:
        pytest.skip(missing)
    check_suite(WORKER, suite, *SUITES, processes=2, timeout_s=600)
