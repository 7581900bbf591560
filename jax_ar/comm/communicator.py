"""jax_ar.setup() and the Communicator it returns.

A communicator belongs to one axis name and a set of devices in rank order:
the mesh's devices fall into groups along the axis (a (2, 4) mesh over
("dp", "tp") set up on "tp" gives 2 groups of 4); each device is one rank of
its group. The registry is keyed by exactly that (platform, axis name, the
groups' device ids in rank order), so several communicators of one axis
name coexist: two device orders of one mesh, the sub-meshes of pipeline
stages. A call finds its communicator by the devices of its own axis
(`find_communicator`), never by the axis name alone. Setup gives every
local device a workspace, exchanges handles with the other processes
through the jax.distributed key-value store, maps every peer's workspace,
and registers each local rank with the compiled module, where the FFI
handlers look it up by (comm_id, device ordinal).
"""
from __future__ import annotations

import atexit
import collections
import hashlib
import os
import threading
from typing import NamedTuple

import jax
import numpy as np

from .. import _native, config
from .._version import __version__
from ..errors import JaxArError, error_for
from .backend import Backend
from .rendezvous import Rendezvous, machine_identity

__all__ = ["Agreement", "Communicator", "close_all", "communicator_by_id", "describe_groups",
           "find_communicator", "mesh_groups", "open_communicator", "open_communicators"]

MIN_WORKSPACE_BYTES = 1 << 20
MAX_WORKSPACE_BYTES = 1 << 40  # more than any GPU or /dev/shm holds; keeps sizes in int64
DEFAULT_WORKSPACE_BYTES = {"cpu": 8 << 20, "gpu": 64 << 20}

_lock = threading.RLock()
_open: dict[tuple, "Communicator"] = {}
_closed: dict[tuple, "Communicator"] = {}  # the last closed one per key, for error messages
_generations: collections.Counter = collections.Counter()


class Communicator:
    """jax_ar's state for one axis over one set of device groups: workspaces,
    peers, and whether it serves calls itself or falls back to psum
    (`fallback_reason`). `mesh` is the mesh given to setup (any mesh with the
    same groups along the axis finds this communicator)."""

    def __init__(self, mesh, axis_name, platform, groups, workspace_bytes, timeout_s, comm_id):
        self.mesh = mesh
        self.axis_name = axis_name
        self.platform = platform
        self.groups = groups  # list of device lists, rank order
        self.group_ids = group_ids(groups)
        self.world_size = len(groups[0])
        self.workspace_bytes = workspace_bytes
        self.timeout_s = timeout_s
        self.comm_id = comm_id
        self.fallback_reason: str | None = None
        # Why psum cannot serve this axis (ranks sharing a GPU), or None;
        # algorithm="auto" then never picks it.
        self.psum_unavailable: str | None = None
        self.local_ranks = {d: rank for group in groups for rank, d in enumerate(group)
                            if d.process_index == jax.process_index()}
        self._backend = None
        self._capacities = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def serves_calls(self) -> bool:
        """True when calls run jax_ar's own kernels (not the psum fallback)."""
        return not self._closed and self.fallback_reason is None

    def holds(self, groups) -> bool:
        """Whether each of `groups` (device lists or id lists, rank order) is
        exactly one of this communicator's groups."""
        mine = set(self.group_ids)
        return all(g in mine for g in group_ids(groups))

    def capacity_bytes(self, key: str) -> int:
        """Largest message one protocol round carries (key "oneshot",
        "twoshot" or, on CUDA, "twoshot_ll"; larger ones take several), a sender's share of a data
        half ("sender_share"), or the longest row the fused norm kernel
        carries in one round of either algorithm ("max_fused_row_bytes"). The
        compiled module of the platform answers from its own workspace layout
        (CPU and GPU divide it differently)."""
        if self._capacities is None:
            try:
                module = backend_for(self.platform).module
            except RuntimeError:  # no module for this platform: psum serves every call
                module = _native.cpu
            self._capacities = dict(module.capacities(self.workspace_bytes, self.world_size))
        return self._capacities[key]

    def handler_calls(self) -> int:
        """How often this process's all-reduce FFI handler of the platform has
        run (host work per call; a CUDA graph replays the kernels without
        it). 0 where the module does not count (CPU)."""
        counter = getattr(self._backend.module if self._backend else None, "handler_calls", None)
        return counter() if counter else 0

    def check(self) -> None:
        """Raises JaxArError if a call has failed on a local rank, or (where
        the backend can tell) on a peer: the communicator is then unusable
        until close() and a new setup()."""
        if self._closed:
            raise JaxArError(f"jax_ar: the communicator of axis {self.axis_name!r} is closed")
        if self._backend is None:
            return
        for device, rank in self.local_ranks.items():
            failure = self._backend.failure(self.comm_id, device)
            if failure:  # JaxArTimeoutError where the failure was a deadline
                raise error_for(f"jax_ar: the communicator of axis {self.axis_name!r} has "
                                f"failed (seen from rank {rank}, {device}): {failure}")

    def close(self) -> None:
        """Releases workspaces and peer mappings, after any call running on
        this process's ranks has ended. Peers still waiting for this process
        stop at once with an error. Compiled functions that used this
        communicator are dropped from JAX's caches, so the next call retraces
        against whatever communicator is set up then. Never raises; if a peer
        has started a call that this process never made, that is logged as
        an error (the peer's call fails)."""
        self._close(linger_s=0.0)

    def _close(self, linger_s: float) -> list[str]:
        diverged = []
        with _lock:
            if self._closed:
                return diverged
            self._closed = True
            if self._backend is not None:
                diverged = [text + _QUEUED_CALLS_HINT
                            for text in self._backend.close(self.comm_id, linger_s) or []]
            for key, comm in list(_open.items()):
                if comm is self:
                    del _open[key]
                    _closed[key] = self
        for text in diverged:
            config.logger.error("jax_ar: %s", text)
        if self._backend is not None:
            jax.clear_caches()
        return diverged

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = ("closed" if self._closed else
                 f"psum fallback: {self.fallback_reason}" if self.fallback_reason else "active")
        return (f"Communicator(axis={self.axis_name!r}, groups={len(self.groups)}x"
                f"{self.world_size}, platform={self.platform}, {state})")


