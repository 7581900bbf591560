"""Every use of JAX internals in jax_ar, in one place.

jax_ar supports jax 0.10 to 0.12 (CI: 0.10.x on Python 3.11, the newest,
0.12.x, on Python 3.12). Public APIs are used wherever they
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
    "pcast_to_varying",
    "requires_devices_during_lowering",
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
