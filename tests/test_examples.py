"""The examples on two ranks: examples/tp_transformer_block.py (a
tensor-parallel Flax NNX block, jax_ar.flax.AllReduceRMSNorm at its
boundaries) against the same block unsharded; examples/gemma_block.py (a
Gemma-style block with jax_ar inside shard_map and in plain jit) against its
twins without jax_ar (psum and jnp norms; XLA's own partitioning)."""
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


def test_gemma_block():
    missing = fused_target_missing()
    if missing:
        pytest.skip(missing)
    check_suite("examples.py", "gemma_block", "gemma_block", processes=2, timeout_s=600)
