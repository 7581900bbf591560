"""What every collective asks about its axes before it binds a primitive:
what kind of axis each name is (a manual axis of the enclosing shard_map, a
vmap axis, a positional one), which communicator serves a mesh axis (found
by the devices of that axis, at trace time, and checked again when the call
is lowered), and how a value is made varying over an axis."""
from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import numpy as np

import jax
import jax.numpy as jnp

from .. import _compat
from ..comm.communicator import (Communicator, communicator_by_id, describe_groups,
                                 find_communicator, mesh_groups, open_communicators)
from ..errors import JaxArError

__all__ = ["GATHER_DTYPES", "REDUCE_DTYPES", "Axes", "as_varying", "check_dtype",
           "classify_axes", "communicator_for", "inner_axis", "lookup", "lowered_comm_id",
           "no_communicator_for_any", "normalize_axes", "trivial_index_groups"]

# The element types the reductions (all_reduce, reduce_scatter) carry.
REDUCE_DTYPES = tuple(np.dtype(t) for t in (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32))
# All-gather only moves bytes, so it takes more dtypes than the reductions.
GATHER_DTYPES = REDUCE_DTYPES + tuple(np.dtype(t) for t in (
    np.int8, np.uint8, np.bool_, np.int16, np.uint16, np.uint32, np.int64, np.uint64,
    np.float64, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2))


def normalize_axes(axis_name, what: str) -> tuple:
    """`axis_name` as a tuple of names, as jax.lax takes it: one name, or a
    tuple or list of names (empty: no axis at all)."""
    axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    for a in axes:
        try:
            hash(a)
        except TypeError:
            raise TypeError(f"{what}: axis_name must be a mesh or vmap axis name (a str) or a "
                            f"tuple of them, got {axis_name!r}") from None
        if a is None or isinstance(a, (bool, np.bool_)):
            raise TypeError(f"{what}: axis_name must be a mesh or vmap axis name (a str) or a "
                            f"tuple of them, got {axis_name!r}")
    if len(set(axes)) != len(axes):
        raise ValueError(f"{what}: axis_name names an axis twice: {axis_name!r}")
    return axes


@dataclasses.dataclass(frozen=True)
class Axes:
    """The axes of one call, by kind; each kind in the order given.

    mesh: manual axes of the enclosing shard_map with more than one device
      (those jax_ar's kernels serve); single: manual axes of size 1 and
      vmap: vmap axes (jax.lax's collectives there are local arithmetic: no
      data leaves the device, so no communicator is needed); positional:
      int axes (jax.lax's positional reductions)."""
    names: tuple
    mesh: tuple
    single: tuple
    vmap: tuple
    positional: tuple

    @property
    def size(self) -> int:
        """How many values a reduction over the named axes combines."""
        return math.prod(axis_size(a) for a in self.names if a not in self.positional)


def axis_size(name) -> int:
    return jax.lax.axis_size(name)


def classify_axes(axes: tuple, what: str) -> Axes:
    """The kinds of `axes`; ValueError naming `what` for a name that is
    bound neither by the enclosing shard_map nor by a vmap."""
    mesh = jax.sharding.get_abstract_mesh()
    manual = set(getattr(mesh, "manual_axes", ()))
    kinds = {"mesh": [], "single": [], "vmap": [], "positional": []}
    for a in axes:
        if isinstance(a, (int, np.integer)):
            kinds["positional"].append(a)
            continue
        try:
            size = axis_size(a)
        except NameError:
            size = None
        if size is not None and a in manual and size != mesh.shape[a]:
            # A vmap inside the shard_map bound the same name: jax.lax
            # reduces over the inner binding, which jax_ar cannot tell from
            # the mesh axis (it can only see that the sizes differ).
            raise ValueError(f"{what}: axis {a!r} names both a manual axis of the enclosing "
                             f"shard_map (size {mesh.shape[a]}) and a vmap axis inside it "
                             f"(size {size}); give the vmap axis another name")
        if size is not None and a in manual:
            kinds["mesh" if size > 1 else "single"].append(a)
        elif size is not None:
            kinds["vmap"].append(a)
        else:
            where = ("outside jax.shard_map" if not manual else
                     f"over axis {a!r}, which is neither a manual axis of the enclosing "
                     f"shard_map (its axes: {sorted(manual, key=str)}) nor a vmap axis")
            raise ValueError(f"{what} called {where}; call it inside jax.shard_map over a "
                             f"mesh with axis {a!r} (or inside jax.vmap with axis_name={a!r})")
    return Axes(tuple(axes), *(tuple(kinds[k]) for k in ("mesh", "single", "vmap", "positional")))


