"""What every collective asks about its axis before it binds a primitive:
that the axis is a manual axis of the enclosing shard_map, which
communicator serves it, and how a value is made varying over it."""
from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from .. import _compat
from ..comm.communicator import Communicator, find_communicator
from ..errors import JaxArError

__all__ = ["REDUCE_DTYPES", "as_varying", "check_axes", "check_dtype", "communicator_for"]

# The element types the reductions (all_reduce, reduce_scatter) carry.
REDUCE_DTYPES = tuple(np.dtype(t) for t in (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32))

def check_axes(axis_name, what: str) -> tuple:
    """`axis_name` as a tuple of manual axes of the enclosing shard_map."""
    axes = (axis_name,) if isinstance(axis_name, str) else axis_name
    if not isinstance(axes, tuple) or not axes or not all(isinstance(a, str) for a in axes):
        raise TypeError(f"{what}: axis_name must be a mesh axis name (str), got "
                        f"{axis_name!r}")
    mesh = jax.sharding.get_abstract_mesh()
    manual = set(getattr(mesh, "manual_axes", ()))
    for a in axes:
        if a not in manual:
            where = ("outside jax.shard_map" if not manual else
                     f"over axis {a!r}, which is not a manual axis of the enclosing "
                     f"shard_map (its axes: {sorted(manual)})")
            raise ValueError(f"{what} called {where}; call it inside "
                             f"jax.shard_map over a mesh with axis {a!r}")
    return axes


def check_dtype(what: str, leaf, supported) -> None:
    dtype = getattr(leaf, "dtype", None)
    if dtype is None or np.dtype(dtype) not in supported:
        raise TypeError(f"{what}: unsupported dtype {dtype} (supported: "
                        f"{', '.join(str(d) for d in supported)})")


def communicator_for(axis: str, what: str) -> Communicator:
    """The communicator set up for `axis` of the enclosing shard_map's mesh.
    Raises JaxArError where it was closed or has failed: tracing a call
    that could only fail at run time fails now, with jax_ar's own type."""
    mesh = jax.sharding.get_abstract_mesh()
    comm = find_communicator(axis, mesh.axis_names, mesh.axis_sizes)
    if comm is None:
        closed = find_communicator(axis, mesh.axis_names, mesh.axis_sizes, closed=True)
        if closed is not None:
            raise JaxArError(f"{what} over axis {axis!r}: its communicator was closed; "
                             f"call jax_ar.setup(mesh, {axis!r}) again before tracing")
        raise ValueError(f"{what}: no communicator for axis {axis!r}; call "
                         f"jax_ar.setup(mesh, {axis!r}) before tracing")
    comm.check()  # a communicator that failed stays failed until close() and setup()
    return comm


def as_varying(x, axes):
    """`x`, marked varying over those of `axes` it does not vary over yet."""
    missing = tuple(a for a in axes if a not in _compat.varying_axes(jax.typeof(x)))
    return _compat.pcast_to_varying(x, missing) if missing else x
