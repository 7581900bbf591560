"""How a call goes: one frozen plan per call, decided here and nowhere else.

A public function (_collectives.py, _norms.py, _linear.py) checks its
arguments, asks this module for the plan of the call, and hands the plan to
the op family that carries it out (all_reduce.run_all_reduce, the leaf steps
of scatter_gather.py and multi_axis.py, all_reduce_rms_norm.run_norm). A
plan is built from static facts only (axes, shapes and dtypes, the
communicator, the cost table), so every rank builds the same one. Each leaf
of a call has one step:

  lax         jax.lax's collective serves it; `reason` says why
  constant    nothing is exchanged: a value that is not traced, an empty array
  local       only vmap and size-1 axes: jax.lax's local arithmetic
  kernel      one call of jax_ar's `kernel` over one mesh axis: "oneshot",
              "twoshot" (the plain two-shot) or, on CUDA, "twoshot_ll" (the
              two-shot over LL packets); the handler runs exactly that kernel
  multi_axis  several mesh axes: jax_ar inside a host and XLA's collectives
              across hosts, composed as `composition` says

A step that is not a kernel carries its Reason, which the plan reports
through the one logger (config.report): once per reason and call site, a
WARNING with what to do where the user loses speed, DEBUG where nothing is
exchanged (a size-1 axis, constants, an explicit "psum")."""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

import jax
import jax.numpy as jnp

from .. import selection
from ..config import Reason, report
from ._axes import (GATHER_DTYPES, REDUCE_DTYPES, Axes, communicator_for, inner_axis, lookup,
                    no_communicator_for_any, no_communicator_message, trivial_index_groups,
                    unknown_devices_reason)
from .rms_norm import fused_refuses, module_serves, pair_refuses

__all__ = ["COMM_TODO", "CONSTANT", "KERNEL", "LAX", "LAX_NAMES", "LOCAL", "MULTI_AXIS",
           "NormPlan", "Plan", "Step", "as_array", "not_serving", "operand_dtype",
           "plan_all_reduce", "plan_leaf", "plan_norm", "plan_one_axis"]

LAX, CONSTANT, LOCAL, KERNEL, MULTI_AXIS = "lax", "constant", "local", "kernel", "multi_axis"
# Where each axis of a reduce_scatter / all_gather over several axes runs.
VMAP, SINGLE, JAX_AR, XLA = "vmap", "single", "jax_ar", "xla"
LAX_NAMES = {"sum": "jax.lax.psum", "avg": "jax.lax.pmean", "max": "jax.lax.pmax",
             "min": "jax.lax.pmin"}


@dataclasses.dataclass(frozen=True)
class Step:
    """How some leaves of a call are served (the module's docstring):
    leaves: their indices in the call. op: what the step reduces with (a
    sum where an average is divided afterwards by `divide`). axes: what it
    exchanges over (multi_axis: the inner axis first). comm: the kernel's
    communicator (multi_axis: the inner axis's). kernel: the kernel that
    runs (multi_axis: the inner all-reduce's, "psum" for XLA's).
    composition: multi_axis all_reduce, "allreduce_psum" or
    "scatter_psum_gather". where: multi_axis reduce_scatter / all_gather,
    ((axis, VMAP | SINGLE | JAX_AR | XLA, communicator or None), ...).
    reason: why jax.lax serves (lax), or why nothing is exchanged."""
    kind: str
    leaves: tuple = ()
    op: str = "sum"
    axes: tuple = ()
    comm: object = None
    kernel: str = ""
    composition: str = ""
    where: tuple = ()
    reason: Reason | None = None
    divide: int = 1


