// What one launch of each protocol carries through a workspace of the CUDA
// backend: the numbers the handlers cut calls by, which the module's
// capacities() reports too (one source for both).
#pragma once

#include <cstdint>

#include "common/protocol.h"
#include "gpu/layout.h"

namespace jax_ar::gpu {

/// Bytes of one sender's slot in a data half: one-shot (LL region, a slot
/// per sender) or two-shot (plain region, a slot per sender and phase).
uint64_t SlotBytes(const DataLayout& layout, int world, Algorithm algorithm);

/// The largest packed range one all-reduce launch carries: one-shot packets
/// hold 8 data bytes in 16; two-shot fills a slot of each of `world` chunks.
uint64_t RoundCapacity(const DataLayout& layout, int world, Algorithm algorithm);

/// The kernels an all-reduce launch can run (all_reduce_kernels.cu): the
/// one-shot, and the two-shot over LL packets or over plain data and flags.
enum class AllReduceKernel { kOneShot, kTwoShotLL, kTwoShotPlain };

/// A kernel's slot size and what one launch of it carries (every rank
/// computes the same). Which kernel runs is the Python plan's choice (the
/// handler's algorithm code); the cost model knows all three.
struct KernelPlan {
  AllReduceKernel kernel;
  uint64_t slot_bytes;
  uint64_t capacity;
};
KernelPlan PlanKernel(const DataLayout& layout, int world, AllReduceKernel kernel);

/// One sender's share of a plain half: what the fused kernel's two-shot
/// layout divides into rows (common/fused_row_fit.h).
uint64_t SenderShare(const DataLayout& layout, int world);

/// Rows of `row_bytes` of x (residual_out rows of `residual_row_bytes`, out
/// rows of `out_row_bytes`) one fused launch of `algorithm` carries (kTwoShot
/// the plain two-shot, kTwoShotLL the two-shot over LL packets); 0 when not
/// one.
int64_t FusedRowsPerLaunch(const DataLayout& layout, int world, Algorithm algorithm,
                           uint64_t row_bytes, uint64_t residual_row_bytes,
                           uint64_t out_row_bytes);

/// The longest row of x (bytes) one fused launch of either algorithm
/// carries, with out rows as wide as x's (no FP8) and residual rows
/// `residual_factor` times as wide (fused_row_fit.h): the handler takes
/// rows up to it and refuses longer ones.
uint64_t MaxFusedRowBytes(const DataLayout& layout, int world, uint64_t residual_factor);

}  // namespace jax_ar::gpu
