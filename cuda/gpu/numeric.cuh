// Element arithmetic of the CUDA kernels, bit for bit the CPU backend's
// (cuda/cpu/numeric.h): 16-bit floats widen exactly to float32, reduce in
// float32 in rank order, and round once to nearest even; NaN payloads are
// kept through conversions; max/min propagate NaN and order -0.0 below
// +0.0; int32 sums wrap. Every float operation is an explicit _rn intrinsic
// so that no build flag (contraction, flush to zero) changes a result.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "common/protocol.h"
#include "gpu/layout.h"

namespace jax_ar::gpu {

__device__ __forceinline__ float Bf16ToFloat(uint32_t h) { return __uint_as_float(h << 16); }

__device__ __forceinline__ uint32_t FloatToBf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x0040u;  // NaN: quiet, payload kept
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

__device__ __forceinline__ float HalfToFloat(uint32_t h) {
  if ((h & 0x7fffu) > 0x7c00u) {  // NaN: move the payload over unchanged
    return __uint_as_float(((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13));
  }
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));  // exact, subnormals too
}

__device__ __forceinline__ uint32_t FloatToHalf(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return ((x >> 16) & 0x8000u) | 0x7e00u | ((ax >> 13) & 0x3ffu);
  return __half_as_ushort(__float2half_rn(f));  // round to nearest even, subnormals kept
}

__device__ __forceinline__ bool IsNan(float v) { return (__float_as_uint(v) & 0x7fffffffu) > 0x7f800000u; }
__device__ __forceinline__ bool SignBit(float v) { return (__float_as_uint(v) >> 31) != 0; }

__device__ __forceinline__ float Combine(int op, float a, float b) {
  switch (op) {
    case static_cast<int>(ReduceOp::kMax):
      if (IsNan(a)) return a;
      if (IsNan(b)) return b;
      if (a == b) return SignBit(a) ? b : a;
      return a > b ? a : b;
    case static_cast<int>(ReduceOp::kMin):
      if (IsNan(a)) return a;
      if (IsNan(b)) return b;
      if (a == b) return SignBit(a) ? a : b;
      return a < b ? a : b;
    default:
      return __fadd_rn(a, b);
  }
}

__device__ __forceinline__ int32_t Combine(int op, int32_t a, int32_t b) {
  switch (op) {
    case static_cast<int>(ReduceOp::kMax): return a > b ? a : b;
    case static_cast<int>(ReduceOp::kMin): return a < b ? a : b;
    default: return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  }
}

// A 16-byte vector of one element type, unpacked to its accumulator lanes.
template <Dtype D>
struct Vec;

template <>
struct Vec<Dtype::kF32> {
  using Acc = float;
  static constexpr int kLanes = 4;
  __device__ static void Unpack(uint4 v, Acc* a) {
    a[0] = __uint_as_float(v.x), a[1] = __uint_as_float(v.y);
    a[2] = __uint_as_float(v.z), a[3] = __uint_as_float(v.w);
  }
  __device__ static uint4 Pack(const Acc* a) {
    return make_uint4(__float_as_uint(a[0]), __float_as_uint(a[1]), __float_as_uint(a[2]),
                      __float_as_uint(a[3]));
  }
};

template <>
struct Vec<Dtype::kS32> {
  using Acc = int32_t;
  static constexpr int kLanes = 4;
  __device__ static void Unpack(uint4 v, Acc* a) {
    a[0] = static_cast<int32_t>(v.x), a[1] = static_cast<int32_t>(v.y);
    a[2] = static_cast<int32_t>(v.z), a[3] = static_cast<int32_t>(v.w);
  }
  __device__ static uint4 Pack(const Acc* a) {
    return make_uint4(static_cast<uint32_t>(a[0]), static_cast<uint32_t>(a[1]),
                      static_cast<uint32_t>(a[2]), static_cast<uint32_t>(a[3]));
  }
};

// bfloat16 and float16: eight 16-bit lanes, low half of each word first.
template <typename Convert>
struct Vec16Bit {
  using Acc = float;
  static constexpr int kLanes = 8;
  __device__ static void Unpack(uint4 v, Acc* a) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a[2 * i] = Convert::ToFloat(w[i] & 0xffffu);
      a[2 * i + 1] = Convert::ToFloat(w[i] >> 16);
    }
  }
  __device__ static uint4 Pack(const Acc* a) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = Convert::FromFloat(a[2 * i]) | (Convert::FromFloat(a[2 * i + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
};

struct Bf16Convert {
  __device__ static float ToFloat(uint32_t h) { return Bf16ToFloat(h); }
  __device__ static uint32_t FromFloat(float f) { return FloatToBf16(f); }
};
struct F16Convert {
  __device__ static float ToFloat(uint32_t h) { return HalfToFloat(h); }
  __device__ static uint32_t FromFloat(float f) { return FloatToHalf(f); }
};

template <>
struct Vec<Dtype::kBF16> : Vec16Bit<Bf16Convert> {};
template <>
struct Vec<Dtype::kF16> : Vec16Bit<F16Convert> {};

// Calls fn(DtypeTag<d>{}): one instantiation per element type.
template <Dtype D>
struct DtypeTag {
  static constexpr Dtype kDtype = D;
};

template <typename Fn>
__device__ __forceinline__ void DispatchDtype(Dtype d, Fn&& fn) {
  switch (d) {
    case Dtype::kF32: fn(DtypeTag<Dtype::kF32>{}); break;
    case Dtype::kBF16: fn(DtypeTag<Dtype::kBF16>{}); break;
    case Dtype::kF16: fn(DtypeTag<Dtype::kF16>{}); break;
    case Dtype::kS32: fn(DtypeTag<Dtype::kS32>{}); break;
  }
}

// Combines one 16-byte vector over `world` sources in rank order into `acc`
// (the accumulator lanes, not rounded); source(s) returns rank s's vector.
template <Dtype D, typename Source>
__device__ __forceinline__ void AccumulateVector(int op, int world, Source&& source,
                                                 typename Vec<D>::Acc* acc) {
  using V = Vec<D>;
  typename V::Acc next[V::kLanes];
  V::Unpack(source(0), acc);
  for (int s = 1; s < world; ++s) {
    V::Unpack(source(s), next);
#pragma unroll
    for (int i = 0; i < V::kLanes; ++i) acc[i] = Combine(op, acc[i], next[i]);
  }
}

// The reduction of one 16-byte vector, rounded once to the element type;
// avg divides the float32 sum once (int32 "avg" never reaches a kernel:
// jax_ar sums integers and divides in float32, as pmean does).
template <Dtype D, typename Source>
__device__ __forceinline__ uint4 ReduceVector(int op, int world, Source&& source) {
  using V = Vec<D>;
  typename V::Acc acc[V::kLanes];
  AccumulateVector<D>(op, world, source, acc);
  if constexpr (D != Dtype::kS32) {
    if (op == static_cast<int>(ReduceOp::kAvg)) {
      const float n = static_cast<float>(world);
#pragma unroll
      for (int i = 0; i < V::kLanes; ++i) acc[i] = __fdiv_rn(acc[i], n);
    }
  }
  return V::Pack(acc);
}

}  // namespace jax_ar::gpu