@dataclasses.dataclass(frozen=True)
class Plan:
    """An all-reduce's steps, in the order they run. Leaves in `arrays`
    first go through `local`, ((VMAP | SINGLE, axes, op), ...), jax.lax's
    local arithmetic over vmap and size-1 axes; an average over vmap and
    mesh axes is a sum divided once at the end by `divide`. lax_only: the
    call is a form only jax.lax takes (positional axes, `groups`, its
    axis_index_groups): one lax step takes the leaves as given."""
    what: str
    op: str
    axes: tuple
    steps: tuple
    arrays: tuple = ()
    local: tuple = ()
    divide: int = 1
    lax_only: bool = False
    groups: object = None
    positional: bool = False


@dataclasses.dataclass(frozen=True)
class NormPlan:
    """How an all_reduce_rms_norm goes. path "fused": the fused kernel with
    `kernel` ("oneshot" | "twoshot") of `comm`; "pair": `reduce` of x, then
    rms_norm's kernel; "composed": `reduce` of float32 x (None: no axis),
    then the norms in jnp (the plan reported why not fused)."""
    path: str
    kernel: str = ""
    comm: object = None
    reduce: Plan | None = None


_SERVED_BY = {CONSTANT: "a constant", LOCAL: "jax.lax's local arithmetic"}


def _report_steps(plan: Plan) -> Plan:
    """Reports each step's reason through the one logger (config.report)."""
    for step in plan.steps:
        if step.reason is not None:
            served_by = LAX_NAMES[step.op] if step.kind == LAX else _SERVED_BY[step.kind]
            report(plan.what, step.axes, served_by, step.reason)
    return plan


# ----------------------------------------------------------------------------
# all_reduce

def plan_all_reduce(what, kinds: Axes, leaves, op, algorithm, axis_index_groups=None) -> Plan:
    """The plan of an all-reduce of `leaves` (arrays, scalars, or
    jax.ShapeDtypeStruct for values not computed yet) over `kinds` with `op`
    and `algorithm` ("auto" already replaced by JAX_AR_ALGO where set)."""
    names = kinds.names
    reason = _lax_only(kinds, axis_index_groups, what)
    if reason is not None:
        step = Step(LAX, tuple(range(len(leaves))), op, names, reason=reason)
        return _report_steps(Plan(what, op, names, (step,), lax_only=True,
                                  groups=axis_index_groups, positional=bool(kinds.positional)))
    steps, arrays = [], []
    for i, leaf in enumerate(leaves):
        if not _traced(leaf):
            _check_array_like(leaf, what)
            if op in ("sum", "avg"):  # jax.lax's constant rule: x times the axes' size
                steps.append(Step(CONSTANT, (i,), op, names, reason=_NOT_TRACED))
                continue
        dtype = operand_dtype(leaf, op)
        if op in ("max", "min") and jnp.issubdtype(dtype, jnp.complexfloating):
            raise TypeError(f"{what}: op={op!r} of {dtype}: complex numbers have no order "
                            f"(jax.lax.p{op} traces it, then XLA fails to compile it)")
        if dtype not in REDUCE_DTYPES:
            steps.append(Step(LAX, (i,), op, names, reason=_dtype_reason(dtype, REDUCE_DTYPES)))
        else:
            arrays.append(i)
    if not arrays:
        return _report_steps(Plan(what, op, names, tuple(steps)))
    if not kinds.mesh:  # nothing leaves the device
        local = ((SINGLE, kinds.single, op),) * bool(kinds.single) + \
                ((VMAP, kinds.vmap, op),) * bool(kinds.vmap)
        step = Step(LOCAL, tuple(arrays), op, names, reason=_LOCAL)
        return _report_steps(Plan(what, op, names, (*steps, step), tuple(arrays), local))
    # An average over vmap axes too is a sum over all, divided once at the
    # end; size-1 axes change no value, so their op stays as it is.
    inner_op = "sum" if op == "avg" else op
    mesh_op = inner_op if kinds.vmap else op
    local = ((VMAP, kinds.vmap, inner_op),) * bool(kinds.vmap) + \
            ((SINGLE, kinds.single, inner_op),) * bool(kinds.single)
    specs = {i: (np.shape(leaves[i]), operand_dtype(leaves[i], op)) for i in arrays}
    if len(kinds.mesh) > 1:
        steps += _plan_multi_axis(what, kinds.mesh, specs, mesh_op, algorithm)
    else:
        axis = kinds.mesh[0]
        comm = communicator_for(axis, what)
        steps += _one_axis_steps(axis, comm, specs, mesh_op, algorithm,
                                 None if comm else _unknown_devices(axis))
    divide = kinds.size if op == "avg" and kinds.vmap else 1
    return _report_steps(Plan(what, op, names, tuple(steps), tuple(arrays), local, divide))


