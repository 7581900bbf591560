// Element types and reduction operators of the CPU backend.
//
// Half-precision values are reduced in float32 and rounded once at the end,
// in a fixed rank order, exactly as the CUDA kernels do; conversions are
// written out here (round to nearest even, NaN payloads kept) rather than
// left to compiler extensions so that every build rounds the same way.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "common/protocol.h"

namespace jax_ar::cpu {

inline float Bf16ToFloat(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

inline uint16_t FloatToBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (ax < 0x38800000u) {  // half subnormal or zero: units of 2^-24, exact scaling
    const float scaled = std::bit_cast<float>(ax) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  uint32_t h = ((((ax >> 23) - 112u)) << 10) | ((ax & 0x7fffffu) >> 13);
  const uint32_t rest = ax & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

// Storage type, accumulator type and conversions for one XLA element type.
struct F32Traits {
  using Storage = float;
  using Acc = float;
  static Acc Load(Storage v) { return v; }
  static Storage Store(Acc v) { return v; }
};
struct Bf16Traits {
  using Storage = uint16_t;
  using Acc = float;
  static Acc Load(Storage v) { return Bf16ToFloat(v); }
  static Storage Store(Acc v) { return FloatToBf16(v); }
};
struct F16Traits {
  using Storage = uint16_t;
  using Acc = float;
  static Acc Load(Storage v) { return HalfToFloat(v); }
  static Storage Store(Acc v) { return FloatToHalf(v); }
};
struct S32Traits {
  using Storage = int32_t;
  using Acc = int32_t;
  static Acc Load(Storage v) { return v; }
  static Storage Store(Acc v) { return v; }
};

// Sum wraps for integers (as XLA's add does); max and min propagate NaN and
// order -0.0 below +0.0, so the result never depends on operand order.
template <typename Acc>
inline Acc Combine(ReduceOp op, Acc a, Acc b) {
  if constexpr (std::is_integral_v<Acc>) {
    switch (op) {
      case ReduceOp::kMax: return a > b ? a : b;
      case ReduceOp::kMin: return a < b ? a : b;
      default:
        return static_cast<Acc>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
    }
  } else {
    switch (op) {
      case ReduceOp::kMax:
        if (std::isnan(a)) return a;
        if (std::isnan(b)) return b;
        if (a == b) return std::signbit(a) ? b : a;
        return a > b ? a : b;
      case ReduceOp::kMin:
        if (std::isnan(a)) return a;
        if (std::isnan(b)) return b;
        if (a == b) return std::signbit(a) ? a : b;
        return a < b ? a : b;
      default:
        return a + b;
    }
  }
}

}  // namespace jax_ar::cpu
