"""The communicator backend of CUDA devices (see backend.Backend).

Workspaces are cudaMalloc'd by the compiled module (never XLA's buffers);
other processes map them through CUDA IPC handles (hex strings in the
rendezvous), devices of one process through peer access. verify()
runs a real P2P probe: each rank writes a token through every peer mapping,
reads it back, and waits (with a deadline) for every peer's token in its own
workspace, so broken P2P, or ranks sharing a GPU without CUDA MPS, select
the psum fallback instead of hanging in the first call.
"""
from __future__ import annotations

from .. import _native
from .backend import Backend

__all__ = ["GpuBackend"]


class GpuBackend(Backend):
    platform = "gpu"

    def __init__(self):
        self.module = _native.backend_module("gpu")

    def ordinal(self, device) -> int:
        # XLA:GPU passes the CUDA ordinal of the device within this process
        # (its stream executor's ordinal) to FFI handlers as DeviceOrdinal.
        return device.local_hardware_id

    def physical_id(self, device) -> str:
        return self.module.device_uuid(self.ordinal(device))

    def create(self, comm_id, device, nbytes):
        handle, address = self.module.create_workspace(comm_id, self.ordinal(device), nbytes)
        return handle, address

    def open(self, comm_id, device, handle, nbytes):
        return self.module.open_workspace(comm_id, self.ordinal(device), handle)

    def connect_local(self, comm_id, device, peer_device):
        self.module.connect_local(comm_id, self.ordinal(device), self.ordinal(peer_device))

    def verify(self, comm_id, devices):
        reason = self.module.verify(comm_id, [self.ordinal(d) for d in devices])
        return reason or None
