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
                                               PacketFlags flags, uint64_t region = 0) {
  for (int step = 1; step < a.world; ++step) {
    const int peer = PeerAfter(a, step);
    WritePacketPair(PacketSlot(a, peer, parity, slot_bytes, a.rank, region) + packet, data, flags);
  }
}

// Ranks whose packets one round of reads has in flight at once, by default:
// every peer of an 8-GPU node in one round trip (the protocol probe's
// packet stage; about 130 registers a thread). Every peer's at once was
// slower in the all-reduce kernels at every world size measured
// (docs/latency_log.md): the one-shot and the LL two-shot read one rank at a time
// at 2 ranks and two from 3 (all_reduce_kernels.cu kOneShotRanksInFlight,
// kTwoShotLLRanksInFlight), the fused kernels two.
inline constexpr int kRanksInFlight = 8;

// The vectors of ranks [base, base + kSize) at one place of their slots, as
// GatherRanks leaves them: Data(j) is rank base + j's 16 bytes (j < count).
template <int kWidth = kRanksInFlight>
struct RankBatch {
  static constexpr int kSize = kWidth;
  uint4 data[kWidth];
  int base;
  int count;
  __device__ __forceinline__ uint4 Data(int j) const { return data[j]; }
};

// Reads the packet pair of every rank of `pending` (bit j: rank base + j)
// at once, and moves the data of those that are of this launch into
// b.data, clearing their bits. The raw packets live only here, so what the
// caller holds while it waits is the data alone (registers: 8 in flight).
template <int kWidth, typename PairOf>
__device__ __forceinline__ void ReadPending(PairOf&& pair_of, PacketFlags flags, uint32_t& pending,
                                            RankBatch<kWidth>& b) {
  PacketRead lo[kWidth], hi[kWidth];
#pragma unroll
  for (int j = 0; j < kWidth; ++j) {
    if ((pending >> j) & 1u) {
      lo[j] = ReadPacket(pair_of(b.base + j));
      hi[j] = ReadPacket(pair_of(b.base + j) + 1);
    }
  }
#pragma unroll
  for (int j = 0; j < kWidth; ++j) {
    if (((pending >> j) & 1u) && lo[j].Fresh(flags) && hi[j].Fresh(flags)) {
      b.data[j] = PairData(lo[j], hi[j]);
      pending &= ~(1u << j);
    }
  }
}

// Fills `b` with the vectors of ranks [b.base, b.base + kRanksInFlight) at
// packet pair `packet` of their slots in `half` (this rank's LL half of this
// launch, plus a region), `mine` standing for this rank's own. The reads of
// every peer go out together, so data that has arrived costs one round
// trip for all of them, not one per peer. A packet that has not arrived is
// then awaited alone (one load in flight: polling every peer at once
// flooded the memory system while 8 ranks waited, 182 us instead of 60 at
// 256 KB), and once it is in, the peers still missing are read again
// together (each awaited alone in turn instead measured slower still at 2,
// 4 and 8 ranks, 2026-12-02, docs/latency_log.md). Every index into the
// batch is a compile-time constant (the rank awaited alone is matched by
// predicated moves), so it stays in registers, and the one spin loop is
// written once. False if a wait was given up (the rank is then aborted).
template <int kWidth>
__device__ __forceinline__ bool GatherRanks(const ProtocolArgs& a, const LLPacket* half,
                                            uint64_t slot_bytes, uint64_t packet, PacketFlags flags,
                                            Waiter& waiter, uint4 mine, RankBatch<kWidth>& b) {
  const uint64_t slot_packets = slot_bytes / sizeof(LLPacket);
  const auto pair_of = [&](int s) { return half + s * slot_packets + packet; };
  b.count = min(kWidth, a.world - b.base);
  uint32_t pending = 0;
#pragma unroll
  for (int j = 0; j < kWidth; ++j) {
    const int s = b.base + j;
    if (s == a.rank) {
      b.data[j] = mine;
    } else if (s < a.world) {
      pending |= 1u << j;
    }
  }
  ReadPending(pair_of, flags, pending, b);
  while (pending != 0) {
    // The first missing rank alone, until its pair is in.
    const int first = __ffs(pending) - 1;
    const LLPacket* p = pair_of(b.base + first);
    PacketRead lo = ReadPacket(p), hi = ReadPacket(p + 1);
    const auto keep_waiting = [&] { return waiter.KeepWaiting(b.base + first); };
    if (!AwaitPacket(p, flags, lo, keep_waiting) || !AwaitPacket(p + 1, flags, hi, keep_waiting)) {
      return false;
    }
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      if (j == first) b.data[j] = PairData(lo, hi);
    }
    pending &= pending - 1;
    // Then every rank still missing, read again together.
    if (pending != 0) ReadPending(pair_of, flags, pending, b);
  }
  return true;
}

// Every rank's 16-byte vector at packet pair `packet` (GatherRanks), handed
// to take(batch) kWidth ranks at a time, in rank order.
template <int kWidth = kRanksInFlight, typename TakeBatch>
__device__ __forceinline__ bool TakeInRankOrder(const ProtocolArgs& a, const LLPacket* half,
                                                uint64_t slot_bytes, uint64_t packet,
                                                PacketFlags flags, Waiter& waiter, uint4 mine,
                                                TakeBatch&& take) {
  for (int base = 0; base < a.world; base += kWidth) {
    RankBatch<kWidth> batch;
    batch.base = base;
    if (!GatherRanks<kWidth>(a, half, slot_bytes, packet, flags, waiter, mine, batch)) {
      return false;
    }
    take(static_cast<const RankBatch<kWidth>&>(batch));
  }
  return true;
}

}  // namespace jax_ar::gpu
