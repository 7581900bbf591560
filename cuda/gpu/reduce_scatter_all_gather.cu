// The reduce-scatter and all-gather kernels: the two halves of two-shot, on
// chunks laid out by jax_ar.reduce_scatter / jax_ar.all_gather.
//
// reduce-scatter  Each rank pushes its part of chunk j into slot `rank` of
//                 rank j's data half; each block then raises its flag at
//                 every peer (release) and waits for the same block of
//                 every peer (acquire); rank j reduces its chunk in rank
//                 order (its own part read straight from its input).
// all-gather      Each rank pushes its chunk into slot `rank` of every
//                 peer's data half, copies it into its own output, signals
//                 and waits the same way, then copies every peer's slot into
//                 that peer's place in its output.
//
// Both use the launch numbers, call headers, deadlines and failure paths of
// launch_protocol.cuh and the phase-0 flags of PeerControl, so they
// interleave freely with all-reduce launches of the same communicator. Data
// halves are reused as there: a rank that starts launch n + 2 has received
// every peer's data of launch n + 1, so no peer still reads launch n's half.
//
// Chunks need not start on 16-byte boundaries (a chunk is one row of the
// caller's array, any dtype): whole aligned vectors move with 16-byte
// accesses, the rest in 4-byte words or bytes.
#include <cuda_runtime.h>

#include "gpu/launch_protocol.cuh"
#include "gpu/load_kernels.h"
#include "gpu/numeric.cuh"
#include "gpu/reduce_scatter_all_gather.h"

namespace jax_ar::gpu {
namespace {

// Sender `sender`'s slot in rank `owner`'s data half for launches of parity
// `parity` (the one-shot layout: one slot per sender).
__device__ __forceinline__ std::byte* ChunkSlot(const ChunkLaunchArgs& a, int owner, int parity,
                                                int sender) {
  return PlainHalf(a, owner, parity) + static_cast<uint64_t>(sender) * a.slot_bytes;
}

__device__ __forceinline__ uint64_t ValidBytes(const ChunkLaunchArgs& a, uint64_t v) {
  const uint64_t rest = a.bytes - 16 * v;
  return rest < 16 ? rest : 16;
}

// `valid` (<= 16) bytes from p; the rest of the vector reads as zero.
__device__ __forceinline__ uint4 LoadPart(const std::byte* p, uint64_t valid) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  if (valid == 16 && (address & 15) == 0) return LoadInput16(p);
  uint32_t w[4] = {0, 0, 0, 0};
  if (((address | valid) & 3) == 0) {
    const auto* words = reinterpret_cast<const uint32_t*>(p);
    for (uint64_t k = 0; k < valid / 4; ++k) w[k] = words[k];
  } else {
    const auto* bytes = reinterpret_cast<const uint8_t*>(p);
    for (uint64_t k = 0; k < valid; ++k) w[k / 4] |= static_cast<uint32_t>(bytes[k]) << (8 * (k % 4));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Stores the first `valid` (<= 16) bytes of v at p.
__device__ __forceinline__ void StorePart(std::byte* p, uint4 v, uint64_t valid) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  if (valid == 16 && (address & 15) == 0) {
    Store16(p, v);
    return;
  }
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  if (((address | valid) & 3) == 0) {
    auto* words = reinterpret_cast<uint32_t*>(p);
    for (uint64_t k = 0; k < valid / 4; ++k) words[k] = w[k];
  } else {
    auto* bytes = reinterpret_cast<uint8_t*>(p);
    for (uint64_t k = 0; k < valid; ++k) bytes[k] = static_cast<uint8_t>(w[k / 4] >> (8 * (k % 4)));
  }
}

// Outputs of a launch that cannot run: all-ones bits, as launch_protocol.cuh
// says, over [p, p + bytes).
__device__ inline void FillOnes(std::byte* p, uint64_t bytes) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t k = blockIdx.x * blockDim.x + threadIdx.x; k < bytes; k += stride) {
    reinterpret_cast<uint8_t*>(p)[k] = 0xffu;
  }
}

// This block's vectors of the launch: [begin, end).
struct BlockRange {
  uint64_t begin, end;
};
__device__ __forceinline__ BlockRange VectorsOfBlock(const ChunkLaunchArgs& a) {
  const uint64_t vectors = (a.bytes + 15) / 16;
  const uint64_t begin = blockIdx.x * a.vectors_per_block;
  const uint64_t end = begin + a.vectors_per_block;
  return {begin < vectors ? begin : vectors, end < vectors ? end : vectors};
}

