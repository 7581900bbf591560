// Element arithmetic of the CUDA reductions, bit for bit the CPU backend's
// (cuda/cpu/numeric.h): 16-bit floats widen exactly to float32 (Vec with
// KeepNanPayloads, vec.cuh), reduce in float32 in rank order, and round once
// to nearest even; max/min propagate NaN and order -0.0 below +0.0; int32
// sums wrap. Every float operation is an explicit _rn intrinsic so that no
// build flag (contraction, flush to zero) changes a result.
#pragma once

#include <cstdint>
#include <type_traits>

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

// One rank's vector as a batch of one (VectorAccumulator::Add).
struct OneVector {
  static constexpr int kSize = 1;
  uint4 v;
  int base;
  int count;
  __device__ __forceinline__ uint4 Data(int) const { return v; }
};

// The reduction of one 16-byte vector over the ranks, its element type
// chosen at run time: the dispatch wraps the arithmetic of each step only,
// never a wait, so a kernel that awaits every rank's vector holds one copy
// of its wait loops for all element types. Add the ranks' vectors in rank
// order (in batches), then take Result.
class VectorAccumulator {
 public:
  __device__ VectorAccumulator(Dtype dtype, int op) : dtype_(dtype), op_(op) {}

  // Adds batch.Data(j) for j < batch.count (ranks batch.base + j, in rank
  // order; rank 0 starts the sum). Batch: packets.cuh RankBatch.
  template <typename Batch>
  __device__ __forceinline__ void Add(const Batch& batch) {
    DispatchDtype(dtype_, [&](auto tag) {
      using V = Vec<decltype(tag)::kDtype>;
      using Acc = typename V::Acc;
      Acc acc[V::kLanes], x[V::kLanes];
#pragma unroll
      for (int i = 0; i < V::kLanes; ++i) acc[i] = FromBits<Acc>(lanes_[i]);
#pragma unroll
      for (int j = 0; j < Batch::kSize; ++j) {
        if (j >= batch.count) break;
        V::Unpack(batch.Data(j), x);
#pragma unroll
        for (int i = 0; i < V::kLanes; ++i) {
          acc[i] = batch.base == 0 && j == 0 ? x[i] : Combine(op_, acc[i], x[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < V::kLanes; ++i) lanes_[i] = Bits(acc[i]);
    });
  }

  // Adds rank s's vector (ranks in order; rank 0 starts the sum).
  __device__ __forceinline__ void Add(int s, uint4 v) { Add(OneVector{v, s, 1}); }

  // Rounded once to the element type; avg divides the float32 sum once
  // (int32 "avg" never reaches a kernel: jax_ar sums integers and divides
  // in float32, as pmean does). A power-of-two world multiplies by its
  // reciprocal instead: the same correctly rounded bits (the reciprocal is
  // exact), in one instruction a lane where the division takes about ten
  // and a called slow path for some values. The division is the one
  // difference in the kernel between op avg and sum, and avg measured
  // 1.2-1.7 us a call slower (docs/gpu.md, 2026-12-02).
  __device__ __forceinline__ uint4 Result(int world) const {
    uint4 out;
    DispatchDtype(dtype_, [&](auto tag) {
      using V = Vec<decltype(tag)::kDtype>;
      using Acc = typename V::Acc;
      Acc x[V::kLanes];
#pragma unroll
      for (int i = 0; i < V::kLanes; ++i) x[i] = FromBits<Acc>(lanes_[i]);
      if constexpr (decltype(tag)::kDtype != Dtype::kS32) {
        if (op_ == static_cast<int>(ReduceOp::kAvg)) {
          const float w = static_cast<float>(world);
          if ((world & (world - 1)) == 0) {
            const float inverse = __frcp_rn(w);
#pragma unroll
            for (int i = 0; i < V::kLanes; ++i) x[i] = __fmul_rn(x[i], inverse);
          } else {
#pragma unroll
            for (int i = 0; i < V::kLanes; ++i) x[i] = __fdiv_rn(x[i], w);
          }
        }
      }
      out = V::Pack(x);
    });
    return out;
  }

 private:
  __device__ static uint32_t Bits(float v) { return __float_as_uint(v); }
  __device__ static uint32_t Bits(int32_t v) { return static_cast<uint32_t>(v); }
  template <typename T>
  __device__ static T FromBits(uint32_t b) {
    if constexpr (std::is_same_v<T, float>) {
      return __uint_as_float(b);
    } else {
      return static_cast<int32_t>(b);
    }
  }

  Dtype dtype_;
  int op_;
  uint32_t lanes_[8];
};

}  // namespace jax_ar::gpu
