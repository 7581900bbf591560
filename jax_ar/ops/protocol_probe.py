"""A diagnostic primitive of the CUDA backend: one launch of one piece of the
all-reduce's launch protocol (cuda/gpu/protocol_probe.h), which the per-call
breakdown (benchmarks/per_call_overhead.py --stages) chains and times.

Stages, each the previous plus one piece: "empty" (a kernel that does
nothing), "launch" (the launch protocol), "header" (the call-header
exchange), "packet" (one LL packet pair to and from every peer); and the
real kernels on the whole operand: "oneshot", "twoshot_ll", "twoshot_plain",
the one-shot with its block size forced ("oneshot_t128", "oneshot_t256") and
without its call header ("oneshot_no_header"); and the one-shot's data path
with pieces left out (no header in either): "oneshot_no_reduce" (the words
xor-ed instead of summed; a result that is not a sum) and "oneshot_packets"
(the packets' exchange alone: no input loads, no output stores).
"""
from __future__ import annotations

import numpy as np

from ._axes import communicator_for
from ._primitive import collective_primitive
from .plan import not_serving

__all__ = ["KERNEL_STAGES", "STAGES", "protocol_probe"]

# In the order of cuda/gpu/protocol_probe.h's ProbeStage.
STAGES = ("empty", "launch", "header", "packet",
          "oneshot", "twoshot_ll", "twoshot_plain", "oneshot_t128", "oneshot_t256",
          "oneshot_no_header", "oneshot_no_reduce", "oneshot_packets")
# The stages whose result is the operand's sum over the ranks;
# "oneshot_no_reduce" returns its words xor-ed over the ranks, the others
# their result buffer as it was.
KERNEL_STAGES = ("oneshot", "twoshot_ll", "twoshot_plain", "oneshot_t128", "oneshot_t256",
                 "oneshot_no_header")


def _ffi_attributes(*, comm_id, stage, **_):
    return dict(comm_id=np.int64(comm_id), stage=np.int32(STAGES.index(stage)))


# The result has the operand's type: the stages that move data all-reduce it,
# the others leave the result buffer as it was. Either way nothing of the
# chain that feeds one probe into the next depends on values.
protocol_probe_p = collective_primitive("jax_ar_protocol_probe", "protocol_probe",
                                        lambda aval, **_: aval, _ffi_attributes,
                                        axis_of=lambda params: params["axis_name"])


def protocol_probe(x, axis_name: str, stage: str):
    """One launch of `stage` over mesh axis `axis_name` (inside shard_map, on
    a GPU communicator that serves calls)."""
    what = "jax_ar protocol_probe"
    if stage not in STAGES:
        raise ValueError(f"{what}: stage must be one of {STAGES}, got {stage!r}")
    if not isinstance(axis_name, str):
        raise TypeError(f"{what}: axis_name must be one mesh axis name, got {axis_name!r}")
    comm = communicator_for(axis_name, what)
    if comm is None:
        raise ValueError(f"{what}: the devices of axis {axis_name!r} are not known while tracing "
                         "(shard_map over a concrete mesh)")
    reason = not_serving(comm) or (None if comm.platform == "gpu" else
                                       f"the probe is the CUDA backend's ({comm.platform})")
    if reason:
        raise ValueError(f"{what}: cannot run over {axis_name!r}: {reason}")
    return protocol_probe_p.bind(x, axis_name=axis_name, comm_id=comm.comm_id, stage=stage)
