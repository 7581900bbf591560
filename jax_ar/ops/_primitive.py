"""The skeleton every collective primitive shares: a primitive that only
exists inside shard_map, lowered in place to one FFI custom call of a
communicator (the one that holds the devices it is lowered for), and the
one way a step of a plan runs a jax.lax collective (`call_lax`,
`over_vmap_axes`)."""
from __future__ import annotations

import jax
from jax.extend.core import Primitive
from jax.interpreters import mlir

from .. import _compat
from . import _call_order
from ._axes import lowered_comm_id

__all__ = ["call_lax", "collective_primitive", "over_vmap_axes"]


def collective_primitive(target: str, public_name: str, abstract_eval, ffi_attributes, *,
                         axis_of, multiple_results: bool = False,
                         aliases_of=None) -> Primitive:
    """A primitive that binds FFI target `target`. `ffi_attributes(**params)`
    gives the custom call's attributes (numpy scalars) from the params;
    `axis_of(params)` the mesh axis the call runs over (its communicator is
    checked against the devices of that axis when lowering);
    `aliases_of(ctx, **params)` the {operand: result} pairs whose buffers the
    result may reuse (None: none). Outside shard_map there is no axis to
    reduce over, so evaluating it eagerly is an error naming `public_name`."""
    primitive = Primitive(target)
    primitive.multiple_results = multiple_results
    primitive.def_abstract_eval(abstract_eval)

    def impl(*args, **params):
        raise ValueError(f"jax_ar.{public_name} must be called inside jax.shard_map")

    def lowering(ctx, *args, **params):
        params = dict(params, comm_id=lowered_comm_id(
            ctx, axis_of(params), params["comm_id"], f"jax_ar.{public_name}"))
        aliases = aliases_of(ctx, **params) if aliases_of is not None else None
        return _call_order.ffi_call_in_order(  # CPU: keeps calls in program order
            ctx, target, args, aliases=aliases, **ffi_attributes(**params))

    primitive.def_impl(impl)
    # Not cacheable: each call must be lowered in place to be chained
    # (_call_order.py) and checked against the devices it runs on.
    mlir.register_lowering(primitive, lowering, cacheable=False)
    return primitive


def call_lax(what: str, lax_name: str, fn, *args, **kwargs):
    """fn(*args, **kwargs), a jax.lax collective serving a call of `what`;
    its errors name `what` too (the user called jax_ar, not jax.lax). On
    CPU it keeps its place among jax_ar's calls (_call_order.in_chain)."""
    try:
        return _call_order.in_chain(fn, *args, **kwargs)
    except (TypeError, ValueError, NameError, NotImplementedError) as e:
        try:
            named = type(e)(f"{what} (served by {lax_name}): {e}")
        except Exception:  # an exception type with another constructor: keep it as it is
            raise e from None
        raise named from e
    except AssertionError as e:  # jax.lax's own check failed: not a user-facing message
        raise NotImplementedError(
            f"{what}: {lax_name}, which serves this form of the call, fails on it inside this "
            f"shard_map ({type(e).__name__}: {e})") from e


def over_vmap_axes(what, lax_name, fn, values, *args):
    """fn(values, *args): jax.lax collectives over vmap axes only, which
    vmap turns into local arithmetic. They run without the varying-axes
    checks (jax.lax's own check_vma path rejects vmap axis names, and
    without it jax.lax's results lose their varying mesh axes): each result
    is given back the mesh axes its input varies over, which local
    arithmetic does not change."""
    varying = [_compat.varying_axes(jax.typeof(v)) for v in jax.tree_util.tree_leaves(values)]
    with _compat.without_vma_checks():
        out = call_lax(what, lax_name, fn, values, *args)
    leaves, treedef = jax.tree_util.tree_flatten(out)
    restored = []
    for leaf, axes in zip(leaves, varying):
        missing = tuple(sorted(axes - _compat.varying_axes(jax.typeof(leaf)), key=str))
        restored.append(_compat.pcast_to_varying(leaf, missing) if missing else leaf)
    return jax.tree_util.tree_unflatten(treedef, restored)
