// What every collective FFI handler of both backends does first, in the same
// order on CPU and GPU: check its attributes and operands (handler_args.h,
// rms_norm_args.h), then find its rank (find_rank.h), then check what needs
// the world size. Each returns the rank state, or nullptr with `error` set;
// the backend's own work (and its own limits) follows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/find_rank.h"
#include "common/handler_args.h"
#include "common/rms_norm_args.h"

namespace jax_ar {

// all_reduce: its operands are checked while the backend packs them
// (ForEachAllReduceOperand). `has_two_shot_ll`: the backend has that kernel.
template <typename State>
std::shared_ptr<State> StartAllReduce(int64_t comm_id, int device_ordinal, int32_t op,
                                      int32_t algorithm, bool has_two_shot_ll,
                                      ffi::Error& error) {
  constexpr Operation kOperation = Operation::kAllReduce;
  if (error = CheckReduceOp(OperationName(kOperation), op); error.failure()) return nullptr;
  if (error = CheckAlgorithm(OperationName(kOperation), algorithm, has_two_shot_ll);
      error.failure()) {
    return nullptr;
  }
  return FindRank<State>(static_cast<uint64_t>(comm_id), device_ordinal, kOperation, error);
}

template <typename State>
std::shared_ptr<State> StartReduceScatter(int64_t comm_id, int device_ordinal,
                                          const ffi::AnyBuffer& in, const ffi::AnyBuffer& out,
                                          int32_t op, ffi::Error& error) {
  constexpr Operation kOperation = Operation::kReduceScatter;
  if (error = CheckReduceOp(OperationName(kOperation), op); error.failure()) return nullptr;
  if (error = CheckReducible(OperationName(kOperation), in.element_type()); error.failure()) {
    return nullptr;
  }
  auto state = FindRank<State>(static_cast<uint64_t>(comm_id), device_ordinal, kOperation, error);
  if (state == nullptr) return nullptr;
  if (error = CheckReduceScatterShapes(in, out, state->world); error.failure()) return nullptr;
  return state;
}

// Only bytes move, so any element type will do.
template <typename State>
std::shared_ptr<State> StartAllGather(int64_t comm_id, int device_ordinal,
                                      const ffi::AnyBuffer& in, const ffi::AnyBuffer& out,
                                      ffi::Error& error) {
  auto state = FindRank<State>(static_cast<uint64_t>(comm_id), device_ordinal,
                               Operation::kAllGather, error);
  if (state == nullptr) return nullptr;
  if (error = CheckAllGatherShapes(in, out, state->world); error.failure()) return nullptr;
  return state;
}

// Sets rows, hidden and vectors as CheckAllReduceRmsNormCall does.
template <typename State>
std::shared_ptr<State> StartAllReduceRmsNorm(
    int64_t comm_id, int device_ordinal, int32_t algorithm, int32_t quantize,
    const ffi::AnyBuffer& x, const ffi::AnyBuffer& residual, const ffi::AnyBuffer& gamma,
    const ffi::AnyBuffer& post_gamma, const ffi::AnyBuffer& bias, const ffi::AnyBuffer& out,
    const ffi::AnyBuffer& residual_out, float eps, size_t& rows, size_t& hidden,
    NormVectors& vectors, ffi::Error& error) {
  constexpr Operation kOperation = Operation::kAllReduceRmsNorm;
  if (error = CheckAllReduceRmsNormCall(OperationName(kOperation), algorithm, quantize, x,
                                        residual, gamma, post_gamma, bias, out, residual_out, eps,
                                        rows, hidden, vectors);
      error.failure()) {
    return nullptr;
  }
  return FindRank<State>(static_cast<uint64_t>(comm_id), device_ordinal, kOperation, error);
}

}  // namespace jax_ar