__global__ void __launch_bounds__(kChunkThreads)
    ReduceScatterKernel(const __grid_constant__ ChunkLaunchArgs a) {
  LaunchContext ctx;
  if (!StartLaunch(a, ctx, [&] { FillOnes(a.out + a.offset, a.bytes); })) return;
  const int parity = ctx.parity;
  Waiter waiter(a, ctx.launch);
  const BlockRange range = VectorsOfBlock(a);

  // My part of chunk j goes to rank j.
  for (int i = 1; i < a.world; ++i) {
    const int peer = PeerAfter(a, i);  // spread the first stores over peers
    const std::byte* src = a.in + static_cast<uint64_t>(peer) * a.chunk_bytes + a.offset;
    std::byte* dst = ChunkSlot(a, peer, parity, a.rank);
    for (uint64_t v = range.begin + threadIdx.x; v < range.end; v += blockDim.x) {
      Store16(dst + 16 * v, LoadPart(src + 16 * v, ValidBytes(a, v)));
    }
  }
  SignalPeers(a, 0, ctx.launch);
  if (WaitForPeers(a, 0, waiter)) {
    // Every rank's part of my chunk, reduced in rank order.
    const std::byte* own = a.in + static_cast<uint64_t>(a.rank) * a.chunk_bytes + a.offset;
    for (uint64_t v = range.begin + threadIdx.x; v < range.end; v += blockDim.x) {
      const uint64_t valid = ValidBytes(a, v);
      const uint4 mine = LoadPart(own + 16 * v, valid);
      uint4 result;
      DispatchAccumulator(a.dtype, a.op, [&](auto typed) {
        typed.AddRanks(a.world, [&](int s) {
          return s == a.rank ? mine : LoadShared16(ChunkSlot(a, a.rank, parity, s) + 16 * v);
        });
        result = typed.Result(a.op, a.world);
      });
      StorePart(a.out + a.offset + 16 * v, result, valid);
    }
    CheckHeader(a, waiter);
  }
  FinishLaunch(a, ctx);
}

__global__ void __launch_bounds__(kChunkThreads)
    AllGatherKernel(const __grid_constant__ ChunkLaunchArgs a) {
  LaunchContext ctx;
  const auto fill_outputs = [&] {
    for (int s = 0; s < a.world; ++s) {
      FillOnes(a.out + static_cast<uint64_t>(s) * a.chunk_bytes + a.offset, a.bytes);
    }
  };
  if (!StartLaunch(a, ctx, fill_outputs)) return;
  const int parity = ctx.parity;
  Waiter waiter(a, ctx.launch);
  const BlockRange range = VectorsOfBlock(a);

  // My chunk goes to every peer, and into my own output meanwhile.
  const std::byte* src = a.in + a.offset;
  for (int i = 1; i < a.world; ++i) {
    const int peer = PeerAfter(a, i);
    std::byte* dst = ChunkSlot(a, peer, parity, a.rank);
    for (uint64_t v = range.begin + threadIdx.x; v < range.end; v += blockDim.x) {
      Store16(dst + 16 * v, LoadPart(src + 16 * v, ValidBytes(a, v)));
    }
  }
  SignalPeers(a, 0, ctx.launch);
  std::byte* mine = a.out + static_cast<uint64_t>(a.rank) * a.chunk_bytes + a.offset;
  for (uint64_t v = range.begin + threadIdx.x; v < range.end; v += blockDim.x) {
    const uint64_t valid = ValidBytes(a, v);
    StorePart(mine + 16 * v, LoadPart(src + 16 * v, valid), valid);
  }
  if (WaitForPeers(a, 0, waiter)) {
    for (int i = 1; i < a.world; ++i) {
      const int owner = PeerAfter(a, i);
      const std::byte* slot = ChunkSlot(a, a.rank, parity, owner);
      std::byte* dst = a.out + static_cast<uint64_t>(owner) * a.chunk_bytes + a.offset;
      for (uint64_t v = range.begin + threadIdx.x; v < range.end; v += blockDim.x) {
        StorePart(dst + 16 * v, LoadShared16(slot + 16 * v), ValidBytes(a, v));
      }
    }
    CheckHeader(a, waiter);
  }
  FinishLaunch(a, ctx);
}

}  // namespace

cudaError_t LaunchReduceScatter(const ChunkLaunchArgs& args, int blocks, cudaStream_t stream) {
  ReduceScatterKernel<<<blocks, kChunkThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t LaunchAllGather(const ChunkLaunchArgs& args, int blocks, cudaStream_t stream) {
  AllGatherKernel<<<blocks, kChunkThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t LoadReduceScatterAllGatherKernels() {
  return LoadEach(ReduceScatterKernel, AllGatherKernel);
}

}  // namespace jax_ar::gpu
