// Operand checks of the norm FFI handlers, shared by the CPU and CUDA
// modules so that both reject the same calls with the same words.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>

#include "common/ffi_util.h"
#include "common/handler_args.h"
#include "common/protocol.h"

namespace jax_ar {

// `x` of rank >= 1 whose last dimension is the hidden size, `gamma` of shape
// [hidden] and x's dtype (float32, bfloat16 or float16), eps > 0. Sets rows
// (the product of the leading dimensions) and hidden.
inline ffi::Error CheckNormOperands(const char* op, const ffi::AnyBuffer& x,
                                    const ffi::AnyBuffer& gamma, float eps, size_t& rows,
                                    size_t& hidden) {
  const ffi::DataType dtype = x.element_type();
  if (dtype != ffi::DataType::F32 && dtype != ffi::DataType::BF16 &&
      dtype != ffi::DataType::F16) {
    return InvalidCall(op, std::string("x must be float32, bfloat16 or float16, got ") +
                               DtypeName(dtype));
  }
  if (gamma.element_type() != dtype) {
    return InvalidCall(op, std::string("gamma is ") + DtypeName(gamma.element_type()) +
                               " but x is " + DtypeName(dtype));
  }
  if (x.dimensions().size() == 0) {
    return InvalidCall(op, "x must have rank >= 1");
  }
  hidden = static_cast<size_t>(x.dimensions().back());
  if (gamma.dimensions().size() != 1 || static_cast<size_t>(gamma.dimensions()[0]) != hidden) {
    return InvalidCall(op, "gamma has shape " + ShapeText(gamma) + ", expected [" +
                               std::to_string(hidden) + "] for x of shape " + ShapeText(x));
  }
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    return InvalidCall(op, "eps must be positive and finite, got " + std::to_string(eps));
  }
  rows = hidden == 0 ? 0 : x.element_count() / hidden;
  return ffi::Error::Success();
}

// `result` must have x's shape and element type `dtype`.
inline ffi::Error CheckNormResult(const char* op, const char* name, const ffi::AnyBuffer& x,
                                  const ffi::AnyBuffer& result, ffi::DataType dtype) {
  if (!SameShape(x, result) || result.element_type() != dtype) {
    return InvalidCall(op, std::string(name) + " is " + DtypeName(result.element_type()) +
                               ShapeText(result) + ", expected " + DtypeName(dtype) +
                               ShapeText(x));
  }
  return ffi::Error::Success();
}

// Everything the rms_norm handlers check: the operands, `out` like x, and
// with a residual (non-null) `residual` and `residual_out` like x too.
inline ffi::Error CheckRmsNormCall(const char* op, const ffi::AnyBuffer& x,
                                   const ffi::AnyBuffer* residual, const ffi::AnyBuffer& gamma,
                                   const ffi::AnyBuffer& out, const ffi::AnyBuffer* residual_out,
                                   float eps, size_t& rows, size_t& hidden) {
  if (auto error = CheckNormOperands(op, x, gamma, eps, rows, hidden); error.failure()) {
    return error;
  }
  const ffi::DataType dtype = x.element_type();
  if (auto error = CheckNormResult(op, "out", x, out, dtype); error.failure()) return error;
  if (residual == nullptr) return ffi::Error::Success();
  if (auto error = CheckNormResult(op, "residual", x, *residual, dtype); error.failure()) {
    return error;
  }
  return CheckNormResult(op, "residual_out", x, *residual_out, dtype);
}

// Everything both all_reduce_rms_norm handlers check: the algorithm and
// quantize attributes, the operands, residual and residual_out like x, and
// out like x in x's type (or float8_e4m3fn with quantize).
inline ffi::Error CheckAllReduceRmsNormCall(const char* op, int32_t algorithm, int32_t quantize,
                                            const ffi::AnyBuffer& x,
                                            const ffi::AnyBuffer& residual,
                                            const ffi::AnyBuffer& gamma, const ffi::AnyBuffer& out,
                                            const ffi::AnyBuffer& residual_out, float eps,
                                            size_t& rows, size_t& hidden) {
  if (auto error = CheckAlgorithm(op, algorithm); error.failure()) return error;
  if (quantize != 0 && quantize != 1) {
    return InvalidCall(op, "quantize must be 0 or 1");
  }
  if (auto error = CheckNormOperands(op, x, gamma, eps, rows, hidden); error.failure()) {
    return error;
  }
  const ffi::DataType dtype = x.element_type();
  if (auto error = CheckNormResult(op, "residual", x, residual, dtype); error.failure()) {
    return error;
  }
  if (auto error = CheckNormResult(op, "residual_out", x, residual_out, dtype); error.failure()) {
    return error;
  }
  return CheckNormResult(op, "out", x, out, quantize ? ffi::DataType::F8E4M3FN : dtype);
}

}  // namespace jax_ar