def trivial_index_groups(axis_index_groups, axes: tuple, what: str) -> bool:
    """Whether `axis_index_groups` is None or one group of every index of
    the axes in order (jax.lax then does what it does without groups).
    ValueError naming `what` unless the groups cover the indices of the
    axes exactly once (jax.lax checks less, and XLA then fails to compile)."""
    if axis_index_groups is None:
        return True
    total = math.prod(axis_size(a) for a in axes if not isinstance(a, (int, np.integer)))
    try:
        groups = [[int(i) for i in g] for g in axis_index_groups]
    except TypeError:
        raise TypeError(f"{what}: axis_index_groups must be a list of lists of axis indices, "
                        f"got {axis_index_groups!r}") from None
    if sorted(i for g in groups for i in g) != list(range(total)):
        raise ValueError(f"{what}: axis_index_groups must cover the indices 0..{total - 1} of "
                         f"axis_name exactly once, got {axis_index_groups!r}")
    return groups == [list(range(total))]


def check_dtype(what: str, leaf, supported) -> None:
    dtype = getattr(leaf, "dtype", None)
    if dtype is None or np.dtype(dtype) not in supported:
        raise TypeError(f"{what}: unsupported dtype {dtype} (supported: "
                        f"{', '.join(str(d) for d in supported)})")


@dataclasses.dataclass(frozen=True)
class Lookup:
    """The communicator of one mesh axis of a call, found by its devices.

    comm is None when `groups` is None (the devices are not known while
    tracing: a shard_map over an AbstractMesh outside jax.set_mesh) or when
    no communicator holds these groups."""
    axis: object
    groups: list | None
    comm: Communicator | None


def lookup(axis) -> Lookup:
    """The communicator whose groups are exactly the devices (in rank order)
    of `axis` of the enclosing shard_map's mesh."""
    mesh = _compat.shard_map_mesh()
    if mesh is None:
        return Lookup(axis, None, None)
    groups = mesh_groups(mesh, axis)
    return Lookup(axis, groups, find_communicator(axis, groups))


def no_communicator_message(what: str, axis, groups) -> str:
    others = [describe_groups(c.groups) for c in open_communicators(axis)]
    have = (f"; the communicators of axis {axis!r} that are set up hold other devices: "
            f"{'; '.join(others)}" if others else f"; no communicator of axis {axis!r} is set up")
    return (f"{what}: no communicator for axis {axis!r} over devices {describe_groups(groups)} "
            f"(device ids in rank order){have}. Call jax_ar.setup(mesh, {axis!r}) with the mesh "
            "this shard_map runs on before tracing")


def unknown_devices_reason(axis) -> str:
    return (f"the devices of axis {axis!r} are unknown while tracing (a shard_map over an "
            "AbstractMesh outside jax.set_mesh), so no communicator can be chosen")


