// The inverse RMS of a row, as the CUDA norm kernels compute it: each thread
// adds the squares of its lanes, the threads of the row sum their partial
// sums (warp shuffles, then shared memory for rows wider than a warp, or the
// shared memory of a cluster's blocks), and a formula turns the sum into
// 1 / sqrt(mean + eps). rms_norm.cu sums in double and takes the CPU's
// formula (common/inverse_rms.h); the fused kernels
// (all_reduce_rms_norm_kernels.cu, fused_norm_row.cuh) sum in float32 and
// take the double path only for a row whose float32 sum is out of range
// (FloatInverseRms).
#pragma once

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "common/inverse_rms.h"
#include "gpu/row_plan.h"

namespace jax_ar::gpu {

/// sum += v[j] * v[j] for the kLanes lanes, in double: float32 squares are
/// exact in double, so this adds what the CPU adds.
template <int kLanes>
__device__ __forceinline__ void AddSquares(const float* v, double& sum) {
#pragma unroll
  for (int j = 0; j < kLanes; ++j) {
    const double x = static_cast<double>(v[j]);
    sum = __fma_rn(x, x, sum);
  }
}

/// The same in float32 (one rounding a lane: fused multiply-add).
template <int kLanes>
__device__ __forceinline__ void AddSquares(const float* v, float& sum) {
#pragma unroll
  for (int j = 0; j < kLanes; ++j) sum = __fmaf_rn(v[j], v[j], sum);
}

/// The smallest mean + eps whose float32 inverse RMS FloatInverseRms
/// trusts: squares below 2^-126 lose bits (subnormal), at most 2^-150 each,
/// so over a row of up to 2^14 elements the mean is off by at most 2^-150,
/// 2^-50 of this bound.
inline constexpr float kMinFloatMeanPlusEps = 0x1p-100f;

/// 1 / sqrt(total / hidden + eps) in float32 (rsqrtf, at most 2 ulp) into
/// `inv`, from a float32 sum of squares; false where float32 cannot be
/// trusted with it: the sum overflowed (squares above 3.4e38, values above
/// about 1.8e19), or the mean + eps is below kMinFloatMeanPlusEps (an eps
/// under 2^-100 and a row of values under about 1e-15), or NaN. The caller
/// then sums the row in double (InverseRmsOfSumOfSquares), as the CPU does.
/// In float32 the row's tail (squares, warp sums, the exchange between
/// warps or blocks, the inverse) costs less: the fused one-shot ran
/// 0.89-1.00x its double-sum time and the fused two-shot 0.97-1.01x
/// (hidden 4096, 16 and 256 KB, 2, 4 and 8 ranks, one H100;
/// docs/latency_log.md "Latency, thirty-first push").
__device__ __forceinline__ bool FloatInverseRms(float total, int hidden, float eps, float& inv) {
  const float mean_plus_eps = __fadd_rn(__fdiv_rn(total, static_cast<float>(hidden)), eps);
  inv = rsqrtf(mean_plus_eps);
  return total <= FLT_MAX && mean_plus_eps >= kMinFloatMeanPlusEps;
}

/// Sum of `value` over groups of `width` (a power of two, at most 32)
/// neighbouring lanes of a warp, every lane of the group left holding it,
/// added in the same butterfly order by every row sum below.
template <typename T>
__device__ __forceinline__ T WarpSum(T value, int width) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    // Every level shuffles and only the add depends on the width: a
    // shuffle under a branch on a width known at run time (RowSum's) cost
    // a branch and a convergence check a level after the last packet.
    const T other = __shfl_xor_sync(0xffffffffu, value, offset);
    if (offset < width) value += other;
  }
  return value;
}

/// partials[0] + partials[1] + ... + partials[count - 1], added one at a
/// time from 0 in that order, the order of every row sum here. float32
/// partials of 4, 8, 16 or 32 warps (16-byte aligned, as the callers' are)
/// are read 16 bytes at a time, every load issued before the first add
/// (a loop of unknown length may wait for each load in turn). With
/// the one-row blocks' single barrier (fused_norm_row.cuh), the fused
/// one-shot ran 0.2-0.4 us a call faster at 2 ranks 512 KB and 4 ranks
/// 256 and 512 KB, 0.2-1.1 at 8 ranks 512 KB, and as fast elsewhere
/// (hidden 4096, one H100; docs/latency_log.md "Latency, thirty-ninth
/// push").
template <int kQuads>
__device__ __forceinline__ float SumQuadsInOrder(const float* partials) {
  float4 quads[kQuads];
#pragma unroll
  for (int i = 0; i < kQuads; ++i) quads[i] = reinterpret_cast<const float4*>(partials)[i];
  float total = 0;
#pragma unroll
  for (int i = 0; i < kQuads; ++i) {
    total += quads[i].x;
    total += quads[i].y;
    total += quads[i].z;
    total += quads[i].w;
  }
  return total;
}
template <typename T>
__device__ __forceinline__ T SumInOrder(const T* partials, int count) {
  if constexpr (std::is_same_v<T, float>) {
    switch (count) {
      case 4: return SumQuadsInOrder<1>(partials);
      case 8: return SumQuadsInOrder<2>(partials);
      case 16: return SumQuadsInOrder<4>(partials);
      case 32: return SumQuadsInOrder<8>(partials);
      default: break;
    }
  }
  T total = 0;
  for (int i = 0; i < count; ++i) total += partials[i];
  return total;
}

