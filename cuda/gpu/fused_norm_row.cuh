// The row of the fused all-reduce + residual add + RMSNorm kernels
// (all_reduce_rms_norm_kernels.cu), after the sum over ranks: bias,
// post-norm, residual add and norm of one row held by a group of threads,
// and the stores of its outputs (FP8 included).
#pragma once

#include <cstdint>
#include <type_traits>

#include "gpu/launch_protocol.cuh"
#include "gpu/norm_lanes.cuh"
#include "gpu/numeric.cuh"
#include "gpu/row_norm.cuh"
#include "gpu/row_plan.h"

namespace jax_ar::gpu {

inline constexpr float kE4m3Max = 448.0f;

// float32 -> float8_e4m3fn, saturating to +-448, round to nearest even, NaN
// to NaN; bit for bit the CPU's FloatToE4m3fnSaturated.
__device__ __forceinline__ uint32_t FloatToE4m3fnSaturated(float f) {
  const uint32_t sign = (__float_as_uint(f) >> 24) & 0x80u;
  if (IsNan(f)) return sign | 0x7fu;
  const float a = fabsf(f);
  if (a >= kE4m3Max) return sign | 0x7eu;
  if (a < 0.015625f) {  // subnormal: units of 2^-9 (exact scaling, round to even)
    return sign | static_cast<uint32_t>(__float2int_rn(__fmul_rn(a, 512.0f)));
  }
  uint32_t u = __float_as_uint(a);
  u += 0x7ffffu + ((u >> 20) & 1u);  // a carry moves the exponent up
  return sign | ((((u >> 23) - 127u + 7u) << 3) | ((u >> 20) & 7u));
}

// What a kernel's out holds: x's type or FP8 as its launch says
// (kByLaunch), or one of them for every launch of the kernel. The fused
// one-shot has a kernel for each (all_reduce_rms_norm_kernels.cu), so that
// the calls without FP8 run a kernel without its conversions: about 350 of
// the bfloat16 kernels' 3,040 instructions, which such calls skip, and
// without which the kernel ran up to 0.25 us a call faster at 4 ranks
// (docs/latency_log.md "forty-third push").
enum class OutKind { kByLaunch, kPlain, kFp8 };

// Whether out is FP8 (a.quantize) for a kernel of kOut.
template <OutKind kOut>
__device__ __forceinline__ bool Quantized(const RmsNormLaunchArgs& a) {
  if constexpr (kOut == OutKind::kByLaunch) {
    return a.quantize;
  } else {
    return kOut == OutKind::kFp8;
  }
}

// Bytes of one row's out per 16-byte vector of x: 16, or lanes with FP8.
template <Dtype D, OutKind kOut = OutKind::kByLaunch>
__device__ __forceinline__ int OutVectorBytes(const RmsNormLaunchArgs& a) {
  return Quantized<kOut>(a) ? Vec<D>::kLanes : 16;
}

// The normalized lanes `y` of one vector as out holds them: 16 bytes, or
// with FP8 the first OutVectorBytes of the word (the rest zero).
template <Dtype D, OutKind kOut = OutKind::kByLaunch>
__device__ __forceinline__ uint4 PackOut(const RmsNormLaunchArgs& a, float scale, const float* y) {
  using V = Vec<D>;
  if (!Quantized<kOut>(a)) return V::Pack(y);
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < V::kLanes; ++j) {
    w[j / 4] |= FloatToE4m3fnSaturated(__fdiv_rn(y[j], scale)) << (8 * (j % 4));
  }
  return make_uint4(w[0], w[1], 0, 0);
}

// Stores the first `bytes` (16, 8 or 4: OutVectorBytes) of an out vector.
__device__ __forceinline__ void StoreOutWord(std::byte* dst, uint4 word, int bytes) {
  if (bytes == 16) {
    Store16(dst, word);
  } else if (bytes == 8) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(word.x, word.y);
  } else {
    *reinterpret_cast<uint32_t*>(dst) = word.x;
  }
}

