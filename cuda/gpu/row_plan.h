// How the CUDA norm kernels (jax_ar.rms_norm's and the fused
// all_reduce_rms_norm's) spread a row over threads: a power-of-two group of
// threads per row, each holding up to kMaxVectorsPerThread 16-byte vectors of
// it, and at least kMinBlockThreads threads per block (several rows per
// block when rows are short). How a row's threads add its squares depends
// on the row length alone, so a row's result never depends on how many rows
// a call has (the fused one-shot may spread a row's threads over a cluster
// of blocks for a launch of few rows, adding in the same order), and every
// rank of the fused kernel plans alike. Plain C++: host code of both kernels
// reads it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/norm_limits.h"

namespace jax_ar::gpu {

inline constexpr int kMaxVectorsPerThread = 4;  // the kernels are instantiated for 1..4
inline constexpr int kMaxThreadsPerRow = 1024;
/// Warp sums of the widest row: the slots a row's partial sums take.
inline constexpr int kMaxWarpsPerRow = kMaxThreadsPerRow / 32;
inline constexpr int kMinBlockThreads = 256;
/// The longest row (in 16-byte vectors) a plan holds.
inline constexpr int kMaxRowVectors = kMaxThreadsPerRow * kMaxVectorsPerThread;
static_assert(kFusedMaxHidden * sizeof(float) / kNormVectorBytes <= kMaxRowVectors,
              "the fused kernel's longest float32 row must fit a row plan");

// The two kernels want different loads per thread before a row's group
// widens, so they plan with different `vectors_per_thread_wanted`:
//   kFusedVectorsPerThread    the fused kernel also holds partial sums over
//                             ranks and LL packets: registers are its limit
//                             (docs/gpu.md; PlanFusedRow below);
//   kRmsNormVectorsPerThread  rms_norm.cu loads gamma beside the row, and
//                             two vectors per thread keep enough bytes in
//                             flight (measured, docs/rms_norm.md).
inline constexpr int kFusedVectorsPerThread = 1;
inline constexpr int kRmsNormVectorsPerThread = 2;

struct RowPlan {
  int threads_per_row;     // power of two, at most kMaxThreadsPerRow
  int vectors_per_thread;  // 1..kMaxVectorsPerThread for rows up to kMaxRowVectors
  int rows_per_block;      // rows a block works on at once
  int blocks_per_row = 1;  // > 1: a row's threads span a cluster of blocks

