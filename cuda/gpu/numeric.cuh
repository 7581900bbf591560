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

// The ways lanes combine, one type each (avg sums; Result scales), so that
// the op is dispatched once per vector of a reduction (DispatchAccumulator)
// and each lane is straight-line code. A switch on the op inside the lane
// loop measured 0.8-1.3 us a call per peer's step at 2-8 ranks: the
// one-shot summing took 5.2 us against 3.9 with the words xor-ed, at 2
// ranks and 1 KB (2026-12-02, docs/latency_log.md).
struct SumLanes {
  __device__ static __forceinline__ float Apply(float a, float b) { return __fadd_rn(a, b); }
  __device__ static __forceinline__ int32_t Apply(int32_t a, int32_t b) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  }
};
struct MaxLanes {
  __device__ static __forceinline__ float Apply(float a, float b) {
    if (IsNan(a)) return a;
    if (IsNan(b)) return b;
    if (a == b) return SignBit(a) ? b : a;
    return a > b ? a : b;
  }
  __device__ static __forceinline__ int32_t Apply(int32_t a, int32_t b) { return a > b ? a : b; }
};
struct MinLanes {
  __device__ static __forceinline__ float Apply(float a, float b) {
    if (IsNan(a)) return a;
    if (IsNan(b)) return b;
    if (a == b) return SignBit(a) ? a : b;
    return a < b ? a : b;
  }
  __device__ static __forceinline__ int32_t Apply(int32_t a, int32_t b) { return a < b ? a : b; }
};

// Calls fn(Lanes{}) with the lane type of ReduceOp `op`.
template <typename Fn>
__device__ __forceinline__ void DispatchLanes(int op, Fn&& fn) {
  switch (op) {
    case static_cast<int>(ReduceOp::kMax): fn(MaxLanes{}); break;
    case static_cast<int>(ReduceOp::kMin): fn(MinLanes{}); break;
    default: fn(SumLanes{}); break;
  }
}

// The reduction of one 16-byte vector of element type D over the ranks,
// combined by Lanes: add the ranks' vectors in rank order (in batches), then
// take Result.
template <Dtype D, typename Lanes>
struct TypedAccumulator {
  using V = Vec<D>;
  using Acc = typename V::Acc;
  Acc acc[V::kLanes];

  // Adds batch.Data(j) for j < batch.count (ranks batch.base + j, in rank
  // order; rank 0 starts the sum). Batch: packets.cuh RankBatch.
  template <typename Batch>
  __device__ __forceinline__ void Add(const Batch& batch) {
    Acc x[V::kLanes];
#pragma unroll
    for (int j = 0; j < Batch::kSize; ++j) {
      if (j >= batch.count) break;
      V::Unpack(batch.Data(j), x);
#pragma unroll
      for (int i = 0; i < V::kLanes; ++i) {
        acc[i] = batch.base == 0 && j == 0 ? x[i] : Lanes::Apply(acc[i], x[i]);
      }
    }
  }

  // The sum of kernels that hold every rank's vector at hand (the plain
  // two-shots, after their flags): source(s), rank s's vector, for every
  // rank in rank order into `sum` (accumulator lanes, not rounded), with no
  // wait between the ranks. AddRanks into this accumulator; SumRanks into a
  // caller's lanes, which the fused two-shot normalizes unrounded.
  template <typename Source>
  __device__ __forceinline__ static void SumRanks(int world, Source&& source, Acc* sum) {
    V::Unpack(source(0), sum);
    Acc x[V::kLanes];
    for (int s = 1; s < world; ++s) {
      V::Unpack(source(s), x);
#pragma unroll
      for (int i = 0; i < V::kLanes; ++i) sum[i] = Lanes::Apply(sum[i], x[i]);
    }
  }
  template <typename Source>
  __device__ __forceinline__ void AddRanks(int world, Source&& source) {
    SumRanks(world, source, acc);
  }

  // Rounded once to the element type; avg divides the float32 sum once
  // (int32 "avg" never reaches a kernel: jax_ar sums integers and divides
  // in float32, as pmean does). A power-of-two world multiplies by its
  // reciprocal instead: the same correctly rounded bits (the reciprocal is
  // exact), in one instruction a lane where the division takes about ten
  // and a called slow path for some values. The division is the one
  // difference in the kernel between op avg and sum, and avg measured
  // 1.2-1.7 us a call slower (docs/latency_log.md, 2026-12-02).
  __device__ __forceinline__ uint4 Result(int op, int world) const {
    Acc x[V::kLanes];
#pragma unroll
    for (int i = 0; i < V::kLanes; ++i) x[i] = acc[i];
    if constexpr (D != Dtype::kS32) {
      if (op == static_cast<int>(ReduceOp::kAvg)) {
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
    return V::Pack(x);
  }
};

// Calls fn(TypedAccumulator<D, Lanes>{}) for element type `dtype` and
// ReduceOp `op`: one instantiation of fn per pair, so a kernel that wraps a
// whole vector's waits in it holds one copy of its wait loops per pair.
template <typename Fn>
__device__ __forceinline__ void DispatchAccumulator(Dtype dtype, int op, Fn&& fn) {
  DispatchDtype(dtype, [&](auto tag) {
    DispatchLanes(op, [&](auto lanes) {
      fn(TypedAccumulator<decltype(tag)::kDtype, decltype(lanes)>{});
    });
  });
}

}  // namespace jax_ar::gpu