def plan_one_axis(what, axis, comm, leaves, op, algorithm, unserved: Reason | None = None) -> Plan:
    """The plan of an all-reduce of `leaves` (arrays or ShapeDtypeStructs)
    over one mesh axis served by `comm`; jax.lax's where `unserved` says
    why not (or `comm` cannot serve)."""
    specs = {i: (np.shape(v), np.dtype(v.dtype)) for i, v in enumerate(leaves)}
    steps = _one_axis_steps(axis, comm, specs, op, algorithm, unserved)
    return _report_steps(Plan(what, op, (axis,), tuple(steps), tuple(specs)))


def _one_axis_steps(axis, comm, specs, op, algorithm, unserved) -> list:
    # An empty array is a constant whatever serves the rest: nothing is
    # exchanged (and XLA:CPU's compiler crashes on a psum of one, jax 0.11.2).
    empty = tuple(i for i in specs if _nbytes(specs[i]) == 0)
    steps = [Step(CONSTANT, empty, op, (axis,), reason=_EMPTY)] if empty else []
    rest = tuple(i for i in specs if i not in empty)
    if not rest:
        return steps
    reason = unserved or _not_serving_reason(comm)
    if algorithm == "psum":
        return steps + [Step(LAX, rest, op, (axis,), reason=_PSUM_ASKED)]
    if reason:
        return steps + [Step(LAX, rest, op, (axis,), reason=reason)]
    # Integer averages follow pmean: the kernels sum, then true division
    # (float32). Leaves that need another kernel op go in separate calls.
    kernel_op = {i: "sum" if op == "avg" and specs[i][1] == np.int32 else op for i in rest}
    for each_op in dict.fromkeys(kernel_op.values()):
        mine = [i for i in rest if kernel_op[i] == each_op]
        divide = comm.world_size if each_op != op else 1
        for group in _pack(mine, specs, comm.capacity_bytes("twoshot")):
            kernel = selection.choose_kernel(comm, algorithm, sum(_padded(specs[i]) for i in group))
            if kernel == "psum":
                steps.append(Step(LAX, group, op, (axis,), reason=_PSUM_CHOSEN))
            else:
                steps.append(Step(KERNEL, group, each_op, (axis,), comm, kernel, divide=divide))
    return steps


