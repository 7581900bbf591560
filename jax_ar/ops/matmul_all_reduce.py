"""matmul_all_reduce: y = x [..., K] @ w [K, N] with K sharded over one mesh
axis, the partial products summed over it by jax_ar's all-reduce (the
row-parallel layer of tensor parallelism).

Two ways in, one arithmetic (each rank's local dot_general, then the
all-reduce of its result dtype):

* inside shard_map, where the axis is manual, x and w are this rank's
  shards: `local_matmul_all_reduce` is the local product and
  jax_ar.all_reduce, composed, so derivatives and vmap come from those ops;
* in plain jit on sharded arrays (models written with sharding annotations,
  no shard_map), `matmul_all_reduce_p` has the global meaning x @ w and
  lowers through custom_partitioning: partition() asks for x's last and w's
  first dimension sharded over the axis (N replicated; x's leading
  dimensions keep their sharding), and the per-shard program is the local
  product plus the all-reduce of the communicator set up for that axis
  (psum where none serves: the plan of that all-reduce says why). Its tangent is plain jnp, which XLA
  partitions itself (a row-parallel layer's transposes need no all-reduce).

On CPU devices jax_ar's calls of one program must meet in the same order on
every rank (_call_order.py). The partitioned body is lowered as a module of
its own, so the order is carried across it by scalars: the call takes a
scalar that waits for the previous jax_ar call of the block and returns one
that exists once its all-reduce has finished; neither is partitioned (both
replicated), so chaining moves no data.
"""
from __future__ import annotations

import functools

import numpy as np

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.sharding import NamedSharding, PartitionSpec as P

from .. import _compat, config
from ..comm.communicator import describe_groups, find_communicator, mesh_groups
from . import _call_order
from ._axes import REDUCE_DTYPES
from .all_reduce import run_all_reduce
from .plan import COMM_TODO, not_serving, plan_all_reduce, plan_one_axis

__all__ = ["check_result_dtype", "local_matmul_all_reduce", "matmul_all_reduce_p"]


def _dot(x, w, precision, preferred_element_type, out_sharding=None):
    """x [..., K] @ w [K, N] as flax.nnx.Linear computes it."""
    return jax.lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())), precision=precision,
                               preferred_element_type=preferred_element_type,
                               out_sharding=out_sharding)


def _lead_spec(spec, ndim, axis) -> tuple:
    """The PartitionSpec entries of x's leading dimensions from x's spec,
    without `axis` (K takes it)."""
    spec = tuple(spec) + (None,) * (ndim - len(spec))
    lead = []
    for entry in spec[:ndim - 1]:
        names = entry if isinstance(entry, tuple) else (entry,) if entry else ()
        kept = tuple(n for n in names if n != axis)
        lead.append(kept[0] if len(kept) == 1 else (kept or None))
    return tuple(lead)


def _out_sharding(x_aval, axis):
    """The result's sharding for x's: leading dimensions as x's, N
    replicated; on x's (abstract) mesh."""
    lead = _lead_spec(x_aval.sharding.spec, len(x_aval.shape), axis)
    return NamedSharding(x_aval.sharding.mesh, P(*lead, None))


def _global_dot(x, w, axis, precision, preferred_element_type):
    """x @ w on global arrays; where the mesh's axes are Explicit (sharding
    in types) the result's sharding is stated, the sum over K included."""
    explicit = _compat.has_explicit_sharding(jax.typeof(x))
    return _dot(x, w, precision, preferred_element_type,
                _out_sharding(jax.typeof(x), axis) if explicit else None)


def local_matmul_all_reduce(x, w, kinds, what, *, precision, preferred_element_type,
                            algorithm):
    """Inside shard_map: this rank's product, summed over the axes `kinds`
    as the all-reduce's plan says."""
    y = _dot(x, w, precision, preferred_element_type)
    return run_all_reduce(plan_all_reduce(what, kinds, [y], "sum", algorithm), [y])[0]


