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

// The ways lanes combine, one type each (avg sums; Result scales), so that
// the op is dispatched once per step of a reduction and each lane is
// straight-line code. A switch on the op inside the lane loop measured
// 0.8-1.3 us a call per peer's step at 2-8 ranks: the one-shot summing took
// 5.2 us against 3.9 with the words xor-ed, at 2 ranks and 1 KB
// (2026-12-02, docs/gpu.md).
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

// Combines one 16-byte vector over `world` sources in rank order into `acc`
// (the accumulator lanes, not rounded); source(s) returns rank s's vector.
template <Dtype D, typename Lanes, typename Source>
__device__ __forceinline__ void AccumulateVector(int world, Source&& source,
                                                 typename Vec<D>::Acc* acc) {
  using V = Vec<D>;
  typename V::Acc next[V::kLanes];
  V::Unpack(source(0), acc);
  for (int s = 1; s < world; ++s) {
    V::Unpack(source(s), next);
#pragma unroll
    for (int i = 0; i < V::kLanes; ++i) acc[i] = Lanes::Apply(acc[i], next[i]);
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

  // Rounded once to the element type; avg divides the float32 sum once
  // (int32 "avg" never reaches a kernel: jax_ar sums integers and divides
  // in float32, as pmean does). A power-of-two world multiplies by its
  // reciprocal instead: the same correctly rounded bits (the reciprocal is
  // exact), in one instruction a lane where the division takes about ten
  // and a called slow path for some values. The division is the one
  // difference in the kernel between op avg and sum, and avg measured
  // 1.2-1.7 us a call slower (docs/gpu.md, 2026-12-02).
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

// The same reduction with the element type and op read at run time: each
// Add dispatches once on both and runs the typed lanes, never a wait inside
// the dispatch, so a kernel that awaits every rank's vector holds one copy
// of its wait loops for all element types and ops.
class VectorAccumulator {
 public:
  __device__ VectorAccumulator(Dtype dtype, int op) : dtype_(dtype), op_(op) {}

  template <typename Batch>
  __device__ __forceinline__ void Add(const Batch& batch) {
    DispatchAccumulator(dtype_, op_, [&](auto typed) {
      Load(typed);
      typed.Add(batch);
      Store(typed);
    });
  }

  // Adds rank s's vector (ranks in order; rank 0 starts the sum).
  __device__ __forceinline__ void Add(int s, uint4 v) { Add(OneVector{v, s, 1}); }

  __device__ __forceinline__ uint4 Result(int world) const {
    uint4 out;
    DispatchDtype(dtype_, [&](auto tag) {
      TypedAccumulator<decltype(tag)::kDtype, SumLanes> typed;
      Load(typed);
      out = typed.Result(op_, world);
    });
    return out;
  }

 private:
  template <typename Typed>
  __device__ __forceinline__ void Load(Typed& typed) const {
#pragma unroll
    for (int i = 0; i < Typed::V::kLanes; ++i) {
      if constexpr (std::is_same_v<typename Typed::Acc, float>) {
        typed.acc[i] = __uint_as_float(lanes_[i]);
      } else {
        typed.acc[i] = static_cast<int32_t>(lanes_[i]);
      }
    }
  }
  template <typename Typed>
  __device__ __forceinline__ void Store(const Typed& typed) {
#pragma unroll
    for (int i = 0; i < Typed::V::kLanes; ++i) {
      if constexpr (std::is_same_v<typename Typed::Acc, float>) {
        lanes_[i] = __float_as_uint(typed.acc[i]);
      } else {
        lanes_[i] = static_cast<uint32_t>(typed.acc[i]);
      }
    }
  }

  Dtype dtype_;
  int op_;
  uint32_t lanes_[8];
};

}  // namespace jax_ar::gpu
