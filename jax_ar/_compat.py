"""Every use of JAX internals in jax_ar, in one place.

jax_ar supports jax 0.10 to 0.12 (CI: 0.10.x on Python 3.11; 0.11.2 and
the newest, 0.12.x, on Python 3.12). Public APIs are used wherever they
exist; what they do not offer (rewriting the varying-axes part of an abstract
value, reading whether check_vma is on, the jax.distributed client, the
devices of the shard_map being traced or lowered) is reached here and
nowhere else, with the alternatives older releases spell differently.
"""
from __future__ import annotations

import contextlib
import sys

import jax

__all__ = [
    "LAX_GATHER_INVARIANT_NEEDS_VARYING",
    "LAX_REDUCTIONS_KEEP_WEAK_TYPE",
    "check_vma_enabled",
    "distributed_client",
    "has_explicit_sharding",
    "lowering_mesh",
    "partitioning_mesh",
    "pcast_to_varying",
    "requires_devices_during_lowering",
    "shaped_array",
    "shard_map_mesh",
    "unreduced_axes",
    "varying_axes",
    "with_varying_axes",
    "without_vma_checks",
]


# Whether jax.lax's psum / pmax / pmin keep a weakly typed operand's weak
# type without check_vma (with it, every supported release keeps it):
# from jax 0.12.1 on (pmax(1) is a weak int32 there, a strong one in
# 0.10 to 0.12.0).
_JAX_VERSION = tuple(getattr(jax, "__version_info__", (0, 0, 0))[:3])
LAX_REDUCTIONS_KEEP_WEAK_TYPE = _JAX_VERSION >= (0, 12, 1)
# Whether jax.lax.all_gather(..., to="invarying") under check_vma refuses an
# operand that does not vary over the gathered manual axes (ValueError):
# from jax 0.12.1 on; 0.10 to 0.12.0 take it.
LAX_GATHER_INVARIANT_NEEDS_VARYING = _JAX_VERSION >= (0, 12, 1)


def varying_axes(aval) -> frozenset:
    """Mesh axes over which values of `aval` vary (empty outside check_vma)."""
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:  # jax >= 0.10
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", frozenset()))  # jax 0.7 - 0.9


def with_varying_axes(aval, axes: frozenset):
    """`aval` with its varying axes replaced by `axes`."""
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:
        if mat.empty and not axes:
            return aval
        return aval.update(manual_axis_type=mat.update(varying=frozenset(axes)))
    if hasattr(aval, "vma"):
        return aval.update(vma=frozenset(axes))
    return aval


def unreduced_axes(aval) -> frozenset:
    """Mesh axes over which `aval` is unreduced or reduced (jax >= 0.10's
    manual axis types beyond varying); empty where jax has no such types."""
    mat = getattr(aval, "manual_axis_type", None)
    if mat is None:
        return frozenset()
    return frozenset(getattr(mat, "unreduced", ())) | frozenset(getattr(mat, "reduced", ()))


def check_vma_enabled() -> bool:
    """Whether the enclosing shard_map tracks varying axes (check_vma=True)."""
    from jax._src import config

    flag = getattr(config, "_check_vma", None)
    return bool(flag.value) if flag is not None else False


def pcast_to_varying(x, axes: tuple):
    """Marks an invariant value as varying over `axes` (psum does the same)."""
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, axes, to="varying")
    return jax.lax.pvary(x, axes)


def distributed_client():
    """The jax.distributed key-value client, or None in a single process."""
    from jax._src import distributed

    return distributed.global_state.client


def requires_devices_during_lowering(primitive) -> None:
    """Tells jit that lowering `primitive` needs the device assignment (its
    lowering emits a custom_partitioning call, which reads it)."""
    from jax._src import dispatch

    dispatch.prim_requires_devices_during_lowering.add(primitive)


def without_vma_checks():
    """A context in which jax.lax collectives skip the varying-axes checks.
    For collectives over vmap axes only: vmap batches them into local
    reductions, which leave the varying mesh axes as they are, while
    jax.lax.psum's check_vma path (pvary) rejects vmap axis names."""
    from jax._src import config

    flag = getattr(config, "_check_vma", None)
    return flag(False) if flag is not None else contextlib.nullcontext()


def _shard_map_file():
    from jax._src import shard_map

    return shard_map.__file__


