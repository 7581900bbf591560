"""When the norm tests cannot run on this machine (shared by their test files)."""
from __future__ import annotations

from harness import ON_GPU


def fused_target_missing() -> str | None:
    """Why the fused all_reduce_rms_norm kernel is unavailable on the GPU, or
    None. On CPU the host module always has it. Without it on a GPU the calls
    would fall back to psum, which NCCL refuses for ranks sharing one GPU."""
    if not ON_GPU:
        return None
    from jax_ar import _native

    try:
        targets = _native.backend_module("gpu").registrations()
    except RuntimeError as e:
        return str(e)
    if "jax_ar_all_reduce_rms_norm" not in targets:
        return "this build's CUDA module has no jax_ar_all_reduce_rms_norm kernel"
    return None
