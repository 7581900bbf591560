"""What the communicator needs from a device kind, and the CPU implementation.

A backend allocates a workspace per local device, turns it into a handle
other processes can open, maps peers' workspaces, and registers each local
rank with the compiled module so that FFI handlers find it. The CUDA
backend lives in _cuda_backend.py.
"""
from __future__ import annotations

import abc

from . import _native

__all__ = ["Backend", "HostBackend", "backend_for"]


class Backend(abc.ABC):
    platform: str
    module: object

    def ordinal(self, device) -> int:
        """The device ordinal XLA passes to FFI handlers for `device`."""
        raise NotImplementedError

    @abc.abstractmethod
    def create(self, comm_id: int, device, nbytes: int) -> tuple[str, int]:
        """Allocates `device`'s workspace; returns (handle for peers, address)."""

    @abc.abstractmethod
    def open(self, comm_id: int, device, handle: str, nbytes: int) -> int:
        """Maps a peer process's workspace for use by local `device`."""

    def connect_local(self, comm_id: int, device, peer_device) -> None:
        """Lets `device` reach the workspace of `peer_device` of this process."""

    def after_mapping(self, comm_id: int) -> None:
        """Called once every process has mapped every peer it needs."""

    def verify(self, comm_id: int, devices) -> str | None:
        """Checks that the registered ranks can reach their peers; returns why
        not, or None. Runs after a barrier, so peers are registered too."""
        return None

    def register(self, comm_id: int, device, rank: int, world: int, addresses: list[int],
                 nbytes: int, timeout_s: float, label: str) -> None:
        self.module.register_rank(comm_id, self.ordinal(device), rank, world, addresses, nbytes,
                                  timeout_s, label)

    def physical_id(self, device) -> str | None:
        """Identity of the hardware behind `device` (None where it does not
        matter): ranks on the same hardware cannot use psum (NCCL refuses)."""
        return None

    def failure(self, comm_id: int, device) -> str:
        return self.module.failure(comm_id, self.ordinal(device))

    def close(self, comm_id: int, linger_s: float = 0.0) -> list[str]:
        """Releases the communicator's ranks in this process; returns messages
        about peers that started calls these ranks never made (a backend
        that can tell waits up to `linger_s` for the peers to close)."""
        return list(self.module.close_comm(comm_id) or [])


class HostBackend(Backend):
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


_backends: dict[str, Backend] = {}


def backend_for(platform: str) -> Backend:
    """The backend of `platform` ("cpu" or "gpu"); RuntimeError if unavailable."""
    if platform not in _backends:
        if platform == "cpu":
            _backends[platform] = HostBackend()
        elif platform == "gpu":
            from ._cuda_backend import CudaBackend

            _backends[platform] = CudaBackend()
        else:
            raise RuntimeError(f"jax_ar has no backend for {platform!r} devices")
    return _backends[platform]
