"""jax_ar.flax: RMSNorm against flax.nnx.RMSNorm (parameter, checkpoints both
ways, outputs for each dtype combination) and AllReduceRMSNorm inside
shard_map, in one launch of two ranks (workers/flax_modules.py)."""
import pytest

from harness import check_suite, runs_on
from norm_skips import fused_target_missing

pytest.importorskip("flax")

pytestmark = runs_on("cpu", "gpu")

WORKER = "flax_modules.py"


@pytest.mark.parametrize("suite", ["rms_norm", "all_reduce_rms_norm"])
def test_flax_modules(suite):
    missing = fused_target_missing()
    if missing:
        pytest.skip(missing)
    check_suite(WORKER, suite, "rms_norm", "all_reduce_rms_norm", processes=2, timeout_s=600)