def communicator_for(axis, what: str) -> Communicator | None:
    """The communicator serving mesh axis `axis` of a call of `what`.
    ValueError (at trace time) when none is set up for the devices of the
    axis. None when the devices are unknown while tracing (the plan then
    lowers the call to jax.lax and says why)."""
    found = lookup(axis)
    if found.groups is None:
        return None
    if found.comm is None:
        if find_communicator(axis, found.groups, closed=True) is not None:
            # Tracing a call that could only fail at run time fails now,
            # with jax_ar's own type.
            raise JaxArError(f"{what} over axis {axis!r}: the communicator of its devices "
                             f"{describe_groups(found.groups)} was closed; call "
                             f"jax_ar.setup(mesh, {axis!r}) again before tracing")
        raise ValueError(no_communicator_message(what, axis, found.groups))
    found.comm.check()  # a communicator that failed stays failed until close() and setup()
    return found.comm


def inner_axis(axes, what):
    """Of several mesh axes, the one jax_ar serves: (axis, communicator,
    None), or (None, None, why) when none can (why None: the devices are
    unknown while tracing). ValueError when no axis was set up at all."""
    lookups = [lookup(a) for a in axes]
    if any(f.groups is None for f in lookups):
        return None, None, None
    found = [(f.axis, f.comm) for f in lookups if f.comm is not None]
    if not found:
        raise ValueError(no_communicator_for_any(what, lookups))
    serving = [(a, c) for a, c in found if c.serves_calls]
    if not serving:
        return None, None, "; ".join(f"{a!r}: {c.fallback_reason or 'closed'}" for a, c in found)
    # The largest group keeps the most traffic inside the host; on a tie the
    # later axis wins (meshes put the intra-host axis last).
    axis, comm = max(reversed(serving), key=lambda ac: ac[1].world_size)
    comm.check()  # JaxArError now for a communicator that has failed
    return axis, comm, None


def no_communicator_for_any(what, lookups) -> str:
    axes = tuple(f.axis for f in lookups)
    detail = "; ".join(no_communicator_message(what, f.axis, f.groups) for f in lookups)
    return (f"{what}: no communicator for any of the axes {axes}; call jax_ar.setup(mesh, axis) "
            f"for the axis whose devices share a host before tracing ({detail})")


def lowered_comm_id(ctx, axis, comm_id: int, what: str) -> int:
    """The comm_id a call lowers to, checked against the devices it runs on.

    The communicator was chosen when the call was traced; jax may reuse a
    traced jaxpr for another mesh with the same axis names and sizes (a
    jitted function called in shard_maps over two device orders). Where the
    lowering context names the devices, the call therefore uses the open
    communicator that holds the groups of its axis: the traced one when it
    does, else another one of the same configuration; ValueError (still
    before anything runs) when there is none. A communicator closed since
    tracing keeps its id: the call then fails with "no communicator ...
    closed" when it runs, as documented."""
    mesh = _compat.lowering_mesh(ctx)
    traced = communicator_by_id(comm_id)
    if mesh is None or traced is None:
        return comm_id
    groups = mesh_groups(mesh, axis)
    if traced.holds(groups):
        return comm_id
    found = find_communicator(axis, groups)
    if found is None:
        raise ValueError(no_communicator_message(what, axis, groups) + " (found when lowering)")
    if _configuration(found) != _configuration(traced):
        raise ValueError(
            f"{what}: the call over axis {axis!r} was traced for the communicator over "
            f"{describe_groups(traced.groups)} but is lowered for devices "
            f"{describe_groups(groups)}, whose communicator is configured differently "
            f"({_configuration(found)} vs {_configuration(traced)}); trace the function again "
            "for this mesh (jax.clear_caches())")
    return found.comm_id


def _configuration(comm) -> dict:
    """What tracing decided from (fallback, packing, the algorithm table):
    whether psum can run, not the wording of why not (which names a device)."""
    return dict(platform=comm.platform, world_size=comm.world_size,
                workspace_bytes=comm.workspace_bytes, serves_calls=comm.serves_calls,
                psum_available=comm.psum_unavailable is None)


def as_varying(x, axes):
    """`x`, marked varying over those of `axes` it does not vary over yet."""
    missing = tuple(a for a in axes if a not in _compat.varying_axes(jax.typeof(x)))
    return _compat.pcast_to_varying(x, missing) if missing else x
