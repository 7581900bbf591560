"""Keeps jax_ar's calls in program order on CPU devices.

XLA:CPU runs a compiled program as a dataflow graph whose edges come from
buffer uses only (xla/backends/cpu/runtime/thunk_executor.cc; custom calls
declare no other resource). Programs with more than 8 operations and any
buffer over 512 bytes run concurrently: two jax_ar calls that share no data
may start in either order, and processes do pick different orders. Peers
then meet in different calls: an error when the calls differ in shape, and
swapped results when they do not. (GPUs run one stream in the compiled
order, so only CPU lowerings need this.)

Within one block of the lowered program (a shard_map body, a function body,
a loop body) each jax_ar call therefore takes its operands through
`jax_ar_order`, a custom call that hands them on unchanged (aliased: no copy
where XLA can avoid one) and also reads the previous jax_ar call's first
result, so it cannot start before that call has finished. Calls in
different blocks that share no data (two independent loops, a nested
function) are not ordered by this; docs/multi_axis.md says so.

XLA's own collectives (psum) are ordered among themselves but not with
jax_ar's calls. A jax.lax collective that serves a jax_ar call (the psum
fallback, forms the kernels do not take) therefore joins the chain: its
operands pass through `enter_chain`, its results through `leave_chain`
(`in_chain(fn, *args)` does both). Without this, one device of a process
can block in a jax_ar call waiting for a sibling device that is inside the
psum, which waits for the first: with as many XLA:CPU worker threads as
cores, both threads are taken and neither call ends. Compositions of both
(multi_axis.py) order their steps explicitly with `after(values, link)`.
A jax.lax collective the user writes next to jax_ar's calls, sharing no
data with them, is not ordered (docs/multi_axis.md).
"""
from __future__ import annotations

import threading

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.interpreters.mlir import ir

from .. import _native

__all__ = ["after", "ffi_call_in_order", "in_chain", "on_cpu"]

# {thread id: (module being lowered, {block: (value, aval)})}. Not a
# threading.local: XLA lowers custom_partitioning bodies on its own threads,
# whose Python state it clears when the callback returns, and MLIR objects
# freed during that clean-up crash the process. Each thread keeps its last
# module alive until it lowers another.
_lowering_state: dict = {}
_lowering_lock = threading.Lock()


def _links(ctx) -> dict:
    """{block: (value, aval)} of the module being lowered (reset per module)."""
    module = ctx.module_context.module
    thread = threading.get_ident()
    with _lowering_lock:
        state = _lowering_state.get(thread)
        if state is None or state[0] is not module:
            state = _lowering_state[thread] = (module, {})
    return state[1]


def on_cpu(ctx) -> bool:
    return tuple(ctx.module_context.platforms) == ("cpu",)


def ffi_call_in_order(ctx, target, operands, aliases=None, **attributes):
    """The lowering of a jax_ar custom call `target`: on CPU, chained after
    the previous jax_ar call of the current block (see above). `aliases`
    ({operand: result}) lets results reuse their operands' buffers."""
    rule = jax.ffi.ffi_lowering(target, operand_output_aliases=aliases or None)
    outs = rule(ctx, *after_previous_call(ctx, operands), **attributes)
    record_call(ctx, outs[0])
    return outs


def after_previous_call(ctx, operands):
    """`operands` (whose avals are ctx.avals_in), made to wait for the previous
    jax_ar call of the current block."""
    if not on_cpu(ctx):
        return list(operands)
    previous = _links(ctx).get(ir.InsertionPoint.current.block)
    if previous is None:
        return list(operands)
    link, link_aval = previous
    avals = list(ctx.avals_in)
    rule = _order_rule(len(operands))
    return list(rule(ctx.replace(avals_in=avals + [link_aval], avals_out=avals),
                     *operands, link))