def open_communicator(mesh, axis_name, workspace_bytes=None, timeout_s=None,
                      agreement=None) -> Communicator:
    """jax_ar.setup(): the communicator of `axis_name` over the device groups
    of `mesh` along it, set up once (later calls with the same axis and
    groups return it). Collective over the
    processes that own devices of the mesh. `agreement(comm)` gives an
    Agreement: more fields that every process must agree on, next to the
    configuration."""
    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(f"jax_ar.setup needs a jax.sharding.Mesh, got {type(mesh).__name__}")
    if not isinstance(axis_name, str) or axis_name not in mesh.axis_names:
        raise ValueError(f"jax_ar.setup: axis {axis_name!r} is not an axis of the mesh "
                         f"(axes: {mesh.axis_names})")
    platform = _platform_of(mesh)
    given = {}  # what this call asks for explicitly; None leaves it as set up
    if workspace_bytes is not None:
        if isinstance(workspace_bytes, bool) or not isinstance(workspace_bytes,
                                                                (int, np.integer)):
            raise TypeError(
                f"jax_ar.setup: workspace_bytes must be an int, got {workspace_bytes!r}")
        if not MIN_WORKSPACE_BYTES <= workspace_bytes <= MAX_WORKSPACE_BYTES:
            raise ValueError(
                f"jax_ar.setup: workspace_bytes must be between {MIN_WORKSPACE_BYTES} "
                f"(1 MiB) and {MAX_WORKSPACE_BYTES} (1 TiB), got {workspace_bytes}")
        given["workspace_bytes"] = int(workspace_bytes) // 4096 * 4096
    try:
        timeout = config.resolve_timeout(timeout_s)
    except (TypeError, ValueError) as e:
        raise type(e)(f"jax_ar.setup: {e}") from None
    if timeout_s is not None:
        given["timeout_s"] = timeout

    groups = mesh_groups(mesh, axis_name)
    # A communicator is its devices in rank order: another mesh with the same
    # groups along the axis (another shape, other axis names) is the same one.
    key = (platform, axis_name, group_ids(groups))
    with _lock:
        existing = _open.get(key)
        if existing is not None:
            for name, value in given.items():
                if value != getattr(existing, name):
                    raise ValueError(
                        f"jax_ar.setup: axis {axis_name!r} over these devices is already set "
                        f"up with {name}={getattr(existing, name)}; close() it first to change "
                        f"it (or pass {name}=None to take it as it is)")
            return existing
        workspace_bytes = given.get(
            "workspace_bytes", DEFAULT_WORKSPACE_BYTES.get(platform, MIN_WORKSPACE_BYTES))
        _generations[key] += 1
        comm_id = _stable_id(key, _generations[key])
        comm = Communicator(mesh, axis_name, platform, groups, workspace_bytes, timeout, comm_id)
        _connect(comm, agreement or (lambda comm: Agreement({})))
        _open[key] = comm
        _closed.pop(key, None)
        return comm


