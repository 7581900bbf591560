// Device side of every jax_ar launch: how it learns its launch number, how it
// waits (with a deadline), how it fails, and how it finds its arrays.
//
// Launch numbers. LocalControl::completed[b] counts finished launches of a
// rank as block b sees them: block b reads its counter when it starts
// (launch = completed[b] + 1), and every block of a launch stores the new
// count into the counters of its residue class (FinishLaunch). The next
// launch on the stream starts after those stores, so numbers advance on the
// device alone and a CUDA graph replays correctly. All ranks make the same launches, so they agree on the
// numbers; a launch's flags and data half derive from its number.
//
// Failure. A wait that passes its deadline records (kind, rank, peer and
// their operations) in LocalControl::abort, poisons every peer's
// PeerControl::abort so that they stop waiting too, and writes the failure
// record in host-mapped memory once.
// A launch that starts on an aborted rank does nothing but fill its outputs
// with all-ones bits (NaN for floats, -1 for int32).
//
// Staleness. A launch whose token differs from its LocalControl slot's
// belongs to a closed communicator (a CUDA graph replayed after close()):
// its workspace pointers may be freed, so it reads nothing but the slot
// (module memory that is never freed) and fills its outputs the same way.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gpu/layout.h"
#include "gpu/ll_packet.cuh"
#include "gpu/ptx.cuh"

namespace jax_ar::gpu {

__device__ __forceinline__ PeerControl* ControlOf(std::byte* workspace) {
  return reinterpret_cast<PeerControl*>(workspace);
}

// The rank `step` places after this one (0 <= step < world): a peer loop
// that starts with the next rank spreads the first stores over peers.
// Without a modulo, whose integer division costs about 15 instructions on
// every peer's turn of a latency-bound loop.
__device__ __forceinline__ int PeerAfter(const ProtocolArgs& a, int step) {
  const int peer = a.rank + step;
  return peer < a.world ? peer : peer - a.world;
}

// Rank `owner`'s LL half (one-shot launches) and plain half (two-shot) for
// launches of parity `parity`.
__device__ __forceinline__ std::byte* LLHalf(const ProtocolArgs& a, int owner, int parity) {
  return a.workspaces[owner] + kControlBytes + parity * a.ll_half_bytes;
}
__device__ __forceinline__ std::byte* PlainHalf(const ProtocolArgs& a, int owner, int parity) {
  return a.workspaces[owner] + kControlBytes + 2 * a.ll_half_bytes + parity * a.plain_half_bytes;
}

// Rank `owner`'s call-header packet from `sender` for `launch`.
__device__ __forceinline__ LLPacket* HeaderSlot(const ProtocolArgs& a, int owner, uint64_t launch,
                                                int sender) {
  return &ControlOf(a.workspaces[owner])->headers[launch & 1][sender];
}

// Writes the failure record once (the host reads `kind` last-written-first).
__device__ inline void ReportFailure(const ProtocolArgs& a, uint32_t code, uint64_t launch) {
  if (atomicCAS(&a.local->reported, 0u, 1u) != 0u) return;
  volatile FailureRecord* record = a.record;
  record->rank = a.rank;
  record->culprit = AbortCulprit(code);
  record->peer = AbortPeer(code);
  record->launch = launch;
  record->operation = static_cast<uint32_t>(a.operation);
  record->culprit_operation = AbortCulpritOperation(code);
  record->peer_operation = AbortPeerOperation(code);
  __threadfence_system();
  record->kind = AbortKind(code);
  __threadfence_system();
}

// Marks this rank failed with `code`. A failure found here (not one a peer
// told us about) is passed on to every peer, so that none of them waits
// for this rank until its own deadline.
__device__ inline void Abort(const ProtocolArgs& a, uint32_t code, uint64_t launch) {
  const uint32_t kind = AbortKind(code);
  if (atomicCAS(&a.local->abort, 0u, code) == 0u && (kind & kToldByPeer) == 0) {
    const uint32_t told = ToldByPeer(code);
    for (int q = 0; q < a.world; ++q) {
      if (q != a.rank) atomicCAS_system(&ControlOf(a.workspaces[q])->abort, 0u, told);
    }
  }
  ReportFailure(a, LoadVolatile32(&a.local->abort), launch);
}

// Paces a spin-wait: every 32 polls (Check, out of line so that spin loops
// stay small) it looks for a failure elsewhere (another thread of this
// rank, or a peer) and checks the deadline, which starts at the first check
// so that waits that end quickly never read the clock.
// It also looks at the call header of the peer it waits for, until that has
// come: a peer that made a different call never sends what this launch
// waits for (a reduce_scatter's flags beside an all-reduce's LL packets, or
// LL packets with another call's tag, ll_packet.cuh), so waiting for the
// data alone would end at the deadline as a timeout instead of naming the
// disagreement.
class Waiter {
 public:
  __device__ Waiter(const ProtocolArgs& a, uint64_t launch) : a_(a), launch_(launch) {}

