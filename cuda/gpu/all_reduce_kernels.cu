// The all-reduce kernels: one-shot and two-shot over LL packets, and two-shot
// over plain data behind flags for large messages. The element type of each
// array and the op are read at run time and dispatched once per vector
// (DispatchAccumulator): in the LL kernels around the vector's waits (one
// copy of their wait loops per element type and op), in the plain two-shot,
// which waits per block, around the sum of every rank's vector. An LL
// launch of one array runs an instance of its element type and op instead.
//
// one-shot      Each thread owns 16-byte vectors of the message. It sends
//               all of them to every peer as LL packets (slot `rank` of the
//               peer's LL half), then takes every rank's packets of each
//               vector in rank order, one peer's at a time at 2 ranks and
//               two ranks' at a time from 3, and reduces.
//               No barrier, no separate flag: the data carries its own
//               readiness.
// two-shot, LL  The message is cut into `world` chunks; rank j reduces chunk
//               j. Each thread owns vector v of every chunk: it sends vector
//               v of chunk j to rank j, awaits vector v of its own chunk from
//               every peer, reduces, sends the result to every peer and
//               awaits their reduced vectors v (each wait one peer's packets
//               at a time at 2 ranks, two ranks' from 3). Half the bytes of
//               one-shot per rank and no barrier either: what a
//               latency-bound message over many ranks wants.
// two-shot,     The same cut with plain 16-byte stores; each block then
//   plain       raises one flag per peer (release) and waits for the same
//               block of every peer (acquire). Half the bytes of LL two-shot:
//               for messages where bandwidth, not latency, counts.
//
// Call headers: block 0's thread t sends this launch's signature to rank t
// at the start. The LL kernels never wait for one: their packets carry the
// signature's tag (ll_packet.cuh), so a rank that took every packet it
// needed has met only peers making its call, and a waiter reads the
// header only to name a disagreement. The plain two-shot compares every
// peer's header at the end.
//
// Reuse of the data halves: launch n writes half n % 2 of its region (LL for
// one-shot and LL two-shot, plain for plain two-shot; see layout.h). A rank
// that starts launch n + 2 has received data of launch n + 1 from every peer
// (every rank sends something to every peer in every launch), so every peer
// has finished launch n (kernels of a stream run in order) and no longer
// reads that half.
#include <cuda_runtime.h>

#include <type_traits>

#include "gpu/kernels.h"
#include "gpu/load_kernels.h"
#include "gpu/numeric.cuh"
#include "gpu/packets.cuh"