# ----------------------------------------------------------------------------
# The primitive of plain jit. Operands x [..., K], w [K, N] (one dtype);
# params: axis, precision, preferred_element_type, algorithm.

matmul_all_reduce_p = Primitive("jax_ar_matmul_all_reduce")


def _abstract_eval(x, w, *, axis, preferred_element_type, **_):
    dtype = preferred_element_type or x.dtype
    return x.update(shape=x.shape[:-1] + w.shape[-1:], dtype=np.dtype(dtype), weak_type=False,
                    sharding=_out_sharding(x, axis))


matmul_all_reduce_p.def_abstract_eval(_abstract_eval)


@functools.lru_cache(maxsize=None)
def _jitted_bind(**params):
    return jax.jit(lambda x, w: matmul_all_reduce_p.bind(x, w, **params))


matmul_all_reduce_p.def_impl(lambda x, w, **params: _jitted_bind(**params)(x, w))


def _communicator(mesh, axis):
    """The communicator that holds the devices of `axis` of the partitioned
    mesh (in rank order) and serves calls, or (None, why not)."""
    groups = mesh_groups(mesh, axis)
    comm = find_communicator(axis, groups)
    if comm is None:
        return None, config.Reason(f"no communicator holds the devices "
                                   f"{describe_groups(groups)} of axis {axis!r}",
                                   f"call jax_ar.setup(mesh, {axis!r}) before tracing")
    why = not_serving(comm)
    return (None, config.Reason(why, COMM_TODO)) if why else (comm, None)


def _specs(axis, x_shape):
    """(x, w, y) PartitionSpecs of one partitioned call: K over `axis`, N
    replicated, x's leading dimensions keeping what sharding they have."""
    ndim = len(x_shape.shape)
    spec = x_shape.sharding.spec if isinstance(x_shape.sharding, NamedSharding) else ()
    lead = _lead_spec(spec, ndim, axis)
    return P(*lead, axis), P(axis, None), P(*lead, None)


def _shardings(axis, mesh, arg_shapes):
    x_spec, w_spec, y_spec = _specs(axis, arg_shapes[0])
    named = lambda spec: NamedSharding(mesh, spec)  # noqa: E731
    return (named(x_spec), named(w_spec), named(P())), (named(y_spec), named(P()))


_NO_MESH = jax.sharding.AbstractMesh((), ())


def _partition(axis, precision, preferred_element_type, algorithm, mesh, arg_shapes,
               result_shape):
    del result_shape
    arg_shardings, out_shardings = _shardings(axis, mesh, arg_shapes)
    comm, reason = _communicator(mesh, axis)

    def lower_fn(x, w, after):
        # XLA asks for the body while it compiles, inside the caller's
        # jax.set_mesh: traced against that mesh, psum's reduction computation
        # would carry a sharding custom call, which XLA cannot reduce with
        # ("Unsupported reduction computation"). The body is per shard: no mesh.
        with jax.sharding.use_abstract_mesh(_NO_MESH):
            y = _dot(x, w, precision, preferred_element_type)
            (y,) = _call_order.after([y], after)  # CPU: not before the previous jax_ar call
            plan = plan_one_axis("jax_ar.matmul_all_reduce", axis, comm, [y], "sum", algorithm,
                                 reason)
            (y,) = run_all_reduce(plan, [y])
            (done,) = _call_order.after([jnp.zeros((), jnp.float32)], y)  # exists once y does
            return y, done

    return mesh, lower_fn, out_shardings, arg_shardings


def _infer_sharding(axis, precision, preferred_element_type, algorithm, mesh, arg_shapes,
                    result_shape):
    del precision, preferred_element_type, algorithm, result_shape
    return _shardings(axis, mesh, arg_shapes)[1]


def _global(axis, precision, preferred_element_type, algorithm, x, w, after):
    """What the call means on global arrays (and computes when nothing is
    partitioned, one device)."""
    del algorithm, after
    return _global_dot(x, w, axis, precision, preferred_element_type), jnp.zeros((), jnp.float32)


