// FFI handler of the per-call breakdown (protocol_probe.h): one launch of the
// chosen stage on the communicator's rank. The result buffer is the input's
// all-reduce for the stages that run a real kernel and untouched otherwise.
#include "gpu/protocol_probe.h"

#include <string>

#include "common/find_rank.h"
#include "gpu/handlers.h"
#include "gpu/kernels.h"

namespace jax_ar::gpu {
namespace {

// The stages that run an all-reduce kernel on the operand: which kernel,
// one-shot blocks (0: OneShotShape's choice) and what part of the one-shot.
struct KernelStage {
  ProbeStage stage;
  AllReduceKernel kernel;
  int threads;
  OneShotPart part;
};
constexpr KernelStage kKernelStages[] = {
    {ProbeStage::kOneShot, AllReduceKernel::kOneShot, 0, OneShotPart::kAll},
    {ProbeStage::kTwoShotLL, AllReduceKernel::kTwoShotLL, 0, OneShotPart::kAll},
    {ProbeStage::kTwoShotPlain, AllReduceKernel::kTwoShotPlain, 0, OneShotPart::kAll},
    {ProbeStage::kOneShot128, AllReduceKernel::kOneShot, 128, OneShotPart::kAll},
    {ProbeStage::kOneShot256, AllReduceKernel::kOneShot, 256, OneShotPart::kAll},
    {ProbeStage::kOneShotNoHeader, AllReduceKernel::kOneShot, 0, OneShotPart::kNoHeader},
    {ProbeStage::kOneShotNoReduce, AllReduceKernel::kOneShot, 0, OneShotPart::kNoReduce},
    {ProbeStage::kOneShotPackets, AllReduceKernel::kOneShot, 0, OneShotPart::kPacketsOnly},
};

ffi::Error ProtocolProbeHandler(cudaStream_t stream,
                                int32_t device_ordinal,            // XLA's ordinal of this GPU
                                ffi::AnyBuffer in,                 // any array
                                ffi::Result<ffi::AnyBuffer> out,   // like `in`
                                int64_t comm_id,                   // Communicator.comm_id
                                int32_t stage) {                   // ProbeStage
  if (stage < static_cast<int32_t>(ProbeStage::kEmpty) ||
      stage > static_cast<int32_t>(ProbeStage::kLastStage)) {
    return InvalidArgument("protocol_probe: unknown stage " + std::to_string(stage));
  }
  ffi::Error error = ffi::Error::Success();
  auto state = FindRank<RankState>(static_cast<uint64_t>(comm_id), device_ordinal,
                                   Operation::kAllReduce, error);
  if (state == nullptr) return error;
  const auto which = static_cast<ProbeStage>(stage);
  for (const KernelStage& k : kKernelStages) {
    if (k.stage == which) return SumOneArray(stream, *state, in, *out, k.kernel, k.threads, k.part);
  }
  ProtocolArgs a{};
  FillProtocolArgs(*state, Operation::kAllReduce, a);
  a.signature = SignatureOf(Operation::kAllReduce,
                            HashMix(HashMix(kFnvOffset, 0x50524f4245ull), static_cast<uint64_t>(stage)));  // "PROBE"
  if (const cudaError_t err = LaunchProtocolProbe(which, a, stream); err != cudaSuccess) {
    return LaunchFailed(*state, Operation::kAllReduce, err);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kProtocolProbe, ProtocolProbeHandler,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("comm_id")
                                  .Attr<int32_t>("stage"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace jax_ar::gpu