def shard_map_mesh():
    """The concrete jax.sharding.Mesh of the innermost jax.shard_map whose
    body is being traced, or None when only its AbstractMesh is known.

    jax traces a shard_map body against the AbstractMesh alone (that is
    what jax.sharding.get_abstract_mesh() returns there); the devices are in
    the shard_map's `mesh` parameter. Where to find it, innermost first:
    the eager shard_map's trace (ShardMapTrace.mesh); the frames of jax's
    shard_map module that trace the body (jit staging, JVP, transpose and
    eager runs take the mesh as their parameter `mesh`, jax 0.10 to 0.12);
    the mesh of jax.set_mesh (for a shard_map given an AbstractMesh). A
    candidate counts only if its axis names and sizes are those of the
    abstract mesh being traced against."""
    from jax._src import core

    abstract = jax.sharding.get_abstract_mesh()
    if abstract is None or getattr(abstract, "empty", True):
        return None
    want = (tuple(abstract.axis_names), tuple(abstract.axis_sizes))

    def fits(mesh):
        return (isinstance(mesh, jax.sharding.Mesh) and not mesh.empty and
                (tuple(mesh.axis_names), tuple(mesh.devices.shape)) == want)

    trace = getattr(getattr(core, "trace_ctx", None), "trace", None)
    if fits(getattr(trace, "mesh", None)):
        return trace.mesh
    source = _shard_map_file()
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename == source:
            local = frame.f_locals
            for mesh in (local.get("mesh"), getattr(local.get("self"), "mesh", None)):
                if fits(mesh):
                    return mesh
        frame = frame.f_back
    from jax._src import mesh as mesh_lib

    concrete = mesh_lib.get_concrete_mesh()
    return concrete if fits(concrete) else None


def lowering_mesh(ctx):
    """The concrete Mesh of the shard_map a lowering rule runs in (from the
    lowering context's SPMDAxisContext), or None (an AbstractMesh there, or
    no shard_map)."""
    from jax._src import sharding_impls

    axis_context = ctx.module_context.axis_context
    if isinstance(axis_context, sharding_impls.SPMDAxisContext):
        mesh = axis_context.mesh
        if isinstance(mesh, jax.sharding.Mesh) and not mesh.empty:
            return mesh
    return None


@contextlib.contextmanager
def partitioning_mesh(ctx):
    """Lowers the custom_partitioning calls of a lowering rule (context
    `ctx`) with a mesh where jit's shardings name none, and says whether
    they have one.

    custom_partitioning takes its rules' mesh from jit's abstract mesh (an
    operand or result with a NamedSharding), else from the legacy `with
    mesh:`; jax.set_mesh gives neither. So jit of arrays that carry no mesh
    (numpy operands, a bare PartitionSpec constraint, jax.sharding.reshard of
    an unplaced array) hands the rules an empty Mesh and GSPMD shardings,
    which name no axis. There the mesh of jax.set_mesh stands in, as `with
    mesh:` would, when its devices are the lowering's in the same order.
    Yields False only where the partitioner runs over several devices with
    no mesh at all."""
    from jax._src import mesh as mesh_lib
    from jax._src import sharding_impls

    axis_context = ctx.module_context.axis_context
    env = mesh_lib.thread_resources.env
    devices = (axis_context.device_assignment
               if isinstance(axis_context, sharding_impls.ShardingContext) else None)
    if (not devices or len(devices) == 1 or axis_context.abstract_mesh is not None
            or not env.physical_mesh.empty):
        yield True
        return
    mesh = mesh_lib.get_concrete_mesh()
    if (not isinstance(mesh, jax.sharding.Mesh) or mesh.empty
            or tuple(mesh.devices.flat) != tuple(devices)):
        yield False
        return
    mesh_lib.thread_resources.env = env.with_mesh(mesh)
    try:
        yield True
    finally:
        mesh_lib.thread_resources.env = env


def shaped_array(shape: tuple, dtype):
    """An abstract value of this shape and dtype (no sharding, no varying
    axes), for primitives whose result is not shaped like an operand."""
    core = getattr(jax.core, "ShapedArray", None)
    if core is None:  # moved out of the public namespace
        from jax._src.core import ShapedArray as core
    return core(tuple(shape), dtype)


def has_explicit_sharding(aval) -> bool:
    """Whether `aval` carries its sharding in its type (a mesh with Explicit
    axes, jax's default for jax.make_mesh); Auto axes leave it to XLA."""
    sharding = getattr(aval, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or getattr(mesh, "empty", True):
        return False
    explicit = getattr(jax.sharding.AxisType, "Explicit", None)
    return any(t == explicit for t in getattr(mesh, "axis_types", ()))