/// The sum of a row's `warps` warp sums, stored at row_partials[0..warps)
/// by their warps' first lanes, in the row's warp order, once every warp of
/// the block stored its own. Every thread of the block must call this
/// together; with kPartialsReused it ends with a barrier, so that the same
/// threads may store into the partials again.
template <bool kPartialsReused, typename T>
__device__ __forceinline__ T SumWarpPartials(const T* row_partials, int warps) {
  __syncthreads();
  const T total = SumInOrder(row_partials, warps);
  if constexpr (kPartialsReused) __syncthreads();
  return total;
}

/// Sum of `value` over the threads_per_row threads (a power of two) of one
/// row. `lane` is this thread's place in the row's group, `row` the group's
/// place among the rows its block works on at once. Groups wider than a warp
/// (whole warps then) meet in `partials`, threads_per_row / 32 slots per row
/// of the block: every thread of the block must call this together. With
/// kPartialsReused it ends with a barrier, so that a next call of the same
/// threads may write `partials` again.
template <bool kPartialsReused, typename T>
__device__ __forceinline__ T RowSum(T value, int threads_per_row, int lane, int row, T* partials) {
  value = WarpSum(value, threads_per_row < 32 ? threads_per_row : 32);
  if (threads_per_row <= 32) return value;
  const int warps = threads_per_row / 32;
  T* row_partials = partials + row * warps;
  if (lane % 32 == 0) row_partials[lane / 32] = value;
  return SumWarpPartials<kPartialsReused>(row_partials, warps);
}

/// RowSum of a row whose threads each hold the sums of kSums of its
/// vectors, sums[k] that of vector lane + k * threads_per_row: added as a
/// row of kSums * threads_per_row threads of one vector each adds them
/// (each warp's 32 in RowSum's butterfly, then the warps in the row's
/// order), so that a row's sum does not depend on how many vectors its
/// threads hold. threads_per_row is whole warps, and the row's
/// kSums * threads_per_row / 32 warp sums fit `partials`; every thread of
/// the block must call this together.
template <bool kPartialsReused, int kSums, typename T>
__device__ __forceinline__ T RowSumOfVectors(const T (&sums)[kSums], int threads_per_row, int lane,
                                             int row, T* partials) {
  if constexpr (kSums == 1) {
    return RowSum<kPartialsReused>(sums[0], threads_per_row, lane, row, partials);
  } else {
    const int warps = kSums * threads_per_row / 32;
    T* row_partials = partials + row * warps;
#pragma unroll
    for (int k = 0; k < kSums; ++k) {
      const T value = WarpSum(sums[k], 32);
      if (lane % 32 == 0) row_partials[(lane + k * threads_per_row) / 32] = value;
    }
    return SumWarpPartials<kPartialsReused>(row_partials, warps);
  }
}

// A cluster barrier in two halves. A kernel whose blocks store into each
// other's shared memory (ClusterRowSum) arrives at its start and waits
// before its first such store, since a block's shared memory (and the
// barrier the stores complete on) exists only once it runs; the blocks of a
// cluster are scheduled together, so the wait, after the exchange, should
// find every arrival there. Relaxed: the arrival publishes no memory but
// the barriers' initialization (FenceRowSumSlotsReady).
__device__ __forceinline__ void ClusterArriveRelaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
// The arrival that publishes this thread's earlier stores (into other
// blocks' shared memory too) to whoever passes the wait after it
// (ClusterRowSumWide).
__device__ __forceinline__ void ClusterArriveRelease() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
// Acquire (PTX's default for the wait).
__device__ __forceinline__ void ClusterWait() {
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

/// Where one ClusterRowSum lands in each block of the cluster: the row's
/// float32 warp sums, in the row's warp order, and the transaction barrier
/// (an mbarrier) their stores complete on; and where the same row's double
/// warp sums land when float32 cannot serve it (ClusterRowSumWide).
struct ClusterRowSumSlot {
  alignas(16) float sums[kMaxWarpsPerRow];  // SumInOrder's 16-byte loads
  uint64_t arrived;
  double wide[kMaxWarpsPerRow];
};

/// A block's partial sums for RowSum and RowSumOfVectors (rows within one
/// block): float32, and double for rows that float32 cannot serve.
struct BlockRowSums {
  // A row's partials start at a multiple of its warps: 16-byte aligned
  // for the warp counts SumInOrder reads 16 bytes at a time.
  alignas(16) float sums[kMaxWarpsPerRow];
  double wide[kMaxWarpsPerRow];
};

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// The address of `p` (this block's shared memory) in block `block` of the
/// cluster, for stores into that block's copy.
__device__ __forceinline__ uint32_t ClusterAddress(const void* p, int block) {
  uint32_t theirs;
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(theirs) : "r"(SharedAddress(p)), "r"(block));
  return theirs;
}