  // False when the thread must stop waiting for `peer` (the rank is aborted).
  __device__ __forceinline__ bool KeepWaiting(int peer) {
    if ((++polls_ & 31u) != 0) return true;
    return Check(peer);
  }

  __device__ uint64_t launch() const { return launch_; }

  // False (the rank aborted) once `peer`'s header `h`, of this launch,
  // names another call than this launch's.
  __device__ bool HeaderMatches(int peer, const PacketRead& h) {
    if (PacketValue(h) == a_.signature) return true;
    Abort(a_, EncodeAbort(kMismatch, a_.rank, peer, a_.operation,
                          static_cast<Operation>(SignatureOperation(PacketValue(h)))),
          launch_);
    return false;
  }

 private:
  __device__ __noinline__ bool Check(int peer) {
    const uint32_t mine = LoadVolatile32(&a_.local->abort);
    if (mine != 0) {
      ReportFailure(a_, mine, launch_);
      return false;
    }
    const uint32_t told = LoadVolatile32(&a_.own_control->abort);
    if (told != 0) {
      Abort(a_, told, launch_);
      return false;
    }
    if (!HeaderAgrees(peer)) return false;
    const uint64_t now = GlobalTimerNs();
    if (deadline_ == 0) {
      deadline_ = now + a_.timeout_ns;
    } else if (now > deadline_) {
      Abort(a_, EncodeAbort(kTimeout, a_.rank, peer, a_.operation), launch_);
      return false;
    }
    return true;
  }

  // False (the rank aborted) once `peer` has sent the header of a
  // different call for this launch.
  __device__ bool HeaderAgrees(int peer) {
    if (peer == a_.rank || ((headers_seen_ >> peer) & 1u) != 0) return true;
    const PacketRead h = ReadPacket(HeaderSlot(a_, a_.rank, launch_, peer));
    if (!h.Fresh(HeaderFlags(launch_))) return true;  // not here yet
    headers_seen_ |= 1u << peer;
    return HeaderMatches(peer, h);
  }

  const ProtocolArgs& a_;
  uint64_t launch_;
  uint32_t headers_seen_ = 0;  // bit q: rank q's header came and matched
  uint64_t deadline_ = 0;
  uint32_t polls_ = 0;
};

struct LaunchContext {
  uint64_t launch;
  PacketFlags flags;  // what this launch's LL data packets carry (DataFlags)
  int parity;         // launch & 1: the data half this launch uses
  bool live;
  uint64_t started_before;  // block 0, thread 0 only: LocalControl::started before its claim
  uint32_t told;     // thread 0 only: this rank's failure word (Abort) at the start
};

// Outputs of a launch that cannot run: all-ones bits.
__device__ inline void FillBytes(void* out, uint64_t bytes) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  auto* words = static_cast<uint16_t*>(out);
  for (uint64_t k = blockIdx.x * blockDim.x + threadIdx.x; k < bytes / 2; k += stride) {
    words[k] = 0xffffu;
  }
}

