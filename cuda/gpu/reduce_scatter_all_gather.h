// jax_ar.reduce_scatter and jax_ar.all_gather on CUDA devices: the launch
// arguments the kernels share with their handlers and the launch entry
// points. Plain structs and CUDA runtime calls only (nvcc reads it too).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/layout.h"

namespace jax_ar::gpu {

// One launch of a reduce-scatter or all-gather: bytes [offset, offset +
// bytes) of every rank's chunk. Chunks are `chunk_bytes` long (not
// necessarily a multiple of 16) and sit back to back: in the reduce-scatter
// operand (chunk j for rank j) and in the all-gather result (chunk j from
// rank j). Each sender's share of a launch lands in its slot of the
// receiver's data half (one slot per sender, `slot_bytes` each).
struct ChunkLaunchArgs : ProtocolArgs {
  const std::byte* in;
  std::byte* out;
  uint64_t chunk_bytes;
  uint64_t offset;             // within a chunk, a multiple of 16
  uint64_t bytes;              // of each chunk in this launch, at most slot_bytes
  uint64_t slot_bytes;
  uint64_t vectors_per_block;  // 16-byte vectors of `bytes` each block covers
  int32_t op;                  // ReduceOp (reduce-scatter)
  Dtype dtype;                 // reduce-scatter
};

cudaError_t LaunchReduceScatter(const ChunkLaunchArgs& args, int blocks, cudaStream_t stream);
cudaError_t LaunchAllGather(const ChunkLaunchArgs& args, int blocks, cudaStream_t stream);

// Loads the kernels of this file on the current device (see LoadKernels).
cudaError_t LoadReduceScatterAllGatherKernels();

inline constexpr int kChunkThreads = kTwoShotThreads;

}  // namespace jax_ar::gpu