def mesh_groups(mesh, axis_name) -> list[list]:
    """The devices of `mesh` in groups along `axis_name`, each in rank order
    (its position along the axis); groups follow the other axes row-major."""
    axis = tuple(mesh.axis_names).index(axis_name)
    devices = np.moveaxis(np.asarray(mesh.devices), axis, -1)
    return [list(row) for row in devices.reshape(-1, devices.shape[-1])]


def group_ids(groups) -> tuple:
    """Groups of devices (or of device ids) as a tuple of tuples of ids."""
    return tuple(tuple(d if isinstance(d, (int, np.integer)) else d.id for d in g)
                 for g in groups)


def describe_groups(groups, limit: int = 4) -> str:
    """The device ids of `groups` in rank order, e.g. [[0, 1], [2, 3]] (the
    first `limit` groups)."""
    ids = [list(g) for g in group_ids(groups)]
    more = f" and {len(ids) - limit} more groups" if len(ids) > limit else ""
    return f"{ids[:limit]}{more}"


def find_communicator(axis_name, groups, closed=False) -> Communicator | None:
    """The open communicator of `axis_name` that holds every one of `groups`
    (the device groups of the call's axis, each in rank order), or None.
    One whose groups are exactly these comes first; among several, the one
    set up last. The choice depends only on the devices and the order of
    setups, so every rank of a group makes the same one. With closed=True,
    the last closed one that held them (and was not set up again), for
    error messages."""
    with _lock:
        pool = _closed if closed else _open
        candidates = [c for c in pool.values() if c.axis_name == axis_name and c.holds(groups)]
    wanted = set(group_ids(groups))
    exact = [c for c in candidates if set(c.group_ids) == wanted]
    candidates = exact or candidates
    return candidates[-1] if candidates else None


def communicator_by_id(comm_id) -> Communicator | None:
    """The open communicator with this comm_id, or None (closed, or never)."""
    with _lock:
        return next((c for c in _open.values() if c.comm_id == comm_id), None)


_backends: dict[str, Backend] = {}


def backend_for(platform: str) -> Backend:
    """The backend of `platform` ("cpu" or "gpu"); RuntimeError if unavailable."""
    if platform not in _backends:
        if platform == "cpu":
            from .cpu_backend import CpuBackend as backend
        elif platform == "gpu":
            from .gpu_backend import GpuBackend as backend
        else:
            raise RuntimeError(f"jax_ar has no backend for {platform!r} devices")
        _backends[platform] = backend()
    return _backends[platform]


def open_communicators(axis_name=None) -> list[Communicator]:
    """Every open communicator (of `axis_name`, if given), oldest first."""
    with _lock:
        if axis_name is not None:
            return [c for c in _open.values() if c.axis_name == axis_name]
        return list(_open.values())


def _platform_of(mesh) -> str:
    platforms = {d.platform for d in mesh.devices.flat}
    if len(platforms) != 1:
        raise ValueError(f"jax_ar.setup: the mesh mixes device kinds {sorted(platforms)}")
    platform = platforms.pop()
    return "gpu" if platform in ("gpu", "cuda") else platform


def _stable_id(key, generation) -> int:
    digest = hashlib.blake2b(repr((key, generation)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 62) - 1)  # fits the int64 FFI attribute


