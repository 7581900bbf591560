"""jax_ar.flax: RMSNorm against flax.nnx.RMSNorm (parameter, checkpoints both
ways, outputs for each dtype combination) and AllReduceRMSNorm inside
shard_map, in one launch of two ranks (workers/norm_flax_worker.py)."""
import pytest

from multiprocess import run_ranks
from norm_skips import fused_target_missing

pytest.importorskip("flax")


def test_flax_modules():
    missing = fused_target_missing()
    if missing:
        pytest.skip(missing)
    run_ranks("norm_flax_worker.py", "rms_norm", "all_reduce_rms_norm", processes=2,
              timeout_s=600)