/// Readies this block's `slot` for one ClusterRowSum of a row of `warps`
/// warps: its barrier completes once `warps` float32 sums have landed. One
/// thread of the block calls it for each slot, then FenceRowSumSlotsReady,
/// before the block's ClusterArriveRelaxed.
__device__ __forceinline__ void ReadyRowSumSlot(ClusterRowSumSlot& slot, int warps) {
  const uint32_t bar = SharedAddress(&slot.arrived);
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
               "r"(static_cast<uint32_t>(warps * sizeof(float)))
               : "memory");
}
/// Makes the barriers ReadyRowSumSlot set up visible to the cluster's
/// blocks once they see this block's cluster arrival.
__device__ __forceinline__ void FenceRowSumSlotsReady() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/// Every block of a launch whose rows span clusters, first thing: thread 0
/// readies the block's `count` slots for rows of `warps` warps, and the
/// block arrives at the cluster barrier whose wait (ClusterWait) comes
/// before its first store into another block's slots.
__device__ __forceinline__ void ReadyClusterRowSums(ClusterRowSumSlot* slots, int count,
                                                    int warps) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < count; ++s) ReadyRowSumSlot(slots[s], warps);
    FenceRowSumSlotsReady();
  }
  ClusterArriveRelaxed();
}

/// RowSum of a row whose threads span the blocks of a cluster (block r of
/// the cluster holds the row's threads r * blockDim.x ...): lane q of every
/// warp stores the warp's sum into block q's `slot` at the warp's place in
/// the row, by an asynchronous store that completes its bytes on block q's
/// barrier; every block waits on its own barrier and adds its copy in the
/// row's warp order, as RowSum adds them within a block (the same sum, bit
/// for bit, as one block of the same threads_per_row). No load crosses
/// blocks and no cluster barrier is passed: the barrier's release ordered
/// every earlier store of the thread (the LL packets to peers among them)
/// before the sums, and the calls ran 0.3-1.2 us slower with it at 2 and 4
/// ranks (docs/latency_log.md "Latency, eighteenth push"). Every thread of the
/// cluster must call this together, after every block started and readied
/// `slot` (ReadyRowSumSlot, ClusterArriveRelaxed, ClusterWait); a slot
/// takes one sum a launch. No block leaves before the sums into its slots
/// have landed, and every block's stores into it precede that.
__device__ __forceinline__ float ClusterRowSum(float value, int threads_per_row, int lane,
                                               ClusterRowSumSlot& slot) {
  value = WarpSum(value, 32);  // a clustered row is whole warps
  const int warps = threads_per_row / 32;
  const int blocks = threads_per_row / static_cast<int>(blockDim.x);
  const int q = lane % 32;  // every lane of the warp holds its sum
  if (q < blocks) {
    const uint32_t theirs = ClusterAddress(slot.sums + lane / 32, q);
    const uint32_t their_bar = ClusterAddress(&slot.arrived, q);
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(
                     theirs),
                 "r"(__float_as_uint(value)), "r"(their_bar)
                 : "memory");
  }
  const uint32_t bar = SharedAddress(&slot.arrived);
  uint32_t landed = 0;
  while (!landed) {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
        : "=r"(landed)
        : "r"(bar)
        : "memory");
  }
  return SumInOrder(slot.sums, warps);
}

/// ClusterRowSum in double, for the rare row whose float32 sum cannot serve
/// (FloatInverseRms): lane q of every warp stores the warp's sum into block
/// q's `slot.wide`, a cluster barrier publishes them, and every block adds
/// its copy in the row's warp order. Every thread of the cluster must call
/// it together (a row's blocks decide alike: they hold the same float32
/// sum); a slot's `wide` takes one sum a launch.
__device__ __forceinline__ double ClusterRowSumWide(double value, int threads_per_row, int lane,
                                                    ClusterRowSumSlot& slot) {
  value = WarpSum(value, 32);
  const int warps = threads_per_row / 32;
  const int blocks = threads_per_row / static_cast<int>(blockDim.x);
  const int q = lane % 32;
  if (q < blocks) {
    asm volatile("st.shared::cluster.f64 [%0], %1;" ::"r"(ClusterAddress(slot.wide + lane / 32, q)),
                 "d"(value)
                 : "memory");
  }
  ClusterArriveRelease();
  ClusterWait();
  return SumInOrder(slot.wide, warps);
}

/// 1 / sqrt(mean(v * v) + eps) of a row of `hidden` elements, from this
/// thread's `sum_of_squares` (AddSquares) and those of the row's other
/// threads; arguments and contract as RowSum's.
template <bool kPartialsReused>
__device__ __forceinline__ float RowInverseRms(double sum_of_squares, int hidden, float eps,
                                               int threads_per_row, int lane, int row,
                                               double* partials) {
  const double total =
      RowSum<kPartialsReused>(sum_of_squares, threads_per_row, lane, row, partials);
  return InverseRmsOfSumOfSquares(total, static_cast<size_t>(hidden), eps);
}

}  // namespace jax_ar::gpu
