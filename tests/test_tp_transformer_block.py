"""examples/tp_transformer_block.py: a tensor-parallel Flax NNX transformer
block (column- then row-parallel linears, jax_ar.flax.AllReduceRMSNorm at its
boundaries) matches the same block computed unsharded, on two ranks."""
import pytest

from multiprocess import run_ranks
from norm_skips import fused_target_missing

pytest.importorskip("flax")


def test_tp_transformer_block():
    missing = fused_target_missing()
    if missing:
        pytest.skip(missing)
    run_ranks("norm_flax_worker.py", "tp_block", processes=2, timeout_s=600)
