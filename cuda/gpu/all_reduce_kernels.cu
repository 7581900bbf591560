// The all-reduce kernels: one-shot over LL packets and two-shot over flags.
//
// one-shot  Each thread owns 16-byte vectors of the message. For each it
//           sends its input to every peer as two LL packets (slot `rank` of
//           the peer's data half), then reads every rank's packets from its
//           own workspace, spinning until their flags equal the launch's
//           flag, and reduces in rank order. No barrier, no separate flag:
//           the data carries its own readiness.
// two-shot  The message is cut into `world` chunks; rank j reduces chunk j.
//           Phase 0 pushes each chunk to its owner, phase 1 pushes each
//           reduced chunk to everybody. Data goes with plain 16-byte stores;
//           each block then raises one flag per peer (release) and waits for
//           the same block of every peer (acquire). The partition into
//           blocks depends only on sizes and world, so block b of every rank
//           covers the same vectors.
//
// Reuse of the data halves: launch n writes half n % 2 of its region (LL for
// one-shot, plain for two-shot; see layout.h). A rank that starts
// launch n + 2 has received every peer's data of launch n + 1, so every
// peer has finished launch n (kernels of a stream run in order) and no
// longer reads that half.
#include <cuda_runtime.h>

#include "gpu/kernels.h"
#include "gpu/launch_protocol.cuh"
#include "gpu/numeric.cuh"

