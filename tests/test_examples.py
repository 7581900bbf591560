"""examples/tp_transformer_block.py: a tensor-parallel Flax NNX transformer
block (column- then row-parallel linears, jax_ar.flax.AllReduceRMSNorm at its
boundaries) matches the same block computed unsharded, on two ranks."""
import pytest

from harness import check_suite, runs_on
from norm_skips import fused_target_missing

pytest.importorskip("flax")

pytestmark = runs_on("cpu", "gpu")


def test_tp_transformer_block():
    missing = fused_target_missing()
    if missing:
        pytest.skip(missing)
    check_suite("flax_modules.py", "tp_block", "tp_block", processes=2, timeout_s=600)