def host_identity() -> str:
    """What makes two processes "the same host": JAX_AR_HOST_ID if set (tests
    use it to make processes stand in for hosts), else hostname and boot id."""
    return os.environ.get("JAX_AR_HOST_ID") or machine_identity()


class Agreement(NamedTuple):
    """What else every process of a setup must agree on (jax_ar.setup: how
    algorithms are chosen). `values` (JSON-able) are compared; `shown` says
    a value in an error where its repr would not tell the user what it is
    (where it came from); `advice` is what to do when one of them differs."""
    values: dict
    shown: dict | None = None
    advice: str = ""


# What to do when the configuration itself differs between processes.
_CONFIGURATION_ADVICE = ("Every process must call jax_ar.setup with the same mesh, axis and "
                         "workspace_bytes, and run the same jax_ar version.")


def _fingerprint(comm: Communicator, agreed: Agreement) -> dict:
    return {
        **agreed.values,
        "version": __version__,
        "platform": comm.platform,
        "axis": comm.axis_name,
        "groups": hashlib.blake2b(repr(comm.group_ids).encode(), digest_size=8).hexdigest(),
        "group_size": comm.world_size,
        "workspace_bytes": comm.workspace_bytes,
    }


def _disagreement(mine: dict, theirs: dict, agreed: Agreement, me: str, them: str,
                  their_process: int, label: str) -> str:
    """setup's error for two processes' differing fingerprints (with what
    each side's `shown` says of its values): every field that differs, and
    what to do about those."""
    def show(side, key):
        value = side["fingerprint"].get(key)
        return side.get("shown", {}).get(key) or repr(value)

    keys = [k for k in sorted(set(mine["fingerprint"]) | set(theirs["fingerprint"]))
            if mine["fingerprint"].get(k) != theirs["fingerprint"].get(k)]
    diffs = [f"{k}: {show(mine, k)} here vs {show(theirs, k)} on process {their_process}"
             for k in keys]
    advice = []
    if any(k not in agreed.values for k in keys):
        advice.append(_CONFIGURATION_ADVICE)
    if agreed.advice and any(k in agreed.values for k in keys):
        advice.append(agreed.advice)
    return (f"jax_ar.setup: {me} and {them} disagree on the configuration of {label}: "
            f"{'; '.join(diffs)}. {' '.join(advice)}")


def _connect(comm: Communicator, agreement) -> None:
    """Allocates, exchanges and maps workspaces; sets comm.fallback_reason
    where jax_ar cannot serve. Every process reaches the same decision."""
    label = f"axis '{comm.axis_name}'"
    max_ranks = _native.limits(comm.platform)["max_ranks"]
    if comm.world_size == 1:
        return _fall_back(comm, f"{label} has size 1")
    if comm.world_size > max_ranks:
        return _fall_back(comm, f"{label} has {comm.world_size} devices, more than {max_ranks}")
    try:
        backend = backend_for(comm.platform)
    except RuntimeError as e:
        return _fall_back(comm, f"{e} ({label})")

    me = jax.process_index()
    processes = sorted({d.process_index for d in comm.mesh.devices.flat})
    ranks_of = collections.defaultdict(list)
    for group in comm.groups:
        for rank, d in enumerate(group):
            ranks_of[d.process_index].append(rank)

    def describe(process):
        ranks = sorted(set(ranks_of[process]))
        return f"process {process} (rank{'s' if len(ranks) > 1 else ''} " \
               f"{', '.join(map(str, ranks))} of {label})"

    if me not in processes:
        return  # owns no device of the mesh: nothing to allocate or map
    rendezvous = Rendezvous(f"jax_ar/{comm.comm_id}", me, processes, comm.timeout_s, describe)
    try:
        _establish(comm, backend, rendezvous, me, label, describe, agreement)
    except BaseException as e:
        rendezvous.publish_failure(f"{type(e).__name__}: {e}")
        backend.close(comm.comm_id)
        raise