// Stores the normalized lanes `y` of vector `vector` of a row at `dst`.
template <Dtype D, OutKind kOut = OutKind::kByLaunch>
__device__ __forceinline__ void StoreOut(const RmsNormLaunchArgs& a, float scale, const float* y,
                                         std::byte* dst) {
  StoreOutWord(dst, PackOut<D, kOut>(a, scale, y), OutVectorBytes<D, kOut>(a));
}

template <Dtype R>
__device__ __forceinline__ int DtypeSize() {
  return R == Dtype::kF32 ? 4 : 2;
}

template <Dtype D, Dtype R>
__device__ __forceinline__ void FillRmsNormOutputs(const RmsNormLaunchArgs& a) {
  const uint64_t elements =
      static_cast<uint64_t>(a.rows) * a.row_vectors * Vec<D>::kLanes;
  FillBytes(a.residual_out, elements * DtypeSize<R>());
  FillBytes(a.out, elements * (a.quantize ? 1 : DtypeSize<D>()));
}

__device__ __forceinline__ const std::byte* RowOf(const void* base, int64_t row, uint64_t bytes) {
  return static_cast<const std::byte*>(base) + row * bytes;
}
__device__ __forceinline__ std::byte* RowOf(void* base, int64_t row, uint64_t bytes) {
  return static_cast<std::byte*>(base) + row * bytes;
}

// Bytes of one row of the residual (and residual_out).
template <Dtype D, Dtype R>
__device__ __forceinline__ uint64_t ResidualRowBytes(const RmsNormLaunchArgs& a) {
  return static_cast<uint64_t>(a.row_vectors) * ResidualLanes<D, R>::kBytes;
}

// Row `group` of a [groups, hidden] scale vector.
__device__ __forceinline__ const float* GroupRow(const float* vectors, int group, int hidden) {
  return vectors + static_cast<size_t>(group) * hidden;
}

// t += bias (lanes of vector i of this row's group), when there is a bias.
template <int kLanes>
__device__ __forceinline__ void AddBias(const RmsNormLaunchArgs& a, int group, int hidden, int i,
                                        float* t) {
  if (a.bias == nullptr) return;
  float b[kLanes];
  LoadFloatLanes<kLanes>(GroupRow(a.bias, group, hidden), i, b);
#pragma unroll
  for (int j = 0; j < kLanes; ++j) t[j] = __fadd_rn(t[j], b[j]);
}

// Which of its block's rows at once this thread works on: threadIdx.x /
// threads_per_row (a power of two) by a shift; a 32-bit division is some
// twenty instructions, which the row sum waited for after the last packet.
// The lane within the row (RowLane) is a mask for the same reason.
__device__ __forceinline__ int RowInBlock(int threads_per_row) {
  return static_cast<int>(threadIdx.x) >> (__ffs(threads_per_row) - 1);
}

// This thread's place among its row's threads: within its block, or, where
// a row spans a cluster of blocks (kCluster), within the cluster (block r
// holds threads r * blockDim.x ... of the row). kCluster is a template
// argument so that kernels of one-block rows carry none of this.
template <bool kCluster>
__device__ __forceinline__ int RowLane(const RmsNormLaunchArgs& a) {
  if constexpr (kCluster) {
    return static_cast<int>(blockIdx.x % a.blocks_per_row * blockDim.x + threadIdx.x);
  } else {
    return static_cast<int>(threadIdx.x) & (a.threads_per_row - 1);
  }
}

// Slots of a clustered row (ClusterRowSum): one for each of its sums
// (post-norm and norm).
inline constexpr int kRowSumSlots = 2;
// Partials' buffers of the fused one-shot's blocks of rows: the block's
// turns take them in alternation, so that a block of one row needs no
// barrier after its sum (InverseRmsOfRow, kAlternatingScratch).
inline constexpr int kBlockRowSumBuffers = 2;

