// LL exchanges of 16-byte vectors: how a thread sends one to every peer and
// how it takes every rank's in rank order. Slots: sender s's packets sit in
// slot s of the owner's LL half, slot_bytes apart; a 16-byte vector is the
// packet pair 2v, 2v + 1 of its slot.
#pragma once

#include <cstdint>

#include "gpu/launch_protocol.cuh"

namespace jax_ar::gpu {

// Sender `sender`'s slot in a region of rank `owner`'s LL half `parity`
// (`region` bytes into the half).
__device__ __forceinline__ LLPacket* PacketSlot(const ProtocolArgs& a, int owner, int parity,
                                                uint64_t slot_bytes, int sender,
                                                uint64_t region = 0) {
  return reinterpret_cast<LLPacket*>(LLHalf(a, owner, parity) + region + sender * slot_bytes);
}

// Sends 16 data bytes as packets `packet`, `packet + 1` of this rank's slot
// in every peer's LL half (after `region` bytes of it), starting with the
// next rank to spread the load.
__device__ __forceinline__ void SendPacketPair(const ProtocolArgs& a, int parity,
                                               uint64_t slot_bytes, uint64_t packet, uint4 data,
                                               uint32_t flag, uint64_t region = 0) {
  for (int step = 1; step < a.world; ++step) {
    const int peer = (a.rank + step) % a.world;
    WritePacketPair(PacketSlot(a, peer, parity, slot_bytes, a.rank, region) + packet, data, flag);
  }
}

// Ranks whose packets one round of reads has in flight at once.
inline constexpr int kRanksInFlight = 8;

// The 16-byte vectors of ranks [base, base + kRanksInFlight) at packet pair
// `packet` of their slots in `half` (this rank's LL half of this launch,
// plus a region): got[j] = rank base + j's, `mine` for this rank's; entries
// of ranks >= world are left alone. The reads of every peer go out
// together, so data that has arrived costs one round trip for all of them,
// not one per peer. A packet that has not arrived is then awaited alone
// (one load in flight: polling every peer at once flooded the memory
// system while 8 ranks waited, 182 us instead of 60 at 256 KB), and once it
// is in, the peers still missing are read again together. Every index into
// the register arrays is a compile-time constant (a rank chosen at run time
// is matched by predicated moves), so they stay in registers, and the one
// spin loop is written once. False if a wait was given up (the rank is
// then aborted).
__device__ __forceinline__ bool GatherRanks(const ProtocolArgs& a, const LLPacket* half,
                                            uint64_t slot_bytes, uint64_t packet, uint32_t flag,
                                            Waiter& waiter, int base, uint4 mine,
                                            uint4 (&got)[kRanksInFlight]) {
  const uint64_t slot_packets = slot_bytes / sizeof(LLPacket);
  const auto pair_of = [&](int s) { return half + s * slot_packets + packet; };
  const bool one_by_one = (a.experiment & kExpSequentialWait) != 0;
  PacketRead lo[kRanksInFlight] = {}, hi[kRanksInFlight] = {};  // zero: never fresh
  uint32_t pending = 0;
#pragma unroll
  for (int j = 0; j < kRanksInFlight; ++j) {
    const int s = base + j;
    if (s < a.world && s != a.rank) {
      if (!one_by_one) {
        lo[j] = ReadPacket(pair_of(s));
        hi[j] = ReadPacket(pair_of(s) + 1);
      }
      pending |= 1u << j;
    }
  }
  while (true) {
#pragma unroll
    for (int j = 0; j < kRanksInFlight; ++j) {
      if (((pending >> j) & 1u) && lo[j].Fresh(flag) && hi[j].Fresh(flag)) pending &= ~(1u << j);
    }
    if (pending == 0) break;
    // The first missing rank alone, until its pair is in.
    const int first = __ffs(pending) - 1;
    PacketRead l{}, h{};
#pragma unroll
    for (int j = 0; j < kRanksInFlight; ++j) {
      if (j == first) l = lo[j], h = hi[j];
    }
    const LLPacket* p = pair_of(base + first);
    const auto keep_waiting = [&] { return waiter.KeepWaiting(base + first); };
    if (!AwaitPacket(p, flag, l, keep_waiting) || !AwaitPacket(p + 1, flag, h, keep_waiting)) {
      return false;
    }
    // Then every rank still missing, read again together (A/B variant: none;
    // each is awaited in its turn).
#pragma unroll
    for (int j = 0; j < kRanksInFlight; ++j) {
      if (j == first) {
        lo[j] = l, hi[j] = h;
      } else if (((pending >> j) & 1u) && !one_by_one) {
        lo[j] = ReadPacket(pair_of(base + j));
        hi[j] = ReadPacket(pair_of(base + j) + 1);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kRanksInFlight; ++j) {
    const int s = base + j;
    if (s == a.rank) {
      got[j] = mine;
    } else if (s < a.world) {
      got[j] = PairData(lo[j], hi[j]);
    }
  }
  return true;
}

// Every rank's 16-byte vector at packet pair `packet` (GatherRanks), handed
// to take(base, got, count) a batch of kRanksInFlight ranks at a time, in
// rank order: got[j] is rank base + j's, j < count.
template <typename TakeBatch>
__device__ __forceinline__ bool TakeInRankOrder(const ProtocolArgs& a, const LLPacket* half,
                                                uint64_t slot_bytes, uint64_t packet,
                                                uint32_t flag, Waiter& waiter, uint4 mine,
                                                TakeBatch&& take) {
  for (int base = 0; base < a.world; base += kRanksInFlight) {
    uint4 got[kRanksInFlight];
    if (!GatherRanks(a, half, slot_bytes, packet, flag, waiter, base, mine, got)) return false;
    take(base, got, min(kRanksInFlight, a.world - base));
  }
  return true;
}

}  // namespace jax_ar::gpu