def _order_rule(count: int):
    """The lowering of `jax_ar_order` over `count` values (and a link). The
    CPU module's targets are registered first: a program may order calls
    that no communicator serves (matmul_all_reduce's psum fallback before
    any jax_ar.setup), and XLA must know the target when it compiles."""
    _native.targets("cpu")
    return jax.ffi.ffi_lowering(
        "jax_ar_order", operand_output_aliases={i: i for i in range(count)})


def record_call(ctx, result) -> None:
    """Marks `result` (ctx.avals_out[0]) as the link the next jax_ar call of
    this block waits for."""
    if on_cpu(ctx):
        _links(ctx)[ir.InsertionPoint.current.block] = (result, ctx.avals_out[0])


# after(*values, link): `values`, unchanged, once `link` has been computed.
after_p = Primitive("jax_ar_after")
after_p.multiple_results = True
after_p.def_abstract_eval(lambda *avals: list(avals[:-1]))
after_p.def_impl(lambda *args: list(args[:-1]))


def _after_lowering(ctx, *args):
    *values, link = args
    if not on_cpu(ctx):
        return values  # one stream keeps the compiled order
    return _order_rule(len(values))(ctx, *values, link)


mlir.register_lowering(after_p, _after_lowering, cacheable=False)


def _after_jvp(primals, tangents):
    *values, link = primals
    tangents = [ad.instantiate_zeros(t) for t in tangents[:-1]]
    return after_p.bind(*values, link), after_p.bind(*tangents, link)


ad.primitive_jvps[after_p] = _after_jvp


def _after_transpose(cts, *args):
    link = args[-1]
    link_ct = ad.Zero(link.aval) if ad.is_undefined_primal(link) else None
    return [ad.instantiate_zeros(ct) for ct in cts] + [link_ct]


ad.primitive_transposes[after_p] = _after_transpose


def _after_batch(args, dims):
    return after_p.bind(*args), list(dims[:-1])


batching.primitive_batchers[after_p] = _after_batch


def after(values, link):
    """`values` (a list of arrays), unchanged, computed no earlier than `link`
    on CPU devices (no-op elsewhere)."""
    if not values:
        return []
    return list(after_p.bind(*values, link))


def _identity_primitive(name: str, lowering) -> Primitive:
    """A primitive that hands its operands on unchanged, lowered by
    `lowering(ctx, *args)`; linear, so derivatives and vmap pass through."""
    primitive = Primitive(name)
    primitive.multiple_results = True
    primitive.def_abstract_eval(lambda *avals: list(avals))
    primitive.def_impl(lambda *args: list(args))
    mlir.register_lowering(primitive, lowering, cacheable=False)
    ad.deflinear2(primitive, lambda cts, *args: [ad.instantiate_zeros(ct) for ct in cts])
    batching.primitive_batchers[primitive] = lambda args, dims: (primitive.bind(*args),
                                                                 list(dims))
    return primitive


def _enter_lowering(ctx, *args):
    return after_previous_call(ctx, args)


def _leave_lowering(ctx, *args):
    record_call(ctx, args[0])
    return list(args)


enter_chain_p = _identity_primitive("jax_ar_enter_chain", _enter_lowering)
leave_chain_p = _identity_primitive("jax_ar_leave_chain", _leave_lowering)


def _through(primitive, tree):
    """`tree` with its arrays (tracers too) passed through `primitive`."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]
    if where:
        for i, value in zip(where, primitive.bind(*[leaves[i] for i in where])):
            leaves[i] = value
    return jax.tree_util.tree_unflatten(treedef, leaves)


def in_chain(fn, *args, **kwargs):
    """fn(*args, **kwargs) (a jax.lax collective serving a jax_ar call),
    started after the previous jax_ar call of its block and finished before
    the next one, on CPU devices; the arrays among `args` (any pytree) are
    its inputs, the arrays of its result its outputs."""
    return _through(leave_chain_p, fn(*_through(enter_chain_p, args), **kwargs))
