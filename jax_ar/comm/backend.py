"""What the communicator needs from a device kind (cpu_backend.py and
gpu_backend.py implement it).

A backend allocates a workspace per local device, turns it into a handle
other processes can open, maps peers' workspaces, and registers each local
rank with the compiled module so that FFI handlers find it.
"""
from __future__ import annotations

import abc

__all__ = ["Backend"]


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
