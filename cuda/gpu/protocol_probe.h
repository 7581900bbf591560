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
  // The one-shot's block size forced (OneShotShape chooses it by size):
  kOneShot128 = 7,          // blocks of 128 threads at every size
  kOneShot256 = 8,          // blocks of 256 threads at every size
  // The one-shot's data-path ladder (kernels.h OneShotPart), its block size:
  kOneShotNoHeader = 9,     // without the call header
  kOneShotNoReduce = 10,    // and the words xor-ed, not summed
  kOneShotPackets = 11,     // and no input loads or output stores
  kLastStage = kOneShotPackets,
};

// Launches stage kEmpty .. kPacket (one block).
cudaError_t LaunchProtocolProbe(ProbeStage stage, const ProtocolArgs& args, cudaStream_t stream);
cudaError_t LoadProtocolProbeKernels();

}  // namespace jax_ar::gpu