namespace jax_ar::gpu {

// Per device, never freed, so that stale launches can always read it.
__device__ LocalControl g_local_controls[kMaxLiveSlots];

namespace {

template <int kSegments>
__device__ __forceinline__ uint4 LoadPacked(const AllReduceArgs<kSegments>& a, uint64_t x,
                                            int& hint) {
  if (x >= a.bytes) return make_uint4(0, 0, 0, 0);
  hint = FindSegment(a, x, hint);
  return LoadSegment(a.segments[hint], x - a.segments[hint].offset);
}

template <int kSegments>
__device__ __forceinline__ void StorePacked(const AllReduceArgs<kSegments>& a, uint64_t x,
                                            uint4 v, int& hint) {
  if (x >= a.bytes) return;
  hint = FindSegment(a, x, hint);
  StoreSegment(a.segments[hint], x - a.segments[hint].offset, v);
}

template <int kSegments>
__device__ __forceinline__ Dtype DtypeAt(const AllReduceArgs<kSegments>& a, uint64_t x, int& hint) {
  if (x >= a.bytes) return a.segments[0].dtype;
  hint = FindSegment(a, x, hint);
  return a.segments[hint].dtype;
}

// The protocol probe's stand-in for a reduction: the words xor-ed.
struct XorAccumulator {
  uint4 words{};
  template <int kWidth>
  __device__ __forceinline__ void Add(const RankBatch<kWidth>& batch) {
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      if (j >= batch.count) break;
      const uint4 d = batch.Data(j);
      words = make_uint4(words.x ^ d.x, words.y ^ d.y, words.z ^ d.z, words.w ^ d.w);
    }
  }
};

// The one-shot with pieces left out: the protocol probe's data-path ladder
// (kernels.h OneShotPart), never a call's.
template <int kSegments, OneShotPart kPart>
__device__ __forceinline__ uint4 OneShotInput(const AllReduceArgs<kSegments>& a, uint64_t v,
                                              int& hint) {
  if constexpr (kPart == OneShotPart::kPacketsOnly) {
    return make_uint4(a.rank, static_cast<uint32_t>(v), 0, 0);
  } else {
    return LoadPacked(a, 16 * v, hint);
  }
}

// Fixed: void reads each vector's element type and the op at run time
// (DispatchAccumulator, twelve copies of the wait loop); a
// TypedAccumulator<D, Lanes> is an instance for one-array launches of that
// type and op, which the host picks (TypedKernel): a quarter of the
// code and 76-80 registers against 130, and 1-10% faster a call at 2, 4
// and 8 ranks, 1-256 KB (23 of 24 cells over two runs, 2026-12-02,
// docs/latency_log.md "Latency, seventh push"). kRanksInFlight: how many ranks'
// packets of a vector one read takes (packets.cuh GatherRanks; the host
// picks, kOneShotRanksInFlight).
template <int kSegments, OneShotPart kPart = OneShotPart::kAll, typename Fixed = void,
          int kRanksInFlight = 1>
__global__ void __launch_bounds__(kOneShotWideThreads, 1)
    OneShotKernel(const __grid_constant__ AllReduceArgs<kSegments> a) {
  constexpr bool kHeader = kPart == OneShotPart::kAll;
  constexpr bool kSum = kHeader || kPart == OneShotPart::kNoHeader;
  const uint64_t vectors = a.bytes / 16;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t first = blockIdx.x * blockDim.x + threadIdx.x;
  // The input does not depend on the launch number: its load is issued
  // before BeginLaunch's, so the two round trips overlap.
  int hint = 0;
  const uint4 first_input = OneShotInput<kSegments, kPart>(a, first, hint);
  LaunchContext ctx;
  if constexpr (kHeader) {
    if (!StartLaunch(a, ctx, [&] { FillOutputs(a); })) return;
  } else {
    ctx = BeginLaunch(a);
    if (!ctx.live) return;
  }
  Waiter waiter(a, ctx.launch);
  // Every vector of this thread goes out before the first wait, so that a
  // thread with several vectors waits for one exchange, not one per vector.
  for (uint64_t v = first; v < vectors; v += stride) {
    const uint4 input = v == first ? first_input : OneShotInput<kSegments, kPart>(a, v, hint);
    SendPacketPair(a, ctx.parity, a.slot_bytes, 2 * v, input, ctx.flags);
  }
  const LLPacket* half = PacketSlot(a, a.rank, ctx.parity, a.slot_bytes, 0);
  bool ok = true;
  for (uint64_t v = first; v < vectors && ok; v += stride) {
    // From L2 (this launch read it): an output may alias its input, and
    // each thread reads a vector before it writes that vector's result.
    const uint4 mine = v == first ? first_input : OneShotInput<kSegments, kPart>(a, v, hint);
    const auto take = [&](auto& sum) {
      return TakeInRankOrder<kRanksInFlight>(
          a, half, a.slot_bytes, 2 * v, ctx.flags, waiter, mine,
          [&](const RankBatch<kRanksInFlight>& batch) { sum.Add(batch); });
    };
    if constexpr (kSum) {
      if constexpr (std::is_void_v<Fixed>) {
        // Element type and op dispatched once per vector, around its waits:
        // 1-5% faster than once per peer's step at 2, 4 and 8 ranks, 1-256
        // KB (2026-12-02, docs/latency_log.md).
        DispatchAccumulator(DtypeAt(a, 16 * v, hint), a.op, [&](auto typed) {
          ok = take(typed);
          if (ok) StorePacked(a, 16 * v, typed.Result(a.op, a.world), hint);
        });
      } else {
        Fixed typed;
        ok = take(typed);
        if (ok) StorePacked(a, 16 * v, typed.Result(a.op, a.world), hint);
      }
    } else {
      XorAccumulator x;  // no arithmetic, no element type
      ok = take(x);
      if (kPart == OneShotPart::kNoReduce && ok) StorePacked(a, 16 * v, x.words, hint);
    }
  }
  FinishLaunch(a, ctx);
}

// LL two-shot regions of rank `owner`'s LL half: phase 0 (senders' parts of
// the owner's chunk), then phase 1 (senders' reduced chunks), `world` slots
// of slot_bytes (two packets per 16 data bytes) each.
__device__ __forceinline__ uint64_t TwoShotLLRegion(const ProtocolArgs& a, uint64_t slot_bytes,
                                                    int phase) {
  return static_cast<uint64_t>(phase) * a.world * slot_bytes;
}

// Fixed as OneShotKernel's: the typed instances were 2.6-9% faster a call
// than the dispatching kernel at 2, 4 and 8 ranks, 1-256 KB (11 of 12
// cells; 0.1% at 4 ranks and 1 KB; 2026-12-02, docs/latency_log.md "Latency,
// eighth push"). kRanksInFlight as OneShotKernel's (the host picks,
// kTwoShotLLRanksInFlight).
template <int kSegments, typename Fixed = void, int kRanksInFlight = 1>
__global__ void __launch_bounds__(kOneShotThreads, 2)
    TwoShotLLKernel(const __grid_constant__ AllReduceArgs<kSegments> a) {
  LaunchContext ctx;
  if (!StartLaunch(a, ctx, [&] { FillOutputs(a); })) return;
  Waiter waiter(a, ctx.launch);
  const uint64_t chunk = a.chunk_bytes;  // >= 16: every rank sends to every peer
  const uint64_t vectors = chunk / 16;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t first = blockIdx.x * blockDim.x + threadIdx.x;
  const uint64_t phase1 = TwoShotLLRegion(a, a.slot_bytes, 1);
  int hint = 0;
  // Phase 0: vector v of chunk j goes to rank j, for all of this thread's v.
  for (uint64_t v = first; v < vectors; v += stride) {
    for (int step = 1; step < a.world; ++step) {
      const int peer = PeerAfter(a, step);
      const uint4 part = LoadPacked(a, peer * chunk + 16 * v, hint);
      WritePacketPair(PacketSlot(a, peer, ctx.parity, a.slot_bytes, a.rank) + 2 * v, part,
                      ctx.flags);
    }
  }
  // Reduce this rank's chunk as its parts arrive; each reduced vector goes
  // to the output and to every peer (phase 1).
  const LLPacket* parts = PacketSlot(a, a.rank, ctx.parity, a.slot_bytes, 0);
  bool ok = true;
  for (uint64_t v = first; v < vectors && ok; v += stride) {
    const uint64_t mine_at = a.rank * chunk + 16 * v;
    const uint4 mine = LoadPacked(a, mine_at, hint);
    uint4 reduced;
    const auto reduce = [&](auto typed) {
      ok = TakeInRankOrder<kRanksInFlight>(
          a, parts, a.slot_bytes, 2 * v, ctx.flags, waiter, mine,
          [&](const RankBatch<kRanksInFlight>& batch) { typed.Add(batch); });
      if (ok) reduced = typed.Result(a.op, a.world);
    };
    // Element type and op dispatched once per vector, as in the one-shot,
    // unless fixed.
    if constexpr (std::is_void_v<Fixed>) {
      DispatchAccumulator(DtypeAt(a, mine_at, hint), a.op, reduce);
    } else {
      reduce(Fixed{});
    }
    if (!ok) break;
    StorePacked(a, mine_at, reduced, hint);
    SendPacketPair(a, ctx.parity, a.slot_bytes, 2 * v, reduced, ctx.flags, phase1);
  }
  // Phase 1: every peer's reduced vectors into the output.
  const LLPacket* reduced = PacketSlot(a, a.rank, ctx.parity, a.slot_bytes, 0, phase1);
  for (uint64_t v = first; v < vectors && ok; v += stride) {
    ok = TakeInRankOrder<kRanksInFlight>(
        a, reduced, a.slot_bytes, 2 * v, ctx.flags, waiter, make_uint4(0, 0, 0, 0),
        [&](const RankBatch<kRanksInFlight>& batch) {
#pragma unroll
          for (int j = 0; j < kRanksInFlight; ++j) {
            const int s = batch.base + j;
            if (j < batch.count && s != a.rank) StorePacked(a, s * chunk + 16 * v, batch.Data(j), hint);
          }
        });
  }
  FinishLaunch(a, ctx);
}

template <int kSegments>
__device__ __forceinline__ std::byte* TwoShotSlot(const AllReduceArgs<kSegments>& a, int owner,
                                                  int parity, int phase, int sender) {
  return PlainHalf(a, owner, parity) + (phase * a.world + sender) * a.slot_bytes;
}

template <int kSegments>
__global__ void __launch_bounds__(kTwoShotThreads)
    TwoShotKernel(const __grid_constant__ AllReduceArgs<kSegments> a) {
  LaunchContext ctx;
  if (!StartLaunch(a, ctx, [&] { FillOutputs(a); })) return;
  const int parity = ctx.parity;
  Waiter waiter(a, ctx.launch);
  const uint64_t chunk = a.chunk_bytes;
  const uint64_t v_begin = blockIdx.x * a.vectors_per_block;
  const uint64_t v_end = min(v_begin + a.vectors_per_block, chunk / 16);

  // Phase 0: my part of chunk j goes to rank j.
  for (int i = 1; i < a.world; ++i) {
    const int peer = PeerAfter(a, i);
    const uint64_t base = peer * chunk;
    std::byte* dst = TwoShotSlot(a, peer, parity, 0, a.rank);
    int hint = 0;
    for (uint64_t v = v_begin + threadIdx.x; v < v_end && base + 16 * v < a.bytes; v += blockDim.x) {
      Store16(dst + 16 * v, LoadPacked(a, base + 16 * v, hint));
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
      const uint4 mine = LoadPacked(a, x, hint);
      uint4 result;
      DispatchAccumulator(a.segments[hint].dtype, a.op, [&](auto typed) {
        typed.AddRanks(a.world, [&](int s) {
          return s == a.rank ? mine : LoadShared16(TwoShotSlot(a, a.rank, parity, 0, s) + 16 * v);
        });
        result = typed.Result(a.op, a.world);
      });
      StorePacked(a, x, result, hint);
      for (int i = 1; i < a.world; ++i) {
        const int peer = PeerAfter(a, i);
        Store16(TwoShotSlot(a, peer, parity, 1, a.rank) + 16 * v, result);
      }
    }
    SignalPeers(a, 1, ctx.launch);
    ok = WaitForPeers(a, 1, waiter);
  }

  // Phase 1: every other rank's reduced chunk into my outputs.
  if (ok) {
    for (int i = 1; i < a.world; ++i) {
      const int owner = PeerAfter(a, i);
      const uint64_t base = owner * chunk;
      const std::byte* src = TwoShotSlot(a, a.rank, parity, 1, owner);
      int hint = 0;
      for (uint64_t v = v_begin + threadIdx.x; v < v_end && base + 16 * v < a.bytes; v += blockDim.x) {
        StorePacked(a, base + 16 * v, LoadShared16(src + 16 * v), hint);
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

using OneArrayKernel = void (*)(AllReduceArgs<1>);

// Launches `kernel`, one of the one-array kernels picked at run time.
cudaError_t LaunchOneArray(OneArrayKernel kernel, const AllReduceArgs<1>& args, int blocks,
                           int threads, cudaStream_t stream) {
  void* params[] = {const_cast<AllReduceArgs<1>*>(&args)};
  return cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(blocks), dim3(threads),
                          params, 0, stream);
}

// The protocol probe's one-shots that leave a piece out or change one
// (kernels.h OneShotPart; one array a launch only): launched and loaded
// from this one list.
struct OneShotPartKernel {
  OneShotPart part;
  OneArrayKernel kernel;
};
constexpr OneShotPartKernel kOneShotPartKernels[] = {
    {OneShotPart::kNoHeader, OneShotKernel<1, OneShotPart::kNoHeader>},
    {OneShotPart::kNoReduce, OneShotKernel<1, OneShotPart::kNoReduce>},
    {OneShotPart::kPacketsOnly, OneShotKernel<1, OneShotPart::kPacketsOnly>},
};

cudaError_t LaunchOneShotPart(OneShotPart part, const AllReduceArgs<1>& args, int blocks,
                              int threads, cudaStream_t stream) {
  for (const OneShotPartKernel& k : kOneShotPartKernels) {
    if (k.part == part) return LaunchOneArray(k.kernel, args, blocks, threads, stream);
  }
  return cudaErrorInvalidValue;
}

// Ranks whose packets the typed one-shot instances read at once from 3
// ranks (packets.cuh GatherRanks); at 2 ranks, one. Every peer's at once
// measured 1.1-1.6x slower at 2, 4 and 8 ranks (16 and 256 KB, 2026-12-02,
// "Latency, third push": 220 registers a thread). Two ranks at a time
// against one (95-104 registers a thread against 76-80, no spills), two
// runs each at 1-256 KB: at 8 ranks 0.35-1.1 us faster in every pairing, at
// 4 ranks 0.06-0.5 faster at 1, 64 and 256 KB and within -0.15..+0.16 at
// 16 KB; at 2 ranks, where one read takes this rank and its peer, 0.3-0.4
// slower at 16 KB and 0.1-0.3 faster at 1 and 64 KB (2026-12-04,
// docs/latency_log.md "Latency, nineteenth push"). Four at a time
// (124-128 registers) ran within the runs of two at 4 and 8 ranks. The
// dispatching instance (twelve copies of the wait loop) spilled 300-800
// bytes a thread with two or four, and reads one rank at a time.
constexpr int kOneShotRanksInFlight = 2;

// Ranks whose packets the typed LL two-shot instances read at once from 3
// ranks, in both of its phases; at 2 ranks, one. Every peer's at once
// measured 1.2-1.6x slower at 2, 4 and 8 ranks (16 and 256 KB, 2026-12-02,
// docs/latency_log.md). Two at a time against one (98-104 registers a thread
// against 80-86, no spills), two runs each at 64 KB / 256 KB / 1 MB: 4
// ranks 0.1-0.4 / 0.15-0.37 / 3.5 us faster, 8 ranks 1.4-2.2 / 1.2-2.4 /
// 8.2-9.7 faster; 2 ranks within -0.7..0 at 64 and 256 KB and 1.2-1.4
// faster at 1 MB (2026-12-04, "Latency, nineteenth push"). The dispatching
// instance reads one rank at a time.
constexpr int kTwoShotLLRanksInFlight = 2;

// The LL kernels' instances for one-array launches, by their Fixed
// accumulator: each reading one rank at a time, and kOneShotRanksInFlight
// or kTwoShotLLRanksInFlight (OneShotWideOf, TwoShotLLWideOf).
template <typename Fixed>
struct OneShotOf {
  static constexpr OneArrayKernel kKernel = OneShotKernel<1, OneShotPart::kAll, Fixed>;
};
template <typename Fixed>
struct OneShotWideOf {
  static constexpr OneArrayKernel kKernel =
      OneShotKernel<1, OneShotPart::kAll, Fixed, kOneShotRanksInFlight>;
};
template <typename Fixed>
struct TwoShotLLOf {
  static constexpr OneArrayKernel kKernel = TwoShotLLKernel<1, Fixed>;
};
template <typename Fixed>
struct TwoShotLLWideOf {
  static constexpr OneArrayKernel kKernel = TwoShotLLKernel<1, Fixed, kTwoShotLLRanksInFlight>;
};

// Kernel Of's instance for a one-array launch of element type D and op `op`
// (avg sums, as the dispatching kernels do; Result divides).
template <template <typename> class Of, Dtype D>
constexpr OneArrayKernel TypedOf(int op) {
  switch (op) {
    case static_cast<int>(ReduceOp::kMax): return Of<TypedAccumulator<D, MaxLanes>>::kKernel;
    case static_cast<int>(ReduceOp::kMin): return Of<TypedAccumulator<D, MinLanes>>::kKernel;
    default: return Of<TypedAccumulator<D, SumLanes>>::kKernel;
  }
}

template <template <typename> class Of>
OneArrayKernel TypedKernel(Dtype dtype, int op) {
  switch (dtype) {
    case Dtype::kBF16: return TypedOf<Of, Dtype::kBF16>(op);
    case Dtype::kF16: return TypedOf<Of, Dtype::kF16>(op);
    case Dtype::kS32: return TypedOf<Of, Dtype::kS32>(op);
    default: return TypedOf<Of, Dtype::kF32>(op);
  }
}

// The instance for the one-array launch `a`: Of's (one rank's packets at a
// time) at 2 ranks, WideOf's from 3, where reading two at once measured
// faster (kOneShotRanksInFlight, kTwoShotLLRanksInFlight).
template <template <typename> class Of, template <typename> class WideOf>
OneArrayKernel TypedKernelFor(const AllReduceArgs<1>& a) {
  const Dtype dtype = a.segments[0].dtype;
  return a.world > 2 ? TypedKernel<WideOf>(dtype, a.op) : TypedKernel<Of>(dtype, a.op);
}

template <int kSegments>
cudaError_t Launch(AllReduceKernel kernel, const AllReduceArgs<kSegments>& args, int blocks,
                   int threads, cudaStream_t stream) {
  switch (kernel) {
    case AllReduceKernel::kOneShot:
      if constexpr (kSegments == 1) {
        return LaunchOneArray(TypedKernelFor<OneShotOf, OneShotWideOf>(args), args, blocks,
                              threads, stream);
      } else {
        OneShotKernel<kSegments><<<blocks, threads, 0, stream>>>(args);
      }
      break;
    case AllReduceKernel::kTwoShotLL:
      if constexpr (kSegments == 1) {
        return LaunchOneArray(TypedKernelFor<TwoShotLLOf, TwoShotLLWideOf>(args), args, blocks,
                              kOneShotThreads, stream);
      } else {
        TwoShotLLKernel<kSegments><<<blocks, kOneShotThreads, 0, stream>>>(args);
      }
      break;
    case AllReduceKernel::kTwoShotPlain:
      TwoShotKernel<kSegments><<<blocks, kTwoShotThreads, 0, stream>>>(args);
      break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAllReduce(AllReduceKernel kernel, const LaunchArgs& args, int blocks,
                            int threads, cudaStream_t stream, OneShotPart part) {
  if (args.num_segments == 1) {
    AllReduceArgs<1> one;
    static_cast<ProtocolArgs&>(one) = args;
    one.bytes = args.bytes;
    one.slot_bytes = args.slot_bytes;
    one.chunk_bytes = args.chunk_bytes;
    one.vectors_per_block = args.vectors_per_block;
    one.op = args.op;
    one.num_segments = 1;
    one.segments[0] = args.segments[0];
    if (kernel == AllReduceKernel::kOneShot && part != OneShotPart::kAll) {
      return LaunchOneShotPart(part, one, blocks, threads, stream);
    }
    return Launch(kernel, one, blocks, threads, stream);
  }
  return Launch(kernel, args, blocks, threads, stream);
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
  if (const cudaError_t err =
          LoadEach(OneShotKernel<kMaxSegmentsPerLaunch>, TwoShotLLKernel<kMaxSegmentsPerLaunch>,
                   TwoShotKernel<1>, TwoShotKernel<kMaxSegmentsPerLaunch>, ProbeKernel);
      err != cudaSuccess) {
    return err;
  }
  for (const OneShotPartKernel& k : kOneShotPartKernels) {
    if (const cudaError_t err = LoadEach(k.kernel); err != cudaSuccess) return err;
  }
  for (Dtype d : {Dtype::kF32, Dtype::kBF16, Dtype::kF16, Dtype::kS32}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
      const int o = static_cast<int>(op);
      if (const cudaError_t err =
              LoadEach(TypedKernel<OneShotOf>(d, o), TypedKernel<OneShotWideOf>(d, o),
                       TypedKernel<TwoShotLLOf>(d, o), TypedKernel<TwoShotLLWideOf>(d, o));
          err != cudaSuccess) {
        return err;
      }
    }
  }
  return cudaSuccess;
}

cudaError_t LaunchProbe(const ProbeArgs& args, cudaStream_t stream) {
  ProbeKernel<<<1, 32, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace jax_ar::gpu
