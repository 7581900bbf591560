// Host entry points of the CUDA kernels (defined in the .cu files), so that
// handlers and the module are plain C++.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/protocol.h"
#include "gpu/capacity.h"
#include "gpu/layout.h"

namespace jax_ar::gpu {

// What a one-shot launch does: all of it (every call), or, for the protocol
// probe's data-path ladder (protocol_probe.h), less: no call header; no
// header and the words xor-ed instead of summed (input loads and output
// stores kept); no header, no loads, no stores, only the packets' exchange.
// A call's one-shot of one array runs the instance of its element type and
// op; the probe's parts, like launches of several arrays, read both at run
// time (so kNoHeader also differs from kAll by that dispatch).
enum class OneShotPart { kAll, kNoHeader, kNoReduce, kPacketsOnly };

// Launches one protocol instance on `stream` (a launch of one array passes
// the small AllReduceArgs<1>); `threads` per block for the one-shot, and the
// one-shot's part for launches of one array (the probe's).
cudaError_t LaunchAllReduce(AllReduceKernel kernel, const LaunchArgs& args, int blocks,
                            int threads, cudaStream_t stream,
                            OneShotPart part = OneShotPart::kAll);

// Launches one fused all-reduce + residual + RMSNorm protocol instance
// (kOneShot, kTwoShot plain, or kTwoShotLL for rows of one or two vectors a
// thread); `vectors_per_thread` (1..4) is how many 16-byte vectors of a row
// each thread holds.
cudaError_t LaunchAllReduceRmsNorm(Algorithm algorithm, const RmsNormLaunchArgs& args, int blocks,
                                   int threads, int vectors_per_thread, cudaStream_t stream);
cudaError_t LoadRmsNormKernels();

// The slot table of the current device: address of slot `slot`, and a write
// of one slot (ordered on `stream`).
cudaError_t LocalControlAddress(int slot, LocalControl** address);
cudaError_t WriteLocalControl(int slot, const LocalControl& value, cudaStream_t stream);

// Loads every kernel of the module on the current device (lazy loading would
// otherwise do it inside XLA's graph capture) and checks that the build
// carries code for this GPU.
cudaError_t LoadKernels();

// P2P probe of one rank: writes a token into every peer's workspace through
// its mapping and reads it back, then waits (until the deadline) for every
// peer's token in its own workspace. `result` is host-mapped.
struct ProbeResult {
  uint32_t status;  // ProbeStatus
  int32_t peer;
  uint64_t wrote;
  uint64_t read;
};
enum ProbeStatus : uint32_t { kProbeRunning = 0, kProbeOk = 1, kProbeReadBack = 2, kProbeMissing = 3 };

struct ProbeArgs {
  std::byte* workspaces[kMaxRanks];
  int32_t rank;
  int32_t world;
  uint64_t nonce;  // the same on every rank: tokens differ between setups
  uint64_t timeout_ns;
  ProbeResult* result;  // device address of host-mapped memory
};

cudaError_t LaunchProbe(const ProbeArgs& args, cudaStream_t stream);

}  // namespace jax_ar::gpu
