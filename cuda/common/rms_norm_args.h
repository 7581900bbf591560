// Operand checks of the norm FFI handlers, shared by the CPU and CUDA
// modules so that both reject the same calls with the same words. The
// operand lists are those of docs/rms_norm.md ("FFI targets"):
//
//   jax_ar_rms_norm             x [..., H], gamma f32[H] -> out like x
//   jax_ar_add_rms_norm         x [..., H], residual [..., H], gamma f32[H]
//                               -> out like x, residual_out like residual
//   jax_ar_all_reduce_rms_norm  as common/all_reduce_rms_norm_ffi.h binds it
//
// x is float32, bfloat16 or float16; the residual is of x's type or float32
// (Python converts other pairs, docs/rms_norm.md says how); the scale
// vectors are float32, scale_offset already added by Python, so that the
// kernels see one type whatever the parameters' dtype. Rows of the fused op
// fall into G groups of T / G consecutive rows (a vmap over stacked layers):
// group g uses row g of gamma, post_gamma and bias.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/ffi_util.h"
#include "common/handler_args.h"
#include "common/protocol.h"

namespace jax_ar {

// `x` of rank >= 1 and one of the norms' types; sets rows (the product of
// the leading dimensions) and hidden (the last).
inline ffi::Error CheckNormInput(const char* op, const ffi::AnyBuffer& x, size_t& rows,
                                 size_t& hidden) {
  const ffi::DataType dtype = x.element_type();
  if (dtype != ffi::DataType::F32 && dtype != ffi::DataType::BF16 &&
      dtype != ffi::DataType::F16) {
    return InvalidCall(op, std::string("x must be float32, bfloat16 or float16, got ") +
                               DtypeName(dtype));
  }
  if (x.dimensions().size() == 0) return InvalidCall(op, "x must have rank >= 1");
  hidden = static_cast<size_t>(x.dimensions().back());
  rows = hidden == 0 ? 0 : x.element_count() / hidden;
  return ffi::Error::Success();
}

inline ffi::Error CheckEps(const char* op, float eps) {
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    return InvalidCall(op, "eps must be positive and finite, got " + std::to_string(eps));
  }
  return ffi::Error::Success();
}

// A scale vector of rms_norm: float32 [hidden].
inline ffi::Error CheckScaleVector(const char* op, const char* name, const ffi::AnyBuffer& v,
                                   const ffi::AnyBuffer& x, size_t hidden) {
  if (v.element_type() != ffi::DataType::F32 || v.dimensions().size() != 1 ||
      static_cast<size_t>(v.dimensions()[0]) != hidden) {
    return InvalidCall(op, std::string(name) + " is " + DtypeName(v.element_type()) +
                               ShapeText(v) + ", expected float32[" + std::to_string(hidden) +
                               "] for x of shape " + ShapeText(x));
  }
  return ffi::Error::Success();
}