// Where a row's threads meet to sum: warp partials in the block's shared
// memory (one BlockRowSums), or, for a row that spans a cluster, its
// kRowSumSlots slots.
template <bool kCluster>
using RowSumScratch = std::conditional_t<kCluster, ClusterRowSumSlot, BlockRowSums>;

// How many sums of squares a thread of kVectors vectors keeps: rows of two
// vectors a thread (PlanFusedRow: 513-1024 vectors) sum each vector apart,
// as the one-vector threads of the fused one-shot's clusters hold them
// (PlanFusedClusterRow), so that a row's result does not depend on the
// plan its launch took (row_norm.cuh RowSumOfVectors); rows of more
// vectors never cluster.
template <int kVectors>
inline constexpr int kSquareSums = kVectors == 2 ? 2 : 1;

// The inverse RMS of this thread's row from its float32 sums of squares
// (one per vector with kSums 2, as RowSumOfVectors adds them), over its
// block's threads or, for a row that spans a cluster (kCluster: one vector
// a thread), over the cluster's. A row that float32 cannot serve
// (FloatInverseRms: a sum that overflowed, a mean + eps near underflow,
// NaN) is summed again in double, wide_sums(double (&)[kSums]) giving this
// thread's sums, and takes the CPU's formula; the rows of a block (of a
// cluster) decide together, as their barriers require, and a row that
// float32 serves keeps its float32 result either way, so that no row's
// result depends on its neighbours or on the plan. Every thread of the
// block (of the cluster, with kCluster) must call it together. `nth` (0 or
// 1) is which of the row's sums this is: a clustered row takes the nth of
// its kRowSumSlots slots in `scratch`, a one-block row the block's
// partials.
template <bool kCluster, bool kAlternatingScratch, int kSums, typename WideSums>
__device__ __forceinline__ float InverseRmsOfRow(const RmsNormLaunchArgs& a,
                                                 const float (&sums)[kSums], int hidden,
                                                 int lane, RowSumScratch<kCluster>* scratch,
                                                 int nth, WideSums&& wide_sums) {
  const int tpr = a.threads_per_row;
  float inv;
  bool served;
  bool all_served;
  if constexpr (kCluster) {
    static_assert(kSums == 1, "clustered rows hold one vector a thread");
    served = FloatInverseRms(ClusterRowSum(sums[0], tpr, lane, scratch[nth]), hidden, a.eps, inv);
    all_served = served;  // one row a cluster, whose blocks add the same sums alike
  } else {
    const float total =
        RowSumOfVectors</*kPartialsReused=*/false>(sums, tpr, lane, RowInBlock(tpr),
                                                   scratch->sums);
    served = FloatInverseRms(total, hidden, a.eps, inv);
    // Rows within a warp decide by warp; wider rows by block, whose barrier
    // also lets the next row a block takes write the partials again. A
    // block that is one row's alone decides without it where its caller
    // alternates two partials' buffers between sums (kAlternatingScratch):
    // every thread added the same partials in the same order, so `served`
    // is the block's already; and the sum two turns on, the next to write
    // this buffer, writes it after the next sum's barrier, which every
    // thread passes only after its reads here.
    all_served = kSums == 1 && tpr <= 32 ? __all_sync(0xffffffffu, served)
                 : kAlternatingScratch && tpr == static_cast<int>(blockDim.x)
                     ? served
                     : __syncthreads_and(served) != 0;
  }
  if (all_served) return inv;
  double wide[kSums];
  wide_sums(wide);
  double total;
  if constexpr (kCluster) {
    total = ClusterRowSumWide(wide[0], tpr, lane, scratch[nth]);
  } else {
    total = RowSumOfVectors</*kPartialsReused=*/true>(wide, tpr, lane, RowInBlock(tpr),
                                                      scratch->wide);
  }
  return served ? inv : InverseRmsOfSumOfSquares(total, static_cast<size_t>(hidden), a.eps);
}

