"""The skeleton every collective primitive shares: a primitive that only
exists inside shard_map, lowered in place to one FFI custom call of a
communicator, and the one way its psum fallback is logged."""
from __future__ import annotations

from jax.extend.core import Primitive
from jax.interpreters import mlir

from .. import config
from . import _call_order

__all__ = ["collective_primitive", "fallback_reason", "log_fallback"]


def collective_primitive(target: str, public_name: str, abstract_eval, ffi_attributes, *,
                         multiple_results: bool = False) -> Primitive:
    """A primitive that binds FFI target `target`. `ffi_attributes(**params)`
    gives the custom call's attributes (numpy scalars) from the params.
    Outside shard_map there is no axis to reduce over, so evaluating it
    eagerly is an error naming `public_name`."""
    primitive = Primitive(target)
    primitive.multiple_results = multiple_results
    primitive.def_abstract_eval(abstract_eval)

    def impl(*args, **params):
        raise ValueError(f"jax_ar.{public_name} must be called inside jax.shard_map")

    def lowering(ctx, *args, **params):
        return _call_order.ffi_call_in_order(  # CPU: keeps calls in program order
            ctx, target, args, **ffi_attributes(**params))

    primitive.def_impl(impl)
    # Not cacheable: each call must be lowered in place to be chained (_call_order.py).
    mlir.register_lowering(primitive, lowering, cacheable=False)
    return primitive


def fallback_reason(comm) -> str | None:
    """Why `comm` cannot run jax_ar's kernels (closed, or its setup chose the
    psum fallback), or None when it can."""
    if comm.closed:
        return "closed"
    return comm.fallback_reason


def log_fallback(comm, what: str, axis, lax_name: str, reason: str) -> None:
    """Logs once per communicator and operation that `what` lowers to the
    lax collective `lax_name`, and why."""
    config.log_once(("fallback", comm.comm_id, what, reason),
                    f"jax_ar: {what} over {axis!r} lowers to {lax_name}: {reason}")
