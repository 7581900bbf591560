// LL packets: how a thread sends 16 bytes to every peer and waits for
// theirs. A packet carries 8 data bytes and, next to each 4-byte word, the
// launch's flag (layout.h LLPacket), so data that arrived is data that is
// valid: no separate flag, no fence.
#pragma once

#include <cstdint>

#include "gpu/launch_protocol.cuh"

namespace jax_ar::gpu {

// LL slot of `sender` in rank `owner`'s LL half `parity` (slot_bytes each).
__device__ __forceinline__ LLPacket* PacketSlot(const ProtocolArgs& a, int owner, int parity,
                                                uint64_t slot_bytes, int sender) {
  return reinterpret_cast<LLPacket*>(LLHalf(a, owner, parity) + sender * slot_bytes);
}

// Sends 16 data bytes as LL packets `packet` and `packet + 1` of slot `rank`
// in every peer's LL half (after `region` bytes of it), starting with the
// next rank to spread the load.
__device__ __forceinline__ void SendPacketPair(const ProtocolArgs& a, int parity,
                                               uint64_t slot_bytes, uint64_t packet, uint4 data,
                                               uint32_t flag, uint64_t region = 0) {
  const uint4 lo = make_uint4(data.x, flag, data.y, flag);
  const uint4 hi = make_uint4(data.z, flag, data.w, flag);
  for (int step = 1; step < a.world; ++step) {
    const int peer = (a.rank + step) % a.world;
    auto* dst = reinterpret_cast<LLPacket*>(LLHalf(a, peer, parity) + region +
                                            a.rank * slot_bytes) + packet;
    StoreVolatile16(dst, lo);
    StoreVolatile16(dst + 1, hi);
  }
}

// The 16 data bytes of LL packets p[0], p[1]; zeros and ok=false if the
// wait is given up.
__device__ __forceinline__ uint4 ReadPacketPair(const LLPacket* p, uint32_t flag, Waiter& waiter,
                                                int peer, bool& ok) {
  if (!ok) return make_uint4(0, 0, 0, 0);
  uint4 lo = LoadVolatile16(p);
  uint4 hi = LoadVolatile16(p + 1);
  while (lo.y != flag || lo.w != flag) {
    if (!waiter.KeepWaiting(peer)) {
      ok = false;
      return make_uint4(0, 0, 0, 0);
    }
    lo = LoadVolatile16(p);
  }
  while (hi.y != flag || hi.w != flag) {
    if (!waiter.KeepWaiting(peer)) {
      ok = false;
      return make_uint4(0, 0, 0, 0);
    }
    hi = LoadVolatile16(p + 1);
  }
  return make_uint4(lo.x, lo.z, hi.x, hi.z);
}

// Rank `sender`'s 16 bytes at packet pair `packet` of this launch, as one-shot
// reduces them: `mine` for this rank, else its LL packets in this rank's LL
// half (waited for; zeros and ok=false if the wait is given up).
__device__ __forceinline__ uint4 PacketPairFrom(const ProtocolArgs& a, int sender, uint4 mine,
                                                int parity, uint64_t slot_bytes, uint64_t packet,
                                                uint32_t flag, Waiter& waiter, bool& ok) {
  if (sender == a.rank) return mine;
  return ReadPacketPair(PacketSlot(a, a.rank, parity, slot_bytes, sender) + packet, flag, waiter,
                        sender, ok);
}

// Every peer's 16 bytes at packet pair `packet` of its slot in this rank's
// LL half (`base` = that half, `slot_bytes` apart). The first round issues
// every peer's loads before checking any, so data that has arrived costs one
// round trip, not one per peer; then the thread spins on one missing packet
// at a time (one load in flight, as a plain LL reader: polling every peer at
// once flooded the memory system while 8 ranks waited, 182 us instead of 60
// at 256 KB) and looks at the others again once that one is in. got[s] receives rank
// s's data (got[rank] is left alone). With `header_peer` >= 0 the thread
// also awaits that peer's call header and compares it with this launch's
// signature. False if a wait was given up or the headers differ (the rank is
// then aborted). kMaxWorld bounds the world size; arrays of it stay in
// registers because every index is a compile-time constant.
template <int kMaxWorld>
__device__ __forceinline__ bool AwaitPeerPackets(const ProtocolArgs& a, const std::byte* base,
                                                 uint64_t slot_bytes, uint64_t packet,
                                                 uint32_t flag, Waiter& waiter, int header_peer,
                                                 uint4 (&got)[kMaxWorld]) {
  uint4 hi[kMaxWorld];
  uint32_t pending = 0;
#pragma unroll
  for (int s = 0; s < kMaxWorld; ++s) {
    if (s < a.world && s != a.rank) {
      const auto* p = reinterpret_cast<const LLPacket*>(base + s * slot_bytes) + packet;
      got[s] = LoadVolatile16(p);
      hi[s] = LoadVolatile16(p + 1);
      pending |= 1u << s;
    }
  }
  const LLPacket* header =
      header_peer >= 0 ? &ControlOf(a.workspaces[a.rank])->headers[waiter.launch() & 1][header_peer]
                       : nullptr;
  uint4 h = header != nullptr ? LoadVolatile16(header) : make_uint4(0, 0, 0, 0);
  while (true) {
#pragma unroll
    for (int s = 0; s < kMaxWorld; ++s) {
      if (((pending >> s) & 1u) && got[s].y == flag && got[s].w == flag && hi[s].y == flag &&
          hi[s].w == flag) {
        pending &= ~(1u << s);
        got[s] = make_uint4(got[s].x, got[s].z, hi[s].x, hi[s].z);
      }
    }
    if (header != nullptr && h.y == flag && h.w == flag) {
      const uint64_t theirs = (static_cast<uint64_t>(h.z) << 32) | h.x;
      if (theirs != a.signature) {
        Abort(a, EncodeAbort(kMismatch, a.rank, header_peer, a.operation,
                             static_cast<Operation>(SignatureOperation(theirs))),
              waiter.launch());
        return false;
      }
      header = nullptr;
    }
    if (pending == 0 && header == nullptr) return true;
    // Spin on the first missing packet pair (or the header) alone, one
    // load in flight: its first packet, then its second.
    if (pending != 0) {
      const int s = __ffs(pending) - 1;
      const auto* p = reinterpret_cast<const LLPacket*>(base + s * slot_bytes) + packet;
      for (int half = 0; half < 2; ++half) {
        uint4 v = LoadVolatile16(p + half);
        while (v.y != flag || v.w != flag) {
          if (!waiter.KeepWaiting(s)) return false;
          v = LoadVolatile16(p + half);
        }
      }
    } else {
      while (h.y != flag || h.w != flag) {
        if (!waiter.KeepWaiting(header_peer)) return false;
        h = LoadVolatile16(header);
      }
      continue;
    }
    // One more round over everything still missing (the spun-on pair too).
#pragma unroll
    for (int s = 0; s < kMaxWorld; ++s) {
      if ((pending >> s) & 1u) {
        const auto* p = reinterpret_cast<const LLPacket*>(base + s * slot_bytes) + packet;
        got[s] = LoadVolatile16(p);
        hi[s] = LoadVolatile16(p + 1);
      }
    }
    if (header != nullptr) h = LoadVolatile16(header);
  }
}

}  // namespace jax_ar::gpu
