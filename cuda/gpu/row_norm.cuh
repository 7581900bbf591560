// The inverse RMS of a row, as both CUDA norm kernels (rms_norm.cu and
// all_reduce_rms_norm_kernels.cu) compute it: each thread adds the squares of
// its lanes in double, the threads of the row sum their partial sums (warp
// shuffles, then shared memory for rows wider than a warp), and the CPU's
// formula (common/inverse_rms.h) turns the sum into 1 / sqrt(mean + eps).
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "common/inverse_rms.h"

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

/// Sum of `value` over groups of `width` (a power of two, at most 32)
/// neighbouring lanes of a warp, every lane of the group left holding it,
/// added in the same butterfly order by every row sum below.
template <typename T>
__device__ __forceinline__ T WarpSum(T value, int width) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    if (offset < width) value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
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
  __syncthreads();
  T total = 0;
  for (int w = 0; w < warps; ++w) total += row_partials[w];
  if constexpr (kPartialsReused) __syncthreads();
  return total;
}

/// RowSum of a row whose threads span the blocks of a cluster (block r of
/// the cluster holds the row's threads r * blockDim.x ...): every warp's sum
/// goes to its block's `partials` at the warp's place in the row, and after
/// a cluster barrier every thread adds them all in the row's warp order
/// through distributed shared memory, as RowSum adds them within a block
/// (the same sum, bit for bit, as one block of the same threads_per_row).
/// Every thread of the cluster must call this together; it ends with a
/// cluster barrier, so that no block writes `partials` again or exits while
/// another still reads them.
template <typename T>
__device__ __forceinline__ T ClusterRowSum(T value, int threads_per_row, int lane, T* partials) {
  value = WarpSum(value, 32);  // a clustered row is whole warps
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int warps = threads_per_row / 32;
  const int warps_per_block = static_cast<int>(blockDim.x) / 32;
  if (lane % 32 == 0) partials[lane / 32] = value;
  cluster.sync();
  T total = 0;
  for (int w = 0; w < warps; ++w) {
    total += cluster.map_shared_rank(partials, w / warps_per_block)[w];
  }
  cluster.sync();
  return total;
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
