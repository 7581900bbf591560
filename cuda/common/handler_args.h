// Argument checks of the collective FFI handlers (all_reduce,
// reduce_scatter, all_gather), shared by the CPU and CUDA modules so that
// both reject the same calls with the same words. The norms' checks build on
// these (rms_norm_args.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "common/ffi_util.h"
#include "common/protocol.h"

namespace jax_ar {

inline ffi::Error InvalidCall(const char* operation, const std::string& why) {
  return InvalidArgument(std::string(operation) + ": " + why);
}

inline std::string ShapeText(const ffi::AnyBuffer& b) {
  std::string text = "[";
  for (size_t i = 0; i < b.dimensions().size(); ++i) {
    text += (i ? ", " : "") + std::to_string(b.dimensions()[i]);
  }
  return text + "]";
}

inline bool SameShape(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b) {
  auto da = a.dimensions(), db = b.dimensions();
  if (da.size() != db.size()) return false;
  for (size_t i = 0; i < da.size(); ++i) {
    if (da[i] != db[i]) return false;
  }
  return true;
}

// `op` attribute: a ReduceOp.
inline ffi::Error CheckReduceOp(const char* operation, int32_t op) {
  if (op < static_cast<int32_t>(ReduceOp::kSum) || op > static_cast<int32_t>(ReduceOp::kMin)) {
    return InvalidCall(operation, "unknown op " + std::to_string(op));
  }
  return ffi::Error::Success();
}

// `algorithm` attribute: an Algorithm (Python resolves "auto" and "psum").
// Only the CUDA all_reduce has the LL two-shot kernel (`has_two_shot_ll`);
// Python's plan never sends it elsewhere.
inline ffi::Error CheckAlgorithm(const char* operation, int32_t algorithm, bool has_two_shot_ll) {
  if (algorithm == static_cast<int32_t>(Algorithm::kTwoShotLL) && !has_two_shot_ll) {
    return InvalidCall(operation, "algorithm 3 (twoshot_ll, the two-shot over LL packets) has "
                                  "no kernel here; this handler runs 1 (oneshot) and 2 (twoshot)");
  }
  if (algorithm < static_cast<int32_t>(Algorithm::kOneShot) ||
      algorithm > static_cast<int32_t>(Algorithm::kTwoShotLL)) {
    return InvalidCall(operation, "unknown algorithm " + std::to_string(algorithm));
  }
  return ffi::Error::Success();
}

// The element types both backends reduce.
inline bool IsReducible(ffi::DataType t) {
  return t == ffi::DataType::F32 || t == ffi::DataType::BF16 || t == ffi::DataType::F16 ||
         t == ffi::DataType::S32;
}

inline ffi::Error CheckReducible(const char* operation, ffi::DataType t) {
  if (!IsReducible(t)) {
    return InvalidCall(operation, std::string("does not support dtype ") + DtypeName(t));
  }
  return ffi::Error::Success();
}

// all_reduce's operands and results: as many results as operands, each of
// its operand's type and size, every type reducible. Calls fn(in, out) for
// each pair in order; stops at the first error fn returns.
template <typename Fn>
ffi::Error ForEachAllReduceOperand(ffi::RemainingArgs args, ffi::RemainingRets rets, Fn&& fn) {
  constexpr const char* kOperation = "all_reduce";
  if (args.size() != rets.size()) {
    return InvalidCall(kOperation, "got " + std::to_string(args.size()) + " operands but " +
                                       std::to_string(rets.size()) + " results");
  }
  for (size_t i = 0; i < args.size(); ++i) {
    auto in = args.get<ffi::AnyBuffer>(i);
    auto out = rets.get<ffi::AnyBuffer>(i);
    if (in.has_error()) return in.error();
    if (out.has_error()) return out.error();
    if (auto error = CheckReducible(kOperation, in->element_type()); error.failure()) return error;
    if ((*out)->element_type() != in->element_type() || (*out)->size_bytes() != in->size_bytes()) {
      return InvalidCall(kOperation, "result " + std::to_string(i) + " does not match its operand");
    }
    if (auto error = fn(*in, **out); error.failure()) return error;
  }
  return ffi::Error::Success();
}

// reduce_scatter's result is 1/world of its operand ([world, ...], row j for
// rank j), in the operand's type.
inline ffi::Error CheckReduceScatterShapes(const ffi::AnyBuffer& in, const ffi::AnyBuffer& out,
                                           int world) {
  if (out.element_type() != in.element_type() ||
      out.size_bytes() * static_cast<size_t>(world) != in.size_bytes()) {
    return InvalidCall("reduce_scatter", "result must be 1/" + std::to_string(world) +
                                             " of its operand, with the same dtype");
  }
  return ffi::Error::Success();
}

// all_gather's result ([world, ...], row j from rank j) is world times its
// operand, in the operand's type (any type: only bytes move).
inline ffi::Error CheckAllGatherShapes(const ffi::AnyBuffer& in, const ffi::AnyBuffer& out,
                                       int world) {
  if (out.element_type() != in.element_type() ||
      in.size_bytes() * static_cast<size_t>(world) != out.size_bytes()) {
    return InvalidCall("all_gather", "result must be " + std::to_string(world) +
                                         " times its operand, with the same dtype");
  }
  return ffi::Error::Success();
}

// The CUDA kernels move 16-byte vectors: every buffer must start on a
// 16-byte boundary. Null pointers (absent operands) pass.
inline ffi::Error CheckAligned(const char* operation,
                               std::initializer_list<const void*> buffers) {
  for (const void* p : buffers) {
    if (reinterpret_cast<uintptr_t>(p) % kAlign != 0) {
      return InvalidCall(operation, "the CUDA kernel needs 16-byte aligned buffers");
    }
  }
  return ffi::Error::Success();
}

}  // namespace jax_ar
