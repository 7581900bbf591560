"""The per-call breakdown of an all-reduce: the protocol probe's stages
(jax_ar/ops/protocol_probe.py), for benchmarks/per_call_overhead.py."""
from ..ops.protocol_probe import KERNEL_STAGES, STAGES, protocol_probe

__all__ = ["KERNEL_STAGES", "STAGES", "protocol_probe"]