// The residual operand: x's shape, x's type or float32.
inline ffi::Error CheckResidual(const char* op, const ffi::AnyBuffer& x,
                                const ffi::AnyBuffer& residual) {
  const ffi::DataType type = residual.element_type();
  if (!SameShape(x, residual) || (type != x.element_type() && type != ffi::DataType::F32)) {
    return InvalidCall(op, std::string("residual is ") + DtypeName(type) + ShapeText(residual) +
                               ", expected " + DtypeName(x.element_type()) + " or float32" +
                               ShapeText(x));
  }
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

// Everything the rms_norm handlers check: x, gamma float32 [hidden], eps,
// `out` like x, and with a residual (non-null) `residual` of x's shape (x's
// type or float32) and `residual_out` like the residual.
inline ffi::Error CheckRmsNormCall(const char* op, const ffi::AnyBuffer& x,
                                   const ffi::AnyBuffer* residual, const ffi::AnyBuffer& gamma,
                                   const ffi::AnyBuffer& out, const ffi::AnyBuffer* residual_out,
                                   float eps, size_t& rows, size_t& hidden) {
  if (auto error = CheckNormInput(op, x, rows, hidden); error.failure()) return error;
  if (auto error = CheckScaleVector(op, "gamma", gamma, x, hidden); error.failure()) return error;
  if (auto error = CheckEps(op, eps); error.failure()) return error;
  if (auto error = CheckNormResult(op, "out", x, out, x.element_type()); error.failure()) {
    return error;
  }
  if (residual == nullptr) return ffi::Error::Success();
  if (auto error = CheckResidual(op, x, *residual); error.failure()) return error;
  return CheckNormResult(op, "residual_out", x, *residual_out, residual->element_type());
}

// The fused op's scale vectors, as CheckNormVectors found them.
struct NormVectors {
  size_t groups = 1;          // G: rows of gamma; group g owns rows [g R, (g + 1) R)
  size_t rows_per_group = 0;  // R = rows / G
  bool post_norm = false;     // post_gamma given: the sum is normalized before the residual add
  bool bias = false;          // bias given: added to the sum first
};

// What peers of one all_reduce_rms_norm call must agree on beyond its
// operation, algorithm and world: both backends mix it into the call's
// signature, so a peer whose call differs in any of these (a row split
// alike in bytes, eps, the vectors, the output type) fails at once instead
// of normalizing rows the others did not send.
inline uint64_t NormCallHash(ffi::DataType x, ffi::DataType residual, size_t rows, size_t hidden,
                             int32_t quantize, float eps, const NormVectors& vectors) {
  uint32_t eps_bits = 0;
  std::memcpy(&eps_bits, &eps, sizeof(eps_bits));
  uint64_t hash = HashMix(kFnvOffset, 0x52534e4f524dull);  // "RSNORM": never an all_reduce's
  for (uint64_t v : {static_cast<uint64_t>(x), static_cast<uint64_t>(residual),
                     static_cast<uint64_t>(rows), static_cast<uint64_t>(hidden),
                     static_cast<uint64_t>(quantize), static_cast<uint64_t>(eps_bits),
                     static_cast<uint64_t>(vectors.groups), static_cast<uint64_t>(vectors.post_norm),
                     static_cast<uint64_t>(vectors.bias)}) {
    hash = HashMix(hash, v);
  }
  return hash;
}

// gamma float32 [G, hidden] with G >= 1 dividing `rows`; post_gamma and
// bias float32 [G, hidden], or [0, hidden] for none.
inline ffi::Error CheckNormVectors(const char* op, const ffi::AnyBuffer& x,
                                   const ffi::AnyBuffer& gamma, const ffi::AnyBuffer& post_gamma,
                                   const ffi::AnyBuffer& bias, size_t rows, size_t hidden,
                                   NormVectors& vectors) {
  const auto is_matrix = [&](const ffi::AnyBuffer& v) {
    return v.element_type() == ffi::DataType::F32 && v.dimensions().size() == 2 &&
           static_cast<size_t>(v.dimensions()[1]) == hidden;
  };
  if (!is_matrix(gamma) || gamma.dimensions()[0] < 1 ||
      rows % static_cast<size_t>(gamma.dimensions()[0]) != 0) {
    return InvalidCall(op, "gamma is " + std::string(DtypeName(gamma.element_type())) +
                               ShapeText(gamma) + ", expected float32[G, " +
                               std::to_string(hidden) + "] with G dividing the " +
                               std::to_string(rows) + " rows of x " + ShapeText(x));
  }
  vectors.groups = static_cast<size_t>(gamma.dimensions()[0]);
  vectors.rows_per_group = rows / vectors.groups;
  const auto optional = [&](const char* name, const ffi::AnyBuffer& v, bool& present) {
    const int64_t leading = is_matrix(v) ? v.dimensions()[0] : -1;
    if (leading != 0 && leading != static_cast<int64_t>(vectors.groups)) {
      return InvalidCall(op, std::string(name) + " is " + DtypeName(v.element_type()) +
                                 ShapeText(v) + ", expected float32[" +
                                 std::to_string(vectors.groups) + ", " + std::to_string(hidden) +
                                 "] like gamma, or float32[0, " + std::to_string(hidden) +
                                 "] for none");
    }
    present = leading != 0;
    return ffi::Error::Success();
  };
  if (auto error = optional("post_gamma", post_gamma, vectors.post_norm); error.failure()) {
    return error;
  }
  return optional("bias", bias, vectors.bias);
}

// Everything both all_reduce_rms_norm handlers check: the algorithm and
// quantize attributes, the operands (x, residual, the scale vectors, eps),
// residual_out like the residual, and out like x in x's type (or
// float8_e4m3fn with quantize).
inline ffi::Error CheckAllReduceRmsNormCall(
    const char* op, int32_t algorithm, int32_t quantize, const ffi::AnyBuffer& x,
    const ffi::AnyBuffer& residual, const ffi::AnyBuffer& gamma, const ffi::AnyBuffer& post_gamma,
    const ffi::AnyBuffer& bias, const ffi::AnyBuffer& out, const ffi::AnyBuffer& residual_out,
    float eps, size_t& rows, size_t& hidden, NormVectors& vectors) {
  // The fused kernels come in one-shot and two-shot only.
  if (auto error = CheckAlgorithm(op, algorithm, /*has_two_shot_ll=*/false); error.failure()) {
    return error;
  }
  if (quantize != 0 && quantize != 1) return InvalidCall(op, "quantize must be 0 or 1");
  if (auto error = CheckNormInput(op, x, rows, hidden); error.failure()) return error;
  if (auto error = CheckResidual(op, x, residual); error.failure()) return error;
  if (auto error = CheckNormVectors(op, x, gamma, post_gamma, bias, rows, hidden, vectors);
      error.failure()) {
    return error;
  }
  if (auto error = CheckEps(op, eps); error.failure()) return error;
  if (auto error = CheckNormResult(op, "residual_out", x, residual_out, residual.element_type());
      error.failure()) {
    return error;
  }
  const ffi::DataType out_type = quantize ? ffi::DataType::F8E4M3FN : x.element_type();
  return CheckNormResult(op, "out", x, out, out_type);
}

}  // namespace jax_ar
