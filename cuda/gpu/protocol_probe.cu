// Kernels of the per-call breakdown (protocol_probe.h): each adds one piece
// of the all-reduce's protocol to the previous stage, in one block.
#include <cuda_runtime.h>

#include "gpu/load_kernels.h"
#include "gpu/packets.cuh"
#include "gpu/protocol_probe.h"

namespace jax_ar::gpu {
namespace {

__global__ void EmptyKernel(int32_t unused) { (void)unused; }

template <ProbeStage kStage>
__global__ void __launch_bounds__(32) StageKernel(const __grid_constant__ ProtocolArgs a) {
  const LaunchContext ctx = BeginLaunch(a);
  if (!ctx.live) return;
  Waiter waiter(a, ctx.launch);
  if constexpr (kStage >= ProbeStage::kHeader) SendHeader(a, ctx);
  if constexpr (kStage >= ProbeStage::kPacket) {
    // Thread 0 sends one packet pair to every peer and awaits theirs; the
    // data half is the one-shot's, slots of 32 bytes.
    if (threadIdx.x == 0) {
      SendPacketPair(a, ctx.parity, 32, 0, make_uint4(1, 2, 3, 4), ctx.flags);
      TakeInRankOrder(a, PacketSlot(a, a.rank, ctx.parity, 32, 0), 32, 0, ctx.flags, waiter,
                      make_uint4(0, 0, 0, 0), [](const RankBatch<>&) {});
    }
  }
  if constexpr (kStage >= ProbeStage::kHeader) CheckHeader(a, waiter);
  FinishLaunch(a, ctx);
}

}  // namespace

cudaError_t LaunchProtocolProbe(ProbeStage stage, const ProtocolArgs& args, cudaStream_t stream) {
  switch (stage) {
    case ProbeStage::kEmpty: EmptyKernel<<<1, 32, 0, stream>>>(0); break;
    case ProbeStage::kLaunch: StageKernel<ProbeStage::kLaunch><<<1, 32, 0, stream>>>(args); break;
    case ProbeStage::kHeader: StageKernel<ProbeStage::kHeader><<<1, 32, 0, stream>>>(args); break;
    case ProbeStage::kPacket: StageKernel<ProbeStage::kPacket><<<1, 32, 0, stream>>>(args); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LoadProtocolProbeKernels() {
  return LoadEach(EmptyKernel, StageKernel<ProbeStage::kLaunch>, StageKernel<ProbeStage::kHeader>,
                  StageKernel<ProbeStage::kPacket>);
}

}  // namespace jax_ar::gpu
