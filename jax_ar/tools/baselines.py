"""What a program without jax_ar runs, which bench and the benchmarks time
jax_ar against: the lax collectives by op name and the jnp RMSNorm that XLA
fuses (the library's own jnp reference, so both compute the same function)."""
from __future__ import annotations

from ..ops.all_reduce import lax_reduce
from ..ops.norm_math import reference as xla_rms_norm
from ..ops.rms_norm import module_serves

__all__ = ["fused_norm_unavailable", "lax_reduce", "xla_rms_norm"]


def fused_norm_unavailable(comm) -> str | None:
    """Why jax_ar's fused all_reduce_rms_norm kernel cannot serve `comm`, or None."""
    if not comm.serves_calls:
        return comm.fallback_reason or "the communicator is closed"
    return module_serves(comm.platform, "jax_ar_all_reduce_rms_norm")
