// The one packed vector type of the CUDA kernels: 16 bytes of one element
// type, unpacked to float32 (int32) lanes and packed back, with the 16-bit
// conversions as a named policy.
//
// Two policies, because two contracts:
//   KeepNanPayloads  bit for bit the CPU backend (cuda/cpu/numeric.h): round
//                    to nearest even, NaN payloads kept. The collectives and
//                    the fused all_reduce_rms_norm use it (their results are
//                    checked bit for bit against the CPU's, payloads too).
//   FastIntrinsics   CUDA's paired conversions (__float22bfloat162_rn,
//                    __float22half2_rn): the same rounding, but NaN becomes
//                    the canonical NaN. jax_ar.rms_norm's kernel uses it:
//                    measured up to 4% faster from 8192 tokens on an H200
//                    (docs/rms_norm.md), and its tests compare NaN positions.
// float32 and int32 lanes need no conversion, so their vectors ignore the
// policy.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

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

// Conversion policies: a 16-bit type <-> float32, two lanes (one 32-bit
// word, low half first) at a time.
struct KeepNanPayloads {
  struct Bf16 {
    __device__ static float2 ToFloat2(uint32_t w) {
      return make_float2(Bf16ToFloat(w & 0xffffu), Bf16ToFloat(w >> 16));
    }
    __device__ static uint32_t FromFloat2(float lo, float hi) {
      return FloatToBf16(lo) | (FloatToBf16(hi) << 16);
    }
  };
  struct F16 {
    __device__ static float2 ToFloat2(uint32_t w) {
      return make_float2(HalfToFloat(w & 0xffffu), HalfToFloat(w >> 16));
    }
    __device__ static uint32_t FromFloat2(float lo, float hi) {
      return FloatToHalf(lo) | (FloatToHalf(hi) << 16);
    }
  };
};

struct FastIntrinsics {
  struct Bf16 {
    __device__ static float2 ToFloat2(uint32_t w) {
      return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
    }
    __device__ static uint32_t FromFloat2(float lo, float hi) {
      const __nv_bfloat162 h = __float22bfloat162_rn(make_float2(lo, hi));
      return *reinterpret_cast<const uint32_t*>(&h);
    }
  };
  struct F16 {
    __device__ static float2 ToFloat2(uint32_t w) {
      return __half22float2(*reinterpret_cast<const __half2*>(&w));
    }
    __device__ static uint32_t FromFloat2(float lo, float hi) {
      const __half2 h = __float22half2_rn(make_float2(lo, hi));
      return *reinterpret_cast<const uint32_t*>(&h);
    }
  };
};

/// A 16-byte vector of element type D: Unpack to kLanes accumulator lanes,
/// Pack back (16-bit types rounded by Policy).
template <Dtype D, typename Policy = KeepNanPayloads>
struct Vec;

template <typename Policy>
struct Vec<Dtype::kF32, Policy> {
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

template <typename Policy>
struct Vec<Dtype::kS32, Policy> {
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
      const float2 f = Convert::ToFloat2(w[i]);
      a[2 * i] = f.x, a[2 * i + 1] = f.y;
    }
  }
  __device__ static uint4 Pack(const Acc* a) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = Convert::FromFloat2(a[2 * i], a[2 * i + 1]);
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
};

template <typename Policy>
struct Vec<Dtype::kBF16, Policy> : Vec16Bit<typename Policy::Bf16> {};
template <typename Policy>
struct Vec<Dtype::kF16, Policy> : Vec16Bit<typename Policy::F16> {};

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

}  // namespace jax_ar::gpu