def _establish(comm, backend, rendezvous, me, label, describe, agreement):
    # Every process is here before any creates a named workspace: a process
    # killed while it waits for a missing peer then leaves nothing in /dev/shm.
    rendezvous.barrier("arrived")
    nbytes = comm.workspace_bytes
    local_devices = list(comm.local_ranks)
    handles, addresses = {}, {}
    for d in local_devices:
        try:
            handles[d.id], addresses[d.id] = backend.create(comm.comm_id, d, nbytes)
        except (RuntimeError, OSError, MemoryError) as e:
            raise JaxArError(f"jax_ar.setup: {describe(me)} could not allocate its "
                             f"{nbytes}-byte workspace (workspace_bytes) on {d}: {e}") from e
    agreed = agreement(comm)
    info = rendezvous.all_gather("info", {
        "fingerprint": _fingerprint(comm, agreed),
        "shown": agreed.shown or {},
        "host": host_identity(),
        "handles": {str(k): v for k, v in handles.items()},
        "hardware": {str(d.id): backend.physical_id(d) for d in local_devices},
    })

    for process, other in sorted(info.items()):
        if other["fingerprint"] != info[me]["fingerprint"]:
            raise JaxArError(_disagreement(info[me], other, agreed, describe(me),
                                           describe(process), process, label))

    host_of = {p: v["host"] for p, v in info.items()}
    spanning = [g for g in comm.groups if len({host_of[d.process_index] for d in g}) > 1]
    if spanning:
        hosts = ", ".join(sorted({host_of[d.process_index] for d in spanning[0]}))
        backend.close(comm.comm_id)
        return _fall_back(comm, f"a group of {label} spans several hosts ({hosts})")

    hardware_of = {int(k): (host_of[p], h) for p, v in info.items()
                   for k, h in v["hardware"].items() if h is not None}
    for group in comm.groups:
        shared = [d for d in group if d.id in hardware_of
                  and sum(hardware_of.get(e.id) == hardware_of[d.id] for e in group) > 1]
        if shared:
            comm.psum_unavailable = (f"ranks of {label} share a GPU ({shared[0]} with others), "
                                     "where NCCL refuses to run")
            break

    handle_of = {int(k): (p, h) for p, v in info.items() for k, h in v["handles"].items()}
    for d, rank in comm.local_ranks.items():
        group = next(g for g in comm.groups if d in g)
        peer_addresses = []
        for peer in group:
            if peer.process_index == me:
                if peer is not d:
                    backend.connect_local(comm.comm_id, d, peer)
                peer_addresses.append(addresses[peer.id])
            else:
                peer_addresses.append(backend.open(comm.comm_id, d, handle_of[peer.id][1], nbytes))
        backend.register(comm.comm_id, d, rank, comm.world_size, peer_addresses, nbytes,
                         comm.timeout_s, label)
    rendezvous.barrier("mapped")
    backend.after_mapping(comm.comm_id)
    comm._backend = backend

    problems = rendezvous.all_gather("verified", backend.verify(comm.comm_id, local_devices))
    reasons = sorted({r for r in problems.values() if r})
    if reasons:
        backend.close(comm.comm_id)
        comm._backend = None
        _fall_back(comm, f"peers of {label} are not reachable ({'; '.join(reasons)})")


# A close that finds a peer inside a call this process never made: the
# process may have skipped it, or dispatched it and closed (or ended) before
# it started. XLA runs programs asynchronously and close() cannot see calls
# still queued, so the message names the second cause too.
_QUEUED_CALLS_HINT = (". If this process had dispatched calls that had not started when it "
                      "closed (or its script ended), that is the cause: wait for the results "
                      "(jax.block_until_ready) before close() or the end")


def _fall_back(comm: Communicator, reason: str) -> None:
    """Records why psum serves `comm` (every process decides the same), and
    says so once; each call it serves says so again (ops/plan.py)."""
    comm.fallback_reason = reason
    config.log_once(("fallback", comm.comm_id), f"jax_ar: {reason}; psum serves it")


def close_all() -> list[str]:
    """Closes every open communicator at the end of the program; returns the
    calls that peers made and this process did not (the launcher fails a
    rank whose script ends with any). Each close waits up to the
    communicator's deadline for its peers to close too, so that such calls
    are seen for certain (in a job of several processes, jax.distributed's
    shutdown waits for every peer anyway)."""
    skipped = []
    for comm in open_communicators():
        try:
            skipped += comm._close(linger_s=comm.timeout_s)
        except Exception:  # exit must go on; the OS reclaims what is left
            pass
    return skipped


atexit.register(close_all)