// Every block, first thing: the launch number, or live=false when the launch
// is stale or the rank aborted (then nothing else may be touched). Block 0
// also claims the number; the claim is checked only at the end (CheckAlone).
// Thread 0 of a live launch also reads the failure word that peers raise in
// this rank's workspace (Abort), acted on at the end (FinishLaunch): the
// read goes out here, once the token says the workspace is ours, so that
// its round trip is over before the launch ends. Read at the end, it was a
// round trip after the block's last wait (moved here, the one-shot was
// 0.06-0.27 us a call faster at 2 ranks, -7% to +2% at 4 and -5% to +2%
// at 8, docs/latency_log.md "Latency, eighth push").
__device__ inline LaunchContext BeginLaunch(const ProtocolArgs& a) {
  __shared__ uint64_t s_launch;
  __shared__ int s_live;
  uint64_t started_before = 0;
  uint32_t told = 0;
  if (threadIdx.x == 0) {
    const uint64_t token = LoadVolatile64(&a.local->token);
    const uint64_t completed = LoadVolatile64(&a.local->completed[blockIdx.x]);
    const uint32_t abort = LoadVolatile32(&a.local->abort);
    int live = token == a.token;  // only then is the slot ours to change
    if (live && abort != 0) {
      ReportFailure(a, abort, completed + 1);
      live = 0;
    }
    if (live) told = LoadVolatile32(&a.own_control->abort);
    if (live && blockIdx.x == 0) {
      // The count before the claim, compared only at the end (CheckAlone):
      // adding 1 here made the thread wait for the atomic's round trip
      // before the block's barrier (SASS).
      started_before = atomicAdd(reinterpret_cast<unsigned long long*>(&a.local->started), 1ull);
    }
    s_launch = completed + 1;
    s_live = live;
  }
  __syncthreads();
  const uint64_t launch = s_launch;
  return {launch, DataFlags(launch, a.signature), static_cast<int>(launch & 1), s_live != 0,
          started_before, told};
}

// Call headers: block 0's threads 0..world-1 each send the launch signature
// to one peer as an LL packet. Kernels that exchange flags compare every
// peer's at the end (CheckHeader); LL kernels carry the signature's tag in
// their data packets and read a header only to name a disagreement (Waiter).
__device__ inline void SendHeader(const ProtocolArgs& a, const LaunchContext& ctx) {
  const int peer = threadIdx.x;
  if (blockIdx.x != 0 || peer >= a.world || peer == a.rank) return;
  WritePacket(HeaderSlot(a, peer, ctx.launch, a.rank), static_cast<uint32_t>(a.signature),
              static_cast<uint32_t>(a.signature >> 32), HeaderFlags(ctx.launch));
}

// Every kernel's start: the launch context, and false (after `fill_outputs()`
// wrote the all-ones outputs) when the launch may not run; a live launch
// has sent its call header.
template <typename FillOutputs>
__device__ __forceinline__ bool StartLaunch(const ProtocolArgs& a, LaunchContext& ctx,
                                            FillOutputs&& fill_outputs) {
  ctx = BeginLaunch(a);
  if (!ctx.live) {
    fill_outputs();
    return false;
  }
  SendHeader(a, ctx);
  return true;
}

// Block 0, thread 0, before FinishLaunch: if another launch of this
// communicator claimed a number meanwhile, two launches ran at once on this
// device (XLA scheduled two calls concurrently) and both may have used the
// same buffers: the communicator fails instead of returning mixed data.
__device__ inline void CheckAlone(const ProtocolArgs& a, const LaunchContext& ctx) {
  if (blockIdx.x == 0 && threadIdx.x == 0 && ctx.started_before + 1 != ctx.launch) {
    Abort(a, EncodeAbort(kConcurrent, a.rank, a.rank, a.operation), ctx.launch);
  }
}

// Every block, last thing (all threads): block b stores the new count in
// counters b, b + G, b + 2G, ... (G blocks), so that every counter a block
// of the next launch may read holds it, whatever that launch's grid, and no
// counter is written by two blocks of one launch: no block waits for
// another, and none needs to know whether it is the last (no atomic, no
// fence; measured as fast as one counter that the last block stores after
// an atomic count, docs/latency_log.md). The next launch of the stream starts only
// once this one has finished. Thread 0 acts on the failure word that peers
// raise in this rank's workspace, as BeginLaunch read it: a launch whose
// data all arrived never polls long enough to see a failure a peer told
// this rank about (a peer may time out after sending), and the next
// launches must know the communicator broke. A word raised after that
// read is seen by the next launch (its start, or its first check of a
// wait, Waiter); one raised after the last launch's end never was.
__device__ inline void FinishLaunch(const ProtocolArgs& a, const LaunchContext& ctx) {
  CheckAlone(a, ctx);
  if (threadIdx.x == 0 && ctx.told != 0) Abort(a, ctx.told, ctx.launch);
  __syncthreads();
  for (uint32_t c = blockIdx.x + threadIdx.x * gridDim.x; c < kMaxBlocks;
       c += blockDim.x * gridDim.x) {
    StoreVolatile64(&a.local->completed[c], ctx.launch);
  }
}

template <typename Args>
__device__ inline void FillOutputs(const Args& a) {
  for (int i = 0; i < a.num_segments; ++i) FillBytes(a.segments[i].out, a.segments[i].bytes);
}