// Row `row`'s group (of the launch; `active`: a row of the call): its row
// of gamma, post_gamma and bias. One group unless vmap stacked several,
// and then no division (the kernels run at their register limit: a 32-bit
// division, kept out of the common path; a call's rows fit 32 bits, the
// handler checks).
__device__ __forceinline__ int RowGroup(const RmsNormLaunchArgs& a, int64_t row, bool active) {
  return a.groups > 1 && active ? static_cast<int>(static_cast<uint32_t>(a.first_row + row) /
                                                   static_cast<uint32_t>(a.rows_per_group))
                                : 0;
}

// y = (v * inv_rms) * gamma, lane by lane in float32: the norm's last step,
// which the LL two-shot's readers repeat from residual_out and the owner's
// inverse RMS, bit for bit.
template <int kLanes>
__device__ __forceinline__ void NormalizeLanes(const float* v, float inv_rms, const float* g,
                                               float* y) {
#pragma unroll
  for (int j = 0; j < kLanes; ++j) y[j] = __fmul_rn(__fmul_rn(v[j], inv_rms), g[j]);
}

// The norm of the row this thread works on, after the sum over ranks: for
// each of its vectors i of row `row` (when `active`), reduce(k, i, t) puts
// the float32 sum over ranks of vector i (the k-th of this thread) in t;
// the bias is added, the post-norm applied, the residual added, and the
// residual_out words (R rounded) go to emit_residual(i, words); the
// normalized lanes go to emit_out(i, y). The first kEarlyVectors vectors'
// residual and gamma words are loaded before the first reduce (below).
// Every thread of the block (of the cluster, with kCluster) must call it
// together (InverseRmsOfRow synchronizes); with kCluster once a launch,
// after every block of the cluster started (ClusterRowSum: a slot takes one
// sum). Returns the row's inverse RMS (of the norm, not the post-norm).
template <Dtype D, Dtype R, bool kPostNorm, int kVectors, bool kCluster, int kEarlyVectors,
          bool kAlternatingScratch = false, typename Reduce, typename EmitResidual,
          typename EmitOut>
