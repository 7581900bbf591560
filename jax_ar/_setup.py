"""jax_ar.setup(): the public entry to comm/.

Besides the configuration the communicator checks, every process must pick
algorithms alike: ranks that chose differently could meet psum on one side
and a jax_ar kernel on the other, which no deadline inside NCCL would end.
So the cost table's digest and JAX_AR_ALGO are part of what setup agrees on.
"""
from __future__ import annotations

import hashlib

from . import config, selection
from .comm.communicator import Communicator, open_communicator

__all__ = ["setup"]


def setup(mesh, axis_name, workspace_bytes=None, timeout_s=None) -> Communicator:
    """Sets up jax_ar for `axis_name` of `mesh`: a workspace on every local
    device of the mesh, peers' handles exchanged through jax.distributed,
    and a check that every process agrees on the configuration. Collective:
    every process that owns devices of the mesh calls it with the same
    arguments. Idempotent for the same (mesh, axis): a later call returns
    the same Communicator, whose workspace_bytes and timeout_s None leaves
    as set up (other values than it has raise ValueError). Returns the
    Communicator (close() releases it; so does the end of the process)."""
    config.algorithm_override()  # a bad JAX_AR_ALGO fails here, before any peer waits
    return open_communicator(mesh, axis_name, workspace_bytes, timeout_s,
                             agreement=_algorithm_agreement)


def _algorithm_agreement(comm: Communicator) -> dict:
    table = selection.table_for(comm.platform, comm.groups[0][0].device_kind, comm.world_size)
    curves = sorted((name, repr(curve)) for name, curve in table.curves.items())
    return {"cost_table": hashlib.blake2b(repr(curves).encode(), digest_size=8).hexdigest(),
            "JAX_AR_ALGO": config.algorithm_override() or "auto"}
