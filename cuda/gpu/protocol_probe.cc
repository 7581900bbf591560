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
  switch (which) {
    case ProbeStage::kOneShot:
      return SumOneArray(stream, *state, in, *out, AllReduceKernel::kOneShot);
    case ProbeStage::kTwoShotLL:
      return SumOneArray(stream, *state, in, *out, AllReduceKernel::kTwoShotLL);
    case ProbeStage::kTwoShotPlain:
      return SumOneArray(stream, *state, in, *out, AllReduceKernel::kTwoShotPlain);
    case ProbeStage::kOneShot128:
      return SumOneArray(stream, *state, in, *out, AllReduceKernel::kOneShot, 128);
    case ProbeStage::kOneShot256:
      return SumOneArray(stream, *state, in, *out, AllReduceKernel::kOneShot, 256);
    case ProbeStage::kOneShotNoHeader:
      return SumOneArray(stream, *state, in, *out, AllReduceKernel::kOneShot, 0,
                         OneShotPart::kNoHeader);
    case ProbeStage::kOneShotNoReduce:
      return SumOneArray(stream, *state, in, *out, AllReduceKernel::kOneShot, 0,
                         OneShotPart::kNoReduce);
    case ProbeStage::kOneShotPackets:
      return SumOneArray(stream, *state, in, *out, AllReduceKernel::kOneShot, 0,
                         OneShotPart::kPacketsOnly);
    case ProbeStage::kOneShotToldEarly:
      return SumOneArray(stream, *state, in, *out, AllReduceKernel::kOneShot, 0,
                         OneShotPart::kToldEarly);
    default:
      break;
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
