"""jax_ar.setup(): the public entry to comm/.

Besides the configuration the communicator checks, every process must pick
algorithms alike: ranks that chose differently could meet psum on one side
and a jax_ar kernel on the other, which no deadline inside NCCL would end.
So the cost table's digest and JAX_AR_ALGO are part of what setup agrees on;
where they differ, the error says where each side's table came from.
"""
from __future__ import annotations

import hashlib
import os

from . import config, selection
from .comm.communicator import Agreement, Communicator, open_communicator
from .selection.table import TABLE_ENV

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


_ADVICE = ("Every process must choose algorithms alike: set the same JAX_AR_TABLE (a file "
           "every process reads, or 'default') and the same JAX_AR_ALGO on every process, or "
           "give them the same tuned table in the cache directory ($XDG_CACHE_HOME/jax_ar or "
           "~/.cache/jax_ar).")


def _algorithm_agreement(comm: Communicator) -> Agreement:
    """The cost table (by a digest of its curves) and JAX_AR_ALGO; an error
    says where each side's table came from and what JAX_AR_ALGO it has."""
    table = selection.table_for(comm.platform, comm.groups[0][0].device_kind, comm.world_size)
    curves = sorted((name, repr(curve)) for name, curve in table.curves.items())
    digest = hashlib.blake2b(repr(curves).encode(), digest_size=8).hexdigest()
    algo = os.environ.get("JAX_AR_ALGO")
    return Agreement(
        values={"cost_table": digest, "JAX_AR_ALGO": config.algorithm_override() or "auto"},
        shown={"cost_table": f"{_table_origin(table)}, digest {digest}",
               "JAX_AR_ALGO": f"{algo!r}" if algo and algo.strip() else "unset (auto)"},
        advice=_ADVICE)


def _table_origin(table) -> str:
    """Where `table` came from, as the user set it up."""
    override = os.environ.get(TABLE_ENV, "").strip()
    if table.source.startswith("defaults"):
        if override:
            return f"the shipped defaults ({TABLE_ENV}={override})"
        return f"the shipped defaults (no {TABLE_ENV}, no tuned file in the cache)"
    if override:
        return f"{TABLE_ENV}={table.source}"
    return f"the tuned file {table.source} (from the cache)"