  constexpr int block_threads() const {
    return threads_per_row * rows_per_block / blocks_per_row;
  }
};

/// Widens the group until each thread holds at most
/// `vectors_per_thread_wanted` vectors or the group has `max_threads`.
inline constexpr RowPlan PlanRow(int row_vectors, int vectors_per_thread_wanted,
                                 int max_threads = kMaxThreadsPerRow) {
  int threads = 1;
  while (threads * vectors_per_thread_wanted < row_vectors && threads < max_threads) {
    threads *= 2;
  }
  return {threads, (row_vectors + threads - 1) / threads, std::max(1, kMinBlockThreads / threads)};
}

// The fused kernel's blocks: its instances for one or two vectors a thread
// are built for kFusedNarrowThreads threads (one block an SM), which leaves
// them 128 registers; built for 1024 threads (64 registers) they spilled
// 144-196 bytes a thread between a peer's packets and the sum and ran
// 1.2-2.5 us a call slower at 2-8 ranks (2026-12-02, docs/latency_log.md). Rows of
// more than 2 * kFusedNarrowThreads vectors (float32 rows over 4096) take
// four a thread in groups of up to kMaxThreadsPerRow.
inline constexpr int kFusedNarrowThreads = 512;
inline constexpr int FusedMaxThreads(int vectors_per_thread) {
  return vectors_per_thread <= 2 ? kFusedNarrowThreads : kMaxThreadsPerRow;
}

/// The fused kernel's plan: one vector a thread up to kFusedNarrowThreads
/// vectors, then two, then four (vectors_per_thread 3 runs the four-vector
/// kernel with lanes past the row idle).
inline constexpr RowPlan PlanFusedRow(int row_vectors) {
  for (int vectors = kFusedVectorsPerThread; vectors <= 2; ++vectors) {
    if (row_vectors <= vectors * kFusedNarrowThreads) {
      return PlanRow(row_vectors, vectors, kFusedNarrowThreads);
    }
  }
  return PlanRow(row_vectors, kMaxVectorsPerThread);
}
// The plan of the fused kernels over LL packets for a launch whose rank
// reduces `rows` rows (the one-shot: every row; the LL two-shot: a group's
// rows): where every such row can have a cluster of blocks of its own
// within `block_cap` blocks, one
// vector a thread, the row's threads (a power of two, up to
// kMaxThreadsPerRow) spread over the cluster's blocks: blocks of
// kMinClusterBlockThreads threads where those clusters fit, else of twice
// as many, up to kMaxClusterBlockThreads. Otherwise PlanFusedRow's. The
// blocks sum the row's squares through distributed shared memory in the
// order one block adds them (row_norm.cuh ClusterRowSum), and threads of
// two vectors add them as two threads of one would (RowSumOfVectors), so a
// row's result is the same either way. Measured on the H200 (docs/latency_log.md
// "Latency, sixth push" and "seventh push"): where each row has its own
// cluster, calls ran 7-48% faster than one block a row (hidden 4096 and
// 8192, 1-16 tokens, 2-8 ranks); clusters whose rows took turns on the
// capped grid ran up to 2.5x slower at 8-128 tokens. Against 128-thread
// blocks, 64-thread ones ran 5-9% faster at 8 ranks and one token, 3-5% at
// 4 ranks and hidden 8192, and within 3% either way at 2 ranks (two device
// sessions). Where neither fits the cap, clusters of two 256-thread blocks
// ran 5-17% faster than one 512-thread block a row (hidden 4096 at 32 / 16
// / 8 tokens and 2 / 4 / 8 ranks: 7.34 -> 6.98, 10.69 -> 9.69, 17.20 ->
// 15.61 us; hidden 8192 likewise: 11.42 -> 9.70, 17.75 -> 15.78, 31.60 ->
// 26.36; "Latency, tenth push"; 7-15% in the same cells in the next
// session, "eleventh push"). Rows of 513-1024 vectors (hidden 8192 in
// 16-bit types) take one vector a thread over 1024 threads where they took
// two over 512 ("sixteenth push"): with a cluster a row, 1-16 tokens ran
// 0.3-1.2 / 0.5-1.7 / 0.9-3.1 us faster at 2 / 4 / 8 ranks; where a row
// takes two 512-thread blocks, 0.3-0.8 us slower at 2 ranks (32 tokens)
// than two 256-thread blocks of two vectors a thread and 0.4-1.0 us faster
// at 8 ranks. Two vectors a thread in smaller clusters ran up to 4.3 us
// slower (0.1-1.0 at 2 ranks). The LL two-shot took one block a group row
// until 2026-12-05: with clusters (and phase 1 carrying residual_out and
// the row's inverse RMS instead of both outputs) it ran 0.34-0.80x its
// time at 16-512 KB, hidden 4096 and 8192, 2, 4 and 8 ranks (one H100,
// docs/latency_log.md "Latency, thirty-third push").
inline constexpr int kMinClusterBlockThreads = 64;
inline constexpr int kMaxClusterBlockThreads = kFusedNarrowThreads;
inline constexpr int kMaxClusterBlocks = 8;  // the portable cluster size
inline constexpr RowPlan PlanFusedClusterRow(int row_vectors, int64_t rows, int block_cap) {
  const RowPlan plan = PlanFusedRow(row_vectors);
  if (plan.rows_per_block != 1 || plan.vectors_per_thread > 2) return plan;
  const int threads_per_row = PlanRow(row_vectors, 1).threads_per_row;
  for (int threads = kMinClusterBlockThreads; threads <= kMaxClusterBlockThreads; threads *= 2) {
    const int blocks = threads_per_row / threads;
    if (blocks >= 2 && blocks <= kMaxClusterBlocks && rows * blocks <= block_cap) {
      return {threads_per_row, 1, 1, blocks};
    }
  }
  return plan;
}
static_assert(PlanFusedClusterRow(512, 1, 16).blocks_per_row == 512 / kMinClusterBlockThreads &&
                  PlanFusedClusterRow(512, 1, 16).block_threads() == kMinClusterBlockThreads &&
                  PlanFusedClusterRow(512, 4, 16).blocks_per_row == 4 &&
                  PlanFusedClusterRow(512, 4, 16).block_threads() == 128 &&
                  PlanFusedClusterRow(512, 8, 16).blocks_per_row == 2 &&
                  PlanFusedClusterRow(512, 8, 16).block_threads() == 256 &&
                  PlanFusedClusterRow(512, 9, 16).blocks_per_row == 1 &&
                  PlanFusedClusterRow(512, 64, 16).blocks_per_row == 1 &&
                  PlanFusedClusterRow(1024, 1, 16).threads_per_row == kMaxThreadsPerRow &&
                  PlanFusedClusterRow(1024, 1, 16).vectors_per_thread == 1 &&
                  PlanFusedClusterRow(1024, 1, 16).block_threads() == 128 &&
                  PlanFusedClusterRow(1024, 8, 16).block_threads() == kMaxClusterBlockThreads &&
                  PlanFusedClusterRow(1024, 9, 16).threads_per_row == kFusedNarrowThreads &&
                  PlanFusedClusterRow(1024, 9, 16).vectors_per_thread == 2 &&
                  PlanFusedClusterRow(2048, 1, 64).blocks_per_row == 1,
              "fused one-shot clusters: one vector a thread, a cluster a row within the cap, "
              "of the smallest blocks that fit; else PlanFusedRow's");
static_assert(PlanFusedRow(512).vectors_per_thread == 1 && PlanFusedRow(513).vectors_per_thread == 2 &&
                  PlanFusedRow(1024).threads_per_row == kFusedNarrowThreads &&
                  PlanFusedRow(1025).vectors_per_thread == 3 &&
                  PlanFusedRow(kMaxRowVectors).threads_per_row == kMaxThreadsPerRow,
              "fused row plans: 1 vector a thread to 512 vectors, 2 to 1024, then 3-4");

}  // namespace jax_ar::gpu
