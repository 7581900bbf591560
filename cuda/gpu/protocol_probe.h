// The per-call breakdown of the all-reduce (benchmarks/per_call_overhead.py
// --stages): one launch runs one piece of the protocol alone, so that chains
// of each piece, timed like the full call, attribute every microsecond.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/layout.h"

namespace jax_ar::gpu {

// Stages, cumulative up to kPacket; the others run the real kernels.
enum class ProbeStage : int32_t {
  kEmpty = 0,         // a kernel that does nothing, with a few bytes of parameters
  kLaunch = 1,        // + the launch protocol: BeginLaunch / FinishLaunch
  kHeader = 2,        // + the call-header exchange
  kPacket = 3,        // + one LL packet pair to and from every peer
  kOneShot = 4,       // the one-shot all-reduce
  kTwoShotLL = 5,     // the two-shot all-reduce over LL packets
  kTwoShotPlain = 6,  // the two-shot all-reduce over plain data and flags
  // A/B variants of the kernels (layout.h kExp*):
  kOneShotSequential = 7,   // one-shot awaiting one peer at a time
  kOneShotPdl = 8,          // one-shot launched with programmatic stream serialization
  kOneShot64 = 9,           // one-shot in blocks of 64 threads
  kOneShot32 = 10,          // one-shot in blocks of 32 threads
  kTwoShotLLSequential = 11,  // LL two-shot awaiting one peer at a time
  kLastStage = kTwoShotLLSequential,
};

// Launches stage kEmpty .. kPacket (one block).
cudaError_t LaunchProtocolProbe(ProbeStage stage, const ProtocolArgs& args, cudaStream_t stream);
cudaError_t LoadProtocolProbeKernels();

}  // namespace jax_ar::gpu
