// Element arithmetic of the CUDA reductions, bit for bit the CPU backend's
// (cuda/cpu/numeric.h): 16-bit floats widen exactly to float32 (Vec with
// KeepNanPayloads, vec.cuh), reduce in float32 in rank order, and round once
// to nearest even; max/min propagate NaN and order -0.0 below +0.0; int32
// sums wrap. Every float operation is an explicit _rn intrinsic so that no
// build flag (contraction, flush to zero) changes a result.
#pragma once

#include <cstdint>

#include "common/protocol.h"
#include "gpu/layout.h"
#include "gpu/vec.cuh"

namespace jax_ar::gpu {

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

// AccumulateVector for at most kMaxWorld sources, unrolled: source(s) is
// called with compile-time indices, so sources held in a register array
// stay in registers.
template <Dtype D, int kMaxWorld, typename Source>
__device__ __forceinline__ void AccumulateVectorUnrolled(int op, int world, Source&& source,
                                                         typename Vec<D>::Acc* acc) {
  using V = Vec<D>;
  typename V::Acc next[V::kLanes];
  V::Unpack(source(0), acc);
#pragma unroll
  for (int s = 1; s < kMaxWorld; ++s) {
    if (s < world) {
      V::Unpack(source(s), next);
#pragma unroll
      for (int i = 0; i < V::kLanes; ++i) acc[i] = Combine(op, acc[i], next[i]);
    }
  }
}

// The reduction of one 16-byte vector, rounded once to the element type;
// avg divides the float32 sum once (int32 "avg" never reaches a kernel:
// jax_ar sums integers and divides in float32, as pmean does).
template <Dtype D, int kMaxWorld = kMaxRanks, typename Source>
__device__ __forceinline__ uint4 ReduceVector(int op, int world, Source&& source) {
  using V = Vec<D>;
  typename V::Acc acc[V::kLanes];
  AccumulateVectorUnrolled<D, kMaxWorld>(op, world, source, acc);
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
