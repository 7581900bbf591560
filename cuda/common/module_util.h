// What both nanobind modules (_jax_ar_cpu, _jax_ar_cuda) build their Python
// bindings from.
#pragma once

#include <nanobind/nanobind.h>

#include <stdexcept>
#include <string>

#include "common/norm_limits.h"
#include "common/protocol.h"
#include "xla/ffi/api/c_api.h"

namespace jax_ar {

// An XLA FFI handler as the capsule jax.ffi.register_ffi_target takes.
template <typename T>
nanobind::capsule EncapsulateHandler(T* fn) {
  return nanobind::capsule(reinterpret_cast<void*>(fn));
}

// The handlers every module has, one per FFI target the primitives lower to.
struct Handlers {
  XLA_FFI_Handler* all_reduce;
  XLA_FFI_Handler* reduce_scatter;
  XLA_FFI_Handler* all_gather;
  XLA_FFI_Handler* rms_norm;
  XLA_FFI_Handler* add_rms_norm;
  XLA_FFI_Handler* all_reduce_rms_norm;
};

// registrations(): {target name: handler capsule}, the names jax_ar/*.py
// lower to; a module adds its own targets to the dict.
inline nanobind::dict Registrations(const Handlers& h) {
  nanobind::dict targets;
  targets["jax_ar_all_reduce"] = EncapsulateHandler(h.all_reduce);
  targets["jax_ar_reduce_scatter"] = EncapsulateHandler(h.reduce_scatter);
  targets["jax_ar_all_gather"] = EncapsulateHandler(h.all_gather);
  targets["jax_ar_rms_norm"] = EncapsulateHandler(h.rms_norm);
  targets["jax_ar_add_rms_norm"] = EncapsulateHandler(h.add_rms_norm);
  targets["jax_ar_all_reduce_rms_norm"] = EncapsulateHandler(h.all_reduce_rms_norm);
  return targets;
}

// The limits() keys both modules report (a module adds its own):
//   max_ranks         ranks a communicator may have (kMaxRanks)
//   control_bytes     the control block at the start of every workspace;
//                     a workspace must be larger
//   vector_bytes      the CUDA norm kernels take rows of whole 16-byte vectors
//   fused_min_hidden, fused_max_hidden
//                     hidden sizes all_reduce_rms_norm's fused kernel takes
//                     (common/norm_limits.h)
inline nanobind::dict CommonLimits() {
  nanobind::dict limits;
  limits["max_ranks"] = kMaxRanks;
  limits["control_bytes"] = kControlBytes;
  limits["vector_bytes"] = kNormVectorBytes;
  limits["fused_min_hidden"] = kFusedMinHidden;
  limits["fused_max_hidden"] = kFusedMaxHidden;
  return limits;
}

// codes(): {"op": {name: code}, "algorithm": {name: code}}, the numbering of
// protocol.h that the primitives' FFI attributes carry (jax_ar/_native.py
// reads it from here; Python keeps no copy).
inline nanobind::dict Codes() {
  nanobind::dict ops, algorithms, codes;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    ops[OpName(op)] = static_cast<int32_t>(op);
  }
  for (Algorithm a : {Algorithm::kOneShot, Algorithm::kTwoShot, Algorithm::kTwoShotLL}) {
    algorithms[AlgorithmName(a)] = static_cast<int32_t>(a);
  }
  codes["op"] = ops;
  codes["algorithm"] = algorithms;
  return codes;
}

// capacities() takes any workspace and world size from Python; these would
// divide by zero or underflow.
inline void CheckCapacityArgs(size_t workspace_bytes, int world) {
  if (world < 1 || world > kMaxRanks) {
    throw std::invalid_argument("jax_ar: world size must be in [1, " +
                                std::to_string(kMaxRanks) + "]");
  }
  if (workspace_bytes <= kControlBytes) {
    throw std::invalid_argument("jax_ar: workspace smaller than its control block");
  }
}

}  // namespace jax_ar