_partitioned = custom_partitioning(_global, static_argnums=(0, 1, 2, 3))
_partitioned.def_partition(partition=_partition, infer_sharding_from_operands=_infer_sharding,
                           sharding_rule="... k, k n, -> ... n, ",
                           need_replication_factors=("n",))


def _lowering(ctx, x, w, *, axis, precision, preferred_element_type, algorithm):
    # Chained at the level of this module: a scalar waits for the previous
    # jax_ar call of the block, the call's scalar result is the next link.
    scalar = _compat.shaped_array((), jnp.float32)
    (after,) = _call_order.after_previous_call(
        ctx.replace(avals_in=[scalar], avals_out=[scalar]),
        [mlir.ir_constant(np.float32(0))])

    def call(x, w, after):
        return list(_partitioned(axis, precision, preferred_element_type, algorithm, x, w, after))

    with _compat.partitioning_mesh(ctx) as has_mesh:
        if not has_mesh:
            raise ValueError(
                f"jax_ar.matmul_all_reduce in plain jit: no mesh names the devices XLA "
                f"partitions this call over (its operands carry no NamedSharding and no "
                f"jax.set_mesh mesh is over those devices), so axis {axis!r} cannot be "
                "found; place x or w with jax.device_put(a, NamedSharding(mesh, spec)) "
                "or call the jitted function under jax.set_mesh(mesh)")
        y, done = mlir.lower_fun(call, multiple_results=True)(
            ctx.replace(avals_in=list(ctx.avals_in) + [scalar],
                        avals_out=[ctx.avals_out[0], scalar]),
            x, w, after)
    _call_order.record_call(ctx.replace(avals_out=[scalar]), done)
    return [y]


# custom_partitioning reads the device assignment while lowering (as
# rms_norm's does): not cached, and jit must provide the devices.
mlir.register_lowering(matmul_all_reduce_p, _lowering, cacheable=False)
_compat.requires_devices_during_lowering(matmul_all_reduce_p)


def _jvp(primals, tangents, *, axis, precision, preferred_element_type, algorithm):
    x, w = primals
    y = matmul_all_reduce_p.bind(x, w, axis=axis, precision=precision,
                                 preferred_element_type=preferred_element_type,
                                 algorithm=algorithm)
    dx, dw = (ad.instantiate_zeros(t) for t in tangents)
    dot = functools.partial(_global_dot, axis=axis, precision=precision,
                            preferred_element_type=preferred_element_type)
    return y, dot(dx, w) + dot(x, dw)


ad.primitive_jvps[matmul_all_reduce_p] = _jvp


def _batch(args, dims, **params):
    x, w = args
    x_dim, w_dim = dims
    if w_dim is not None:
        # A weight per batch member is not one row-parallel product: XLA's
        # own ops (it partitions them itself).
        config.report("jax_ar.matmul_all_reduce", params["axis"], "XLA's own ops",
                      config.Reason("a weight per batch member under vmap",
                                    "share one weight across the batch to use jax_ar"))
        dot = functools.partial(_global_dot, axis=params["axis"], precision=params["precision"],
                                preferred_element_type=params["preferred_element_type"])
        return jax.vmap(dot, in_axes=(x_dim, w_dim))(x, w), 0
    # A batch of x is more leading dimensions.
    return matmul_all_reduce_p.bind(jnp.moveaxis(x, x_dim, 0), w, **params), 0


batching.primitive_batchers[matmul_all_reduce_p] = _batch


def check_result_dtype(what: str, x, w, preferred_element_type) -> np.dtype:
    """The product's dtype, which the all-reduce carries; an error if it
    cannot."""
    dtype = np.dtype(preferred_element_type or jnp.result_type(x, w))
    if dtype not in REDUCE_DTYPES:
        raise TypeError(f"{what}: the product has dtype {dtype}; jax_ar reduces "
                        f"{', '.join(str(d) for d in REDUCE_DTYPES)}")
    return dtype
