// RMSNorm on the CPU backend: the row arithmetic shared by rms_norm's FFI
// handlers (rms_norm.cc) and the fused all-reduce + residual + RMSNorm
// handler (all_reduce_rms_norm.cc), and the handlers' symbols.
//
// Contract (the CUDA kernels follow it too): v is a float32 row, gamma a
// float32 vector; out = round(v * rsqrt(mean(v * v) + eps) * gamma),
// evaluated left to right in float32 and rounded once to the output type
// (round to nearest even). With an FP8 output the float32 value is divided by the scale,
// saturated to +-448 and rounded to float8_e4m3fn; NaN stays NaN.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/ffi_util.h"
#include "common/inverse_rms.h"
#include "common/rms_norm_args.h"
#include "cpu/numeric.h"

namespace jax_ar::cpu {

// 1 / sqrt(mean(v * v) + eps): squares summed in double in element order,
// then the formula every backend shares (common/inverse_rms.h). The GPU sums
// the same exact squares in another order, so the two agree but for the
// last bits of the double sum.
inline float InverseRms(const float* v, size_t hidden, float eps) {
  double sum = 0;
  for (size_t i = 0; i < hidden; ++i) sum += static_cast<double>(v[i]) * v[i];
  return InverseRmsOfSumOfSquares(sum, hidden, eps);
}

// float32 -> float8_e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa
// bits, no infinities, NaN = S.1111.111), saturating: |f| >= 448 gives the
// largest finite value, 448. Round to nearest even.
inline uint8_t FloatToE4m3fnSaturated(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  if (std::isnan(f)) return sign | 0x7fu;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7eu;
  if (a < 0.015625f) {
    // Below the smallest normal (2^-6): units of 2^-9. The scaling is exact
    // and nearbyint rounds to even; 8 units (2^-6) encode as 0x08, the
    // smallest normal, so the carry needs no special case.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  // Normal: round the float32 mantissa to 3 bits (a carry moves the
  // exponent up, which the re-read below picks up), then re-bias 127 -> 7.
  uint32_t u = std::bit_cast<uint32_t>(a);
  u += 0x7ffffu + ((u >> 20) & 1u);
  const uint32_t exponent = (u >> 23) - 127u + 7u;
  const uint32_t mantissa = (u >> 20) & 7u;
  return sign | static_cast<uint8_t>((exponent << 3) | mantissa);
}

// Writes row `v` normalized and scaled by the float32 `gamma` through
// store(i, value).
template <typename Store>
void NormalizeRow(const float* v, const float* gamma, size_t hidden, float eps, Store&& store) {
  const float inv_rms = InverseRms(v, hidden, eps);
  for (size_t i = 0; i < hidden; ++i) store(i, v[i] * inv_rms * gamma[i]);
}

// The floating types the norms serve.
template <typename Fn>
bool DispatchNormDtype(ffi::DataType dtype, Fn&& fn) {
  switch (dtype) {
    case ffi::DataType::F32: fn(F32Traits{}); return true;
    case ffi::DataType::BF16: fn(Bf16Traits{}); return true;
    case ffi::DataType::F16: fn(F16Traits{}); return true;
    default: return false;
  }
}

// fn(x traits, residual traits) for a residual of x's type or float32 (the
// pairs rms_norm_args.h lets through).
template <typename Fn>
bool DispatchNormDtypes(ffi::DataType x_dtype, ffi::DataType residual_dtype, Fn&& fn) {
  return DispatchNormDtype(x_dtype, [&](auto x_traits) {
    if (residual_dtype == ffi::DataType::F32) {
      fn(x_traits, F32Traits{});
    } else {
      fn(x_traits, x_traits);
    }
  });
}

XLA_FFI_DECLARE_HANDLER_SYMBOL(kRmsNorm);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kAddRmsNorm);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kAllReduceRmsNorm);

}  // namespace jax_ar::cpu