// Block 0's thread t (t < world, t != rank): waits for rank t's call header
// of this launch and compares it. Returns false if the wait was given up or
// the headers differ (the rank is then aborted).
__device__ inline bool CheckHeader(const ProtocolArgs& a, Waiter& waiter) {
  const int peer = threadIdx.x;
  if (blockIdx.x != 0 || peer >= a.world || peer == a.rank) return true;
  const LLPacket* slot = HeaderSlot(a, a.rank, waiter.launch(), peer);
  PacketRead h = ReadPacket(slot);
  if (!AwaitPacket(slot, HeaderFlags(waiter.launch()), h,
                   [&] { return waiter.KeepWaiting(peer); })) {
    return false;
  }
  return waiter.HeaderMatches(peer, h);
}

// Block-wide: raise this block's flag of `phase` at every peer once all of
// the block's stores for that phase are done.
__device__ __forceinline__ void SignalPeers(const ProtocolArgs& a, int phase, uint64_t launch) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    for (int i = 1; i < a.world; ++i) {
      const int peer = PeerAfter(a, i);
      StoreReleaseSys(&ControlOf(a.workspaces[peer])->flags[phase][a.rank][blockIdx.x], launch);
    }
  }
}

// Block-wide: wait until the same block of every peer has signalled `phase`.
// Returns false for the whole block if any wait was given up.
__device__ __forceinline__ bool WaitForPeers(const ProtocolArgs& a, int phase, Waiter& waiter) {
  bool ok = true;
  const int peer = threadIdx.x;
  if (peer < a.world && peer != a.rank) {
    const uint64_t* flag = &a.own_control->flags[phase][peer][blockIdx.x];
    while (LoadAcquireSys(flag) < waiter.launch()) {
      if (!waiter.KeepWaiting(peer)) {
        ok = false;
        break;
      }
    }
  }
  return __syncthreads_and(ok) != 0;
}

// Index of the segment holding packed offset x (< a.bytes); segments are
// contiguous in the packed range, so the one starting last at or before x.
// Args of one segment (every typed launch) know it at compile time: their
// input loads then wait for no load of num_segments or of a segment's
// fields by index, only for the kernel's parameters.
template <typename Args>
__device__ __forceinline__ int FindSegment(const Args& a, uint64_t x, int hint) {
  if constexpr (std::extent_v<decltype(Args::segments)> == 1) {
    return 0;
  } else {
    if (a.num_segments == 1) return 0;
    if (hint < a.num_segments && a.segments[hint].offset <= x &&
        (hint + 1 == a.num_segments || x < a.segments[hint + 1].offset)) {
      return hint;
    }
    int lo = 0, hi = a.num_segments - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (a.segments[mid].offset <= x) lo = mid; else hi = mid - 1;
    }
    return lo;
  }
}

// 16 bytes of a segment's input from byte `rel` on; bytes past its end read
// as zero. Partial or unaligned vectors go 2 bytes at a time (every element
// type is a multiple of 2 bytes and XLA aligns buffers to their element).
// Through L2, not the read-only path: an output may alias its input (a
// donated buffer), and every kernel reads an input vector before the same
// thread writes that output vector, which the read-only path does not allow.
__device__ __forceinline__ uint4 LoadSegment(const SegmentArg& s, uint64_t rel) {
  const auto* p = static_cast<const std::byte*>(s.in) + rel;
  const uint64_t valid = s.bytes - rel < 16 ? s.bytes - rel : 16;
  if (valid == 16 && s.aligned) return LoadShared16(p);
  uint32_t w[4] = {0, 0, 0, 0};
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  for (uint64_t k = 0; k < valid / 2; ++k) w[k / 2] |= static_cast<uint32_t>(h[k]) << (16 * (k % 2));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Stores the part of a vector that lies inside the segment's output.
__device__ __forceinline__ void StoreSegment(const SegmentArg& s, uint64_t rel, uint4 v) {
  auto* p = static_cast<std::byte*>(s.out) + rel;
  const uint64_t valid = s.bytes - rel < 16 ? s.bytes - rel : 16;
  if (valid == 16 && s.aligned) {
    Store16(p, v);
    return;
  }
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  auto* h = reinterpret_cast<uint16_t*>(p);
  for (uint64_t k = 0; k < valid / 2; ++k) h[k] = static_cast<uint16_t>(w[k / 2] >> (16 * (k % 2)));
}

}  // namespace jax_ar::gpu
