#include "gpu/capacity.h"

#include "common/fused_row_fit.h"

namespace jax_ar::gpu {

uint64_t SlotBytes(const DataLayout& layout, int world, Algorithm algorithm) {
  return algorithm == Algorithm::kOneShot ? AlignDown(layout.ll_half / world)
                                          : AlignDown(layout.plain_half / (2 * world));
}

uint64_t RoundCapacity(const DataLayout& layout, int world, Algorithm algorithm) {
  const uint64_t slot = SlotBytes(layout, world, algorithm);
  return algorithm == Algorithm::kOneShot ? AlignDown(slot / 2) : slot * world;
}

KernelPlan PlanKernel(const DataLayout& layout, int world, AllReduceKernel kernel) {
  switch (kernel) {
    case AllReduceKernel::kOneShot: {
      const uint64_t slot = SlotBytes(layout, world, Algorithm::kOneShot);
      return {kernel, slot, RoundCapacity(layout, world, Algorithm::kOneShot)};
    }
    case AllReduceKernel::kTwoShotLL: {
      // Two phases of `world` slots in an LL half; C data bytes take 2 C.
      const uint64_t slot = AlignDown(layout.ll_half / (2 * static_cast<uint64_t>(world)));
      return {kernel, slot, AlignDown(slot / 2) * world};
    }
    case AllReduceKernel::kTwoShotPlain:
      break;
  }
  return {AllReduceKernel::kTwoShotPlain, SlotBytes(layout, world, Algorithm::kTwoShot),
          RoundCapacity(layout, world, Algorithm::kTwoShot)};
}

uint64_t SenderShare(const DataLayout& layout, int world) { return layout.plain_half / world; }

int64_t FusedRowsPerLaunch(const DataLayout& layout, int world, Algorithm algorithm,
                           uint64_t row_bytes, uint64_t residual_row_bytes,
                           uint64_t out_row_bytes) {
  if (algorithm == Algorithm::kOneShot) {
    // Every sender's rows of x as LL packets (twice their bytes) in its
    // slot of the LL half.
    return static_cast<int64_t>(layout.ll_half / (static_cast<uint64_t>(world) * 2 * row_bytes));
  }
  if (algorithm == Algorithm::kTwoShotLL) {
    // A group row in a phase-1 slot: its inverse RMS (16 data bytes) and
    // residual_out words as packets (all_reduce_rms_norm_kernels.cu
    // Phase1Pairs: twice residual_row_bytes + 16); phase 0's rows of x take
    // no more (x is no wider than the residual).
    const uint64_t slot = PlanKernel(layout, world, AllReduceKernel::kTwoShotLL).slot_bytes;
    return static_cast<int64_t>(slot / (2 * (residual_row_bytes + 16))) * world;
  }
  return static_cast<int64_t>(FusedGroupRows(SenderShare(layout, world), row_bytes,
                                             residual_row_bytes, out_row_bytes)) *
         world;
}

uint64_t MaxFusedRowBytes(const DataLayout& layout, int world, uint64_t residual_factor) {
  return LongestFittingRow(layout.plain_half, [&](uint64_t row_bytes) {
    const uint64_t residual_row_bytes = residual_factor * row_bytes;
    return FusedRowsPerLaunch(layout, world, Algorithm::kOneShot, row_bytes, residual_row_bytes,
                              row_bytes) > 0 ||
           FusedRowsPerLaunch(layout, world, Algorithm::kTwoShot, row_bytes, residual_row_bytes,
                              row_bytes) > 0;
  });
}

}  // namespace jax_ar::gpu