__device__ __forceinline__ float NormalizeReducedRow(const RmsNormLaunchArgs& a, int64_t row,
                                                    bool active, RowSumScratch<kCluster>* scratch,
                                                    Reduce&& reduce,
                                                    EmitResidual&& emit_residual,
                                                    EmitOut&& emit_out) {
  using RL = ResidualLanes<D, R>;
  constexpr int kLanes = Vec<D>::kLanes;
  const int tpr = a.threads_per_row;
  const int lane = RowLane<kCluster>(a);
  const int hidden = a.row_vectors * kLanes;
  const int group = RowGroup(a, row, active);
  // The first kEarlyVectors vectors' residual and gamma words are read
  // before the first reduce, so that their latency hides behind the
  // exchange (one-shot) or the peers' loads (two-shot); the others' when
  // needed. Which kernels hold how many: all_reduce_rms_norm_kernels.cu.
  static_assert(kEarlyVectors >= 0 && kEarlyVectors <= kVectors);
  constexpr int kEarly = kEarlyVectors > 0 ? kEarlyVectors : 1;  // arrays of at least one
  uint4 early_residual[kEarly][RL::kWords];
  float early_gamma[kEarly][kLanes];
#pragma unroll
  for (int k = 0; k < kEarlyVectors; ++k) {
    const int i = lane + k * tpr;
    if (active && i < a.row_vectors) {
      RL::Load(RowOf(a.residual, row, ResidualRowBytes<D, R>(a)), i, early_residual[k]);
      LoadFloatLanes<kLanes>(GroupRow(a.gamma, group, hidden), i, early_gamma[k]);
    }
  }
  // Rows are kept as the stored residual stream in between (half the
  // registers of float lanes for 16-bit types when R is x's type).
  uint4 stored[kVectors][RL::kWords];
  constexpr int kSums = kSquareSums<kVectors>;
  float sum_of_squares[kSums] = {};
  const auto add_residual = [&](int k, int i, float* t) {
    uint4 words[RL::kWords];
    float r[kLanes];
    if (k < kEarlyVectors) {
#pragma unroll
      for (int q = 0; q < RL::kWords; ++q) words[q] = early_residual[k < kEarly ? k : 0][q];
    } else {
      RL::Load(RowOf(a.residual, row, ResidualRowBytes<D, R>(a)), i, words);
    }
    RL::Unpack(words, r);
#pragma unroll
    for (int j = 0; j < kLanes; ++j) t[j] = __fadd_rn(t[j], r[j]);
    RL::Pack(t, stored[k]);
    RL::Unpack(stored[k], r);  // the norm reads what residual_out holds
    AddSquares<kLanes>(r, sum_of_squares[kSums == 1 ? 0 : k]);
    emit_residual(i, stored[k]);
  };
  // A row's squares again, in double, for InverseRmsOfRow's rare rows that
  // float32 cannot serve; lanes_of(k, v) puts vector k's float lanes in v.
  const auto wide_sums_of = [&](auto&& lanes_of) {
    return [&, lanes_of](double (&wide)[kSums]) {
#pragma unroll
      for (int q = 0; q < kSums; ++q) wide[q] = 0.0;
#pragma unroll
      for (int k = 0; k < kVectors; ++k) {
        const int i = lane + k * tpr;
        if (!active || i >= a.row_vectors) continue;
        float v[kLanes];
        lanes_of(k, v);
        AddSquares<kLanes>(v, wide[kSums == 1 ? 0 : k]);
      }
    };
  };
  if constexpr (kPostNorm) {
    float t[kVectors][kLanes];
    float post_sum_of_squares[kSums] = {};
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      const int i = lane + k * tpr;
      if (!active || i >= a.row_vectors) continue;
      reduce(k, i, t[k]);
      AddBias<kLanes>(a, group, hidden, i, t[k]);
      AddSquares<kLanes>(t[k], post_sum_of_squares[kSums == 1 ? 0 : k]);
    }
    const float post_inv_rms = InverseRmsOfRow<kCluster, false>(
        a, post_sum_of_squares, hidden, lane, scratch, 0, wide_sums_of([&](int k, float* v) {
#pragma unroll
          for (int j = 0; j < kLanes; ++j) v[j] = t[k][j];
        }));
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      const int i = lane + k * tpr;
      if (!active || i >= a.row_vectors) continue;
      float g[kLanes];
      LoadFloatLanes<kLanes>(GroupRow(a.post_gamma, group, hidden), i, g);
#pragma unroll
      for (int j = 0; j < kLanes; ++j) t[k][j] = __fmul_rn(__fmul_rn(t[k][j], post_inv_rms), g[j]);
      add_residual(k, i, t[k]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      const int i = lane + k * tpr;
      if (!active || i >= a.row_vectors) continue;
      float t[kLanes];
      reduce(k, i, t);
      AddBias<kLanes>(a, group, hidden, i, t);
      add_residual(k, i, t);
    }
  }
  // A post-norm's two sums share one buffer: their barrier stays.
  const float inv_rms = InverseRmsOfRow<kCluster, kAlternatingScratch && !kPostNorm>(
      a, sum_of_squares, hidden, lane, scratch, kPostNorm ? 1 : 0,
      wide_sums_of([&](int k, float* v) { RL::Unpack(stored[k], v); }));
#pragma unroll
  for (int k = 0; k < kVectors; ++k) {
    const int i = lane + k * tpr;
    if (!active || i >= a.row_vectors) continue;
    float v[kLanes], g[kLanes], y[kLanes];
    RL::Unpack(stored[k], v);
    if (k < kEarlyVectors) {
#pragma unroll
      for (int j = 0; j < kLanes; ++j) g[j] = early_gamma[k < kEarly ? k : 0][j];
    } else {
      LoadFloatLanes<kLanes>(GroupRow(a.gamma, group, hidden), i, g);
    }
    NormalizeLanes<kLanes>(v, inv_rms, g, y);
    emit_out(i, y);
  }
  return inv_rms;
}

}  // namespace jax_ar::gpu