def _plan_multi_axis(what, axes, specs, op, algorithm) -> list:
    """jax_ar over the inner axis (the largest group jax_ar serves), XLA's
    collectives over the others; leaves of one dtype travel as one flat
    message. docs/multi_axis.md."""
    # An empty array is a constant whatever serves the rest (_one_axis_steps).
    empty = tuple(i for i, s in specs.items() if _nbytes(s) == 0)
    rest = tuple(i for i in specs if i not in empty)
    constant = [Step(CONSTANT, empty, op, axes, reason=_EMPTY)] if empty else []
    if not rest:
        return constant
    inner, comm, why_not = inner_axis(axes, what)
    if comm is None:
        reason = _unknown_devices(axes) if why_not is None else Reason(why_not, COMM_TODO)
        return constant + [Step(LAX, rest, op, axes, reason=reason)]
    if algorithm == "psum":
        return constant + [Step(LAX, rest, op, axes, reason=_PSUM_ASKED)]
    outer = tuple(a for a in axes if a != inner)
    mesh = jax.sharding.get_abstract_mesh()
    hosts = int(np.prod([mesh.shape[a] for a in outer]))
    total = int(np.prod([mesh.shape[a] for a in axes]))
    nbytes = sum(_nbytes(s) for s in specs.values())
    if algorithm == "oneshot":
        composition, inner_algorithm = "allreduce_psum", "oneshot"
    elif algorithm == "twoshot":
        composition, inner_algorithm = "scatter_psum_gather", None
    else:
        inner_algorithm = "auto"
        composition = selection.choose_composition(comm, hosts, nbytes, axes)
    # Averages are sums divided once at the end, so both compositions round alike.
    kernel_op = "sum" if op == "avg" else op
    divide = total if op == "avg" else 1
    axes = (inner,) + outer
    steps, by_dtype = constant, {}
    for i in rest:
        by_dtype.setdefault(specs[i][1], []).append(i)
    for members in by_dtype.values():
        flat = ((sum(_nbytes(specs[i]) for i in members),), np.uint8)  # one message
        kernel = (selection.choose_kernel(comm, inner_algorithm, _padded(flat))
                  if inner_algorithm else "")
        steps.append(Step(MULTI_AXIS, tuple(members), kernel_op, axes, comm, kernel,
                          composition, divide=divide))
    return steps


# ----------------------------------------------------------------------------
# reduce_scatter and all_gather: one step per leaf.

def plan_leaf(what, kinds: Axes, leaf, axis_index_groups=None, *, gather: bool,
              to: str = "varying") -> Step:
    """How a reduce_scatter (gather=False) or all_gather of one leaf goes:
    lax, kernel (one mesh axis) or multi_axis (`where` places each axis)."""
    names = kinds.names
    supported = GATHER_DTYPES if gather else REDUCE_DTYPES
    reason = _lax_only(kinds, axis_index_groups, what)
    if reason is None and gather and to == "reduced":
        reason = Reason('to="reduced" (jax_ar serves "varying" and "invarying")',
                        'pass to="varying" and reduce the result yourself')
    dtype = np.dtype(leaf.dtype)
    if reason is None and not gather and dtype == np.bool_:  # jax.lax fails to lower it
        raise TypeError(f"{what}: cannot sum bool (neither can jax.lax.psum_scatter, whose "
                        "lowering rejects it); cast the operand to int32 first")
    if reason is None and dtype not in supported:
        reason = _dtype_reason(dtype, supported)
    step = None
    if reason is None and len(names) == 1 and kinds.mesh:
        comm = communicator_for(kinds.mesh[0], what)
        reason = _not_serving_reason(comm) if comm else _unknown_devices(names[0])
        step = Step(KERNEL, axes=names, comm=comm)
    elif reason is None:
        where = _placements(kinds, what)
        reason = None if where is not None else _unknown_devices(kinds.mesh)
        step = Step(MULTI_AXIS, axes=names, where=where or ())
    if reason is None:
        return step
    report(what, names, "jax.lax.all_gather" if gather else "jax.lax.psum_scatter", reason)
    return Step(LAX, axes=names, reason=reason)


def _placements(kinds: Axes, what):
    """((axis, VMAP | SINGLE | JAX_AR | XLA, communicator or None), ...) for
    every axis of the call, or None when the devices are unknown while
    tracing. ValueError when no mesh axis has a communicator."""
    where = {a: (VMAP, None) for a in kinds.vmap}
    where.update({a: (SINGLE, None) for a in kinds.single})
    if kinds.mesh:
        lookups = [lookup(a) for a in kinds.mesh]
        if any(f.groups is None for f in lookups):
            return None
        if all(f.comm is None for f in lookups):
            if len(lookups) == 1:
                raise ValueError(no_communicator_message(what, lookups[0].axis, lookups[0].groups))
            raise ValueError(no_communicator_for_any(what, lookups))
        for f in lookups:  # axes without one are XLA's (across hosts)
            reason = _not_serving_reason(f.comm)
            if reason:
                report(what, (f.axis,), "XLA's collective", reason)
            where[f.axis] = (JAX_AR, f.comm) if f.comm is not None and not reason else (XLA, None)
    return tuple((a, *where[a]) for a in kinds.names)


