// FFI handlers of the CUDA backend and what they share.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "common/ffi_util.h"
#include "gpu/capacity.h"
#include "gpu/kernels.h"
#include "gpu/layout.h"
#include "gpu/rank_state.h"

namespace jax_ar::gpu {

// The protocol fields of a launch of `operation`, from the rank state alone.
void FillProtocolArgs(const RankState& state, Operation operation, ProtocolArgs& args);

// Records that a launch of `operation` could not start (the rank is then
// failed) and returns the handler's error.
ffi::Error LaunchFailed(RankState& state, Operation operation, cudaError_t err);

// Launch configuration, from static sizes and the world size only, so that
// every rank launches the same grid and cuts data into the same pieces.
// One-shot: kOneShotThreads a block while one vector a thread fits the
// block budget, then kOneShotMaxThreads, then kOneShotWideThreads
// (threads > 0 forces a block size).
struct LaunchShape {
  int blocks;
  int threads;
};
LaunchShape OneShotShape(uint64_t bytes, int world, int threads = 0);
struct TwoShotPlan {
  uint64_t chunk_bytes;
  uint64_t vectors_per_block;
  int blocks;
};
TwoShotPlan PlanTwoShot(uint64_t bytes, int world, int threads);

// The kernels' element type of an XLA type the reductions take (f32, bf16,
// f16, s32); false for any other.
bool ToDtype(ffi::DataType t, Dtype& d);

// The sum over the ranks of one array, with `kernel` (the protocol probe),
// one-shot blocks of `one_shot_threads` (0: OneShotShape's choice) and the
// part of the one-shot that runs (kernels.h).
ffi::Error SumOneArray(cudaStream_t stream, RankState& state, const ffi::AnyBuffer& in,
                       ffi::AnyBuffer& out, AllReduceKernel kernel, int one_shot_threads = 0,
                       OneShotPart part = OneShotPart::kAll);

// How often the all-reduce handler ran in this process: under CUDA graphs
// it runs when XLA records a graph, not per call (benchmarks report it).
uint64_t AllReduceHandlerCalls();

XLA_FFI_DECLARE_HANDLER_SYMBOL(kAllReduce);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kAllReduceRmsNorm);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kProtocolProbe);  // protocol_probe.cc

}  // namespace jax_ar::gpu