namespace jax_ar::gpu {

// Per device, never freed, so that stale launches can always read it.
__device__ LocalControl g_local_controls[kMaxLiveSlots];

namespace {

__device__ __forceinline__ std::byte* TwoShotSlot(const LaunchArgs& a, int owner, int parity,
                                                  int phase, int sender) {
  return PlainHalf(a, owner, parity) + (phase * a.world + sender) * a.slot_bytes;
}

__global__ void __launch_bounds__(kOneShotThreads) OneShotKernel(const __grid_constant__ LaunchArgs a) {
  const LaunchContext ctx = BeginLaunch(a);
  if (!ctx.live) {
    FillOutputs(a);
    return;
  }
  SendHeader(a, ctx.launch);
  const uint32_t flag = LaunchFlag(ctx.launch);
  const int parity = static_cast<int>(ctx.launch & 1);
  Waiter waiter(a, ctx.launch);
  bool ok = true;
  const uint64_t vectors = a.bytes / 16;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  int hint = 0;
  for (uint64_t v = blockIdx.x * blockDim.x + threadIdx.x; v < vectors && ok; v += stride) {
    const uint64_t x = v * 16;
    hint = FindSegment(a, x, hint);
    const SegmentArg& seg = a.segments[hint];
    const uint4 mine = LoadSegment(seg, x - seg.offset);
    SendPacketPair(a, parity, a.slot_bytes, 2 * v, mine, flag);
    uint4 result;
    DispatchDtype(seg.dtype, [&](auto tag) {
      result = ReduceVector<decltype(tag)::kDtype>(a.op, a.world, [&](int s) {
        return PacketPairFrom(a, s, mine, parity, a.slot_bytes, 2 * v, flag, waiter, ok);
      });
    });
    if (ok) StoreSegment(seg, x - seg.offset, result);
  }
  if (ok) CheckHeader(a, waiter);
  FinishLaunch(a, ctx);
}

__global__ void __launch_bounds__(kTwoShotThreads) TwoShotKernel(const __grid_constant__ LaunchArgs a) {
  const LaunchContext ctx = BeginLaunch(a);
  if (!ctx.live) {
    FillOutputs(a);
    return;
  }
  SendHeader(a, ctx.launch);
  const int parity = static_cast<int>(ctx.launch & 1);
  Waiter waiter(a, ctx.launch);
  const uint64_t chunk = a.chunk_bytes;
  const uint64_t v_begin = blockIdx.x * a.vectors_per_block;
  const uint64_t v_end = min(v_begin + a.vectors_per_block, chunk / 16);

  // Phase 0: my part of chunk j goes to rank j.
  for (int i = 1; i < a.world; ++i) {
    const int peer = (a.rank + i) % a.world;
    const uint64_t base = peer * chunk;
    std::byte* dst = TwoShotSlot(a, peer, parity, 0, a.rank);
    int hint = 0;
    for (uint64_t v = v_begin + threadIdx.x; v < v_end && base + 16 * v < a.bytes; v += blockDim.x) {
      const uint64_t x = base + 16 * v;
      hint = FindSegment(a, x, hint);
      Store16(dst + 16 * v, LoadSegment(a.segments[hint], x - a.segments[hint].offset));
    }
  }
  SignalPeers(a, 0, ctx.launch);
  bool ok = WaitForPeers(a, 0, waiter);

  // Reduce my chunk in rank order; the result goes to my outputs and to
  // slot `rank` of every peer's phase-1 area.
  if (ok) {
    const uint64_t base = a.rank * chunk;
    int hint = 0;
    for (uint64_t v = v_begin + threadIdx.x; v < v_end && base + 16 * v < a.bytes; v += blockDim.x) {
      const uint64_t x = base + 16 * v;
      hint = FindSegment(a, x, hint);
      const SegmentArg& seg = a.segments[hint];
      const uint4 mine = LoadSegment(seg, x - seg.offset);
      uint4 result;
      DispatchDtype(seg.dtype, [&](auto tag) {
        result = ReduceVector<decltype(tag)::kDtype>(a.op, a.world, [&](int s) {
          if (s == a.rank) return mine;
          return LoadShared16(TwoShotSlot(a, a.rank, parity, 0, s) + 16 * v);
        });
      });
      StoreSegment(seg, x - seg.offset, result);
      for (int i = 1; i < a.world; ++i) {
        const int peer = (a.rank + i) % a.world;
        Store16(TwoShotSlot(a, peer, parity, 1, a.rank) + 16 * v, result);
      }
    }
    SignalPeers(a, 1, ctx.launch);
    ok = WaitForPeers(a, 1, waiter);
  }

  // Phase 1: every other rank's reduced chunk into my outputs.
  if (ok) {
    for (int i = 1; i < a.world; ++i) {
      const int owner = (a.rank + i) % a.world;
      const uint64_t base = owner * chunk;
      const std::byte* src = TwoShotSlot(a, a.rank, parity, 1, owner);
      int hint = 0;
      for (uint64_t v = v_begin + threadIdx.x; v < v_end && base + 16 * v < a.bytes; v += blockDim.x) {
        const uint64_t x = base + 16 * v;
        hint = FindSegment(a, x, hint);
        StoreSegment(a.segments[hint], x - a.segments[hint].offset, LoadShared16(src + 16 * v));
      }
    }
    CheckHeader(a, waiter);
  }
  FinishLaunch(a, ctx);
}

__device__ __forceinline__ uint64_t ProbeToken(uint64_t nonce, int sender, int receiver) {
  return HashMix(HashMix(nonce, static_cast<uint64_t>(sender)), static_cast<uint64_t>(receiver)) | 1u;
}

// One thread: local read-back through each peer mapping, then the
// cross-process check that every peer's write has landed here.
__global__ void ProbeKernel(const __grid_constant__ ProbeArgs a) {
  if (threadIdx.x != 0) return;
  volatile ProbeResult* result = a.result;
  for (int q = 0; q < a.world; ++q) {
    if (q == a.rank) continue;
    uint64_t* slot = &ControlOf(a.workspaces[q])->probe[a.rank];
    const uint64_t token = ProbeToken(a.nonce, a.rank, q);
    StoreVolatile64(slot, token);
    __threadfence_system();
    const uint64_t back = LoadVolatile64(slot);
    if (back != token) {
      result->peer = q, result->wrote = token, result->read = back;
      __threadfence_system();
      result->status = kProbeReadBack;
      return;
    }
  }
  const uint64_t deadline = GlobalTimerNs() + a.timeout_ns;
  for (int q = 0; q < a.world; ++q) {
    if (q == a.rank) continue;
    const uint64_t* slot = &ControlOf(a.workspaces[a.rank])->probe[q];
    const uint64_t want = ProbeToken(a.nonce, q, a.rank);
    uint64_t got = LoadVolatile64(slot);
    while (got != want && GlobalTimerNs() < deadline) got = LoadVolatile64(slot);
    if (got != want) {
      result->peer = q, result->wrote = want, result->read = got;
      __threadfence_system();
      result->status = kProbeMissing;
      return;
    }
  }
  __threadfence_system();
  result->status = kProbeOk;
}

}  // namespace

cudaError_t LaunchAllReduce(Algorithm algorithm, const LaunchArgs& args, int blocks,
                            cudaStream_t stream) {
  if (algorithm == Algorithm::kOneShot) {
    OneShotKernel<<<blocks, kOneShotThreads, 0, stream>>>(args);
  } else {
    TwoShotKernel<<<blocks, kTwoShotThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

cudaError_t LocalControlAddress(int slot, LocalControl** address) {
  void* base = nullptr;
  const cudaError_t err = cudaGetSymbolAddress(&base, g_local_controls);
  *address = static_cast<LocalControl*>(base) + slot;
  return err;
}

cudaError_t WriteLocalControl(int slot, const LocalControl& value, cudaStream_t stream) {
  return cudaMemcpyToSymbolAsync(g_local_controls, &value, sizeof(value), slot * sizeof(value),
                                 cudaMemcpyHostToDevice, stream);
}

cudaError_t LoadKernels() {
  cudaFuncAttributes attributes;
  for (const void* kernel : {reinterpret_cast<const void*>(OneShotKernel),
                             reinterpret_cast<const void*>(TwoShotKernel),
                             reinterpret_cast<const void*>(ProbeKernel)}) {
    if (const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel); err != cudaSuccess) {
      return err;
    }
  }
  return cudaSuccess;
}

cudaError_t LaunchProbe(const ProbeArgs& args, cudaStream_t stream) {
  ProbeKernel<<<1, 32, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace jax_ar::gpu