# ----------------------------------------------------------------------------
# all_reduce_rms_norm

def plan_norm(what, kinds: Axes, x, residual, extras: bool, quantize: bool, algorithm) -> NormPlan:
    """How all_reduce_rms_norm of checked operands goes (extras: post_gamma
    or bias given): fused where one mesh axis is served and the kernel takes
    the rows (with "auto": where the table predicts it fastest), else an
    all-reduce and the norm apart."""
    names = kinds.names
    f32 = jax.ShapeDtypeStruct(np.shape(x), jnp.float32) if _traced(x) else x
    if not names:
        return NormPlan("composed")  # a sum over no axis
    if len(names) > 1 or not kinds.mesh:
        return NormPlan("composed", reduce=plan_all_reduce(what, kinds, [f32], "sum", algorithm))
    axis = names[0]
    comm = communicator_for(axis, what)
    general = functools.partial(plan_one_axis, what, axis, comm, [f32], "sum")
    if comm is None:
        return NormPlan("composed", reduce=general(algorithm, _unknown_devices(axis)))
    if algorithm == "psum":
        return NormPlan("composed", reduce=general("psum"))
    unserved = module_serves(comm.platform, "jax_ar_all_reduce_rms_norm")
    if unserved:
        return NormPlan("composed", reduce=general(algorithm, Reason(unserved, _REBUILD)))
    # A fused call carries as many whole rows per round through the
    # workspace as fit (the handlers run several rounds for the rest); a row
    # too long for one round takes the general path, whose all_reduce cuts
    # anywhere.
    reason = fused_refuses(x, residual, comm) if np.size(x) else _NO_ELEMENTS
    if reason is None and algorithm == "auto" and _not_serving_reason(comm) is None:
        pair = pair_refuses(x, residual, extras, quantize, comm) is None
        candidates = ("fused_oneshot", "fused_twoshot") + ("composed",) * pair
        path = selection.choose_norm_path(comm, np.size(x) * np.dtype(x.dtype).itemsize, candidates)
        if path == "composed":
            spec = jax.ShapeDtypeStruct(np.shape(x), x.dtype)
            return NormPlan("pair", reduce=plan_one_axis(what, axis, comm, [spec], "sum", "auto"))
        algorithm = path[len("fused_"):]
    if reason is not None and _not_serving_reason(comm) is None:
        report(what, (axis,), "jax_ar.all_reduce + a separate norm", reason)
    if reason is not None or _not_serving_reason(comm) is not None:
        return NormPlan("composed", reduce=general(algorithm))
    return NormPlan("fused", algorithm, comm)


# ----------------------------------------------------------------------------
# Small facts the plans are made of.

# What to do about a communicator whose setup chose psum (the reason says
# why: the setup's own words).
COMM_TODO = "docs/guarantees.md lists what jax_ar serves"
_REBUILD = "rebuild jax_ar (pip install .) with the module of this platform"
_NOT_TRACED = Reason("a value that is not traced: nothing is exchanged", slower=False)
_EMPTY = Reason("an empty array: nothing is exchanged", slower=False)
_NO_ELEMENTS = Reason("no elements", slower=False)
_LOCAL = Reason("only vmap and size-1 axes: nothing leaves the device", slower=False)
_PSUM_ASKED = Reason("algorithm='psum'", slower=False)
_PSUM_CHOSEN = Reason("the cost table predicts psum fastest", slower=False)


def not_serving(comm) -> str | None:
    """Why `comm` cannot run jax_ar's kernels (closed, or its setup chose
    psum), or None when it can."""
    if comm.closed:
        return "its communicator is closed"
    return comm.fallback_reason


