"""The communicator backend of CPU devices (see backend.Backend): POSIX
shared memory, one segment per device, mapped by every process of the
group and unlinked once all have mapped it."""
from __future__ import annotations

from .. import _native
from .backend import Backend

__all__ = ["CpuBackend"]


class CpuBackend(Backend):
    """CPU devices: POSIX shared memory, one segment per device."""

    platform = "cpu"

    def __init__(self):
        self.module = _native.backend_module("cpu")
        self._opened: dict[tuple[int, str], int] = {}

    def ordinal(self, device) -> int:
        return device.id  # XLA:CPU reports the global device id as the ordinal

    def create(self, comm_id, device, nbytes):
        name, address = self.module.create_workspace(comm_id, nbytes)
        return name, address

    def open(self, comm_id, device, handle, nbytes):
        # All local devices share one mapping of each peer segment.
        key = (comm_id, handle)
        if key not in self._opened:
            self._opened[key] = self.module.open_workspace(comm_id, handle, nbytes)
        return self._opened[key]

    def after_mapping(self, comm_id):
        self.module.unlink_workspaces(comm_id)

    def close(self, comm_id, linger_s=0.0):
        diverged = list(self.module.close_comm(comm_id, linger_s))
        for key in [k for k in self._opened if k[0] == comm_id]:
            del self._opened[key]
        return diverged
