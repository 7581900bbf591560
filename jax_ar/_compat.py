"""Every use of JAX internals in jax_ar, in one place.

jax_ar supports jax 0.10.x and 0.11.x. Public APIs are used wherever they
exist; what they do not offer (rewriting the varying-axes part of an abstract
value, reading whether check_vma is on, the jax.distributed client) is
reached here and nowhere else, with the alternatives older releases spell
differently.
"""
from __future__ import annotations

import jax

__all__ = [
    "check_vma_enabled",
    "distributed_client",
    "has_explicit_sharding",
    "pcast_to_varying",
    "requires_devices_during_lowering",
    "shaped_array",
    "varying_axes",
    "with_varying_axes",
]


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