def _not_serving_reason(comm) -> Reason | None:
    why = not_serving(comm) if comm is not None else None
    return Reason(why, COMM_TODO) if why else _automatic_axes()


def _automatic_axes() -> Reason | None:
    """Why no kernel may serve a call inside a shard_map that leaves mesh
    axes of more than one device automatic (axis_names= a subset), or None.
    XLA partitions the body over those axes, and a custom call has no
    sharding rule: XLA would gather its operand over them, run the kernel on
    the gathered array and hand back a result replicated where psum's keeps
    the operand's sharding."""
    mesh = jax.sharding.get_abstract_mesh()
    manual = set(getattr(mesh, "manual_axes", ()))
    automatic = [a for a in mesh.axis_names if a not in manual and mesh.shape[a] > 1]
    if not manual or not automatic:
        return None
    return Reason(f"the enclosing shard_map leaves mesh axes {automatic} automatic, over which "
                  "XLA would gather jax_ar's call", "make them manual too (shard_map's "
                  "axis_names) to use jax_ar's kernels")


def _unknown_devices(axis) -> Reason:
    return Reason(unknown_devices_reason(axis),
                  "trace under jax.set_mesh(mesh) or give shard_map a concrete Mesh")


def _lax_only(kinds: Axes, axis_index_groups, what) -> Reason | None:
    """Why a call can only be jax.lax's (a form jax_ar's kernels do not
    take), or None."""
    if kinds.positional:
        return Reason(f"positional axes {kinds.positional}", "name mesh axes instead")
    if not trivial_index_groups(axis_index_groups, kinds.names, what):
        return Reason("axis_index_groups (groups within the axis)",
                      "give each group a mesh axis of its own")
    return None


def _dtype_reason(dtype, supported) -> Reason:
    return Reason(f"jax_ar's kernels do not take {dtype}",
                  f"cast to {', '.join(str(d) for d in supported[:4])} to use them")


def _traced(leaf) -> bool:
    return isinstance(leaf, (jax.core.Tracer, jax.ShapeDtypeStruct))


def operand_dtype(leaf, op) -> np.dtype:
    """The dtype a leaf is reduced in (a constant's as a jax array: canonical,
    so float32 for a Python float); bool sums are int32 sums, as jax.lax's."""
    dtype = np.dtype(jax.dtypes.canonicalize_dtype(
        leaf.dtype if hasattr(leaf, "dtype") else np.result_type(leaf)))
    return np.dtype(np.int32) if dtype == np.bool_ and op in ("sum", "avg") else dtype


def _check_array_like(leaf, what):
    if not isinstance(leaf, (jax.Array, np.ndarray, np.generic, bool, int, float, complex)):
        raise TypeError(f"{what}: a leaf of type {type(leaf).__name__} is not an array "
                        "(unsupported dtype); pass arrays or Python / numpy scalars")


def as_array(leaf, what):
    """A leaf as a jax array (Python and numpy scalars and arrays too)."""
    if isinstance(leaf, jax.core.Tracer):
        return leaf
    _check_array_like(leaf, what)
    return jnp.asarray(leaf)


def _nbytes(spec) -> int:
    shape, dtype = spec
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _padded(spec) -> int:
    """What a leaf takes in a packed message: a whole number of 16 bytes."""
    return -(-_nbytes(spec) // 16) * 16


def _pack(indices, specs, capacity):
    """Splits leaves into calls of at most `capacity` bytes each (a larger
    leaf gets a call of its own and is carried in several rounds)."""
    groups, current, used = [], [], 0
    for i in indices:
        if current and used + _padded(specs[i]) > capacity:
            groups.append(tuple(current))
            current, used = [], 0
        current.append(i)
        used += _padded(specs[i])
    if current:
        groups.append(tuple(current))
    return groups
