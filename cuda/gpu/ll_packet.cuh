// The LL packet (layout.h LLPacket) as a device type: how one is written,
// read once, and read with a deadline. Every kernel that moves data or call
// headers as LL packets goes through these, so the flag test lives in one
// place.
//
// A packet carries 8 data bytes, each 4-byte word beside a copy of the
// launch's flag, stored with one 16-byte volatile store. 8-byte halves land
// atomically (within a GPU and over NVLink), so a reader that sees both
// flags equal to its launch's flag holds both data words of this launch:
// no fence, no separate flag, no sentinel value in the data.
#pragma once

#include <cstdint>

#include "gpu/layout.h"
#include "gpu/ptx.cuh"

namespace jax_ar::gpu {

// Stores 8 data bytes (lo, hi) as the packet at `p`.
__device__ __forceinline__ void WritePacket(LLPacket* p, uint32_t lo, uint32_t hi, uint32_t flag) {
  StoreVolatile16(p, make_uint4(lo, flag, hi, flag));
}

// Stores 16 data bytes as the packet pair p[0], p[1].
__device__ __forceinline__ void WritePacketPair(LLPacket* p, uint4 data, uint32_t flag) {
  WritePacket(p, data.x, data.y, flag);
  WritePacket(p + 1, data.z, data.w, flag);
}

// One packet as it was read, not yet known to be of this launch.
struct PacketRead {
  uint4 raw;
  __device__ __forceinline__ bool Fresh(uint32_t flag) const {
    return raw.y == flag && raw.w == flag;
  }
  __device__ __forceinline__ uint32_t Lo() const { return raw.x; }
  __device__ __forceinline__ uint32_t Hi() const { return raw.z; }
};

// Issues one read of the packet at `p` (the load is in flight until the
// result is used).
__device__ __forceinline__ PacketRead ReadPacket(const LLPacket* p) { return {LoadVolatile16(p)}; }

// The 16 data bytes of a pair whose packets both passed Fresh.
__device__ __forceinline__ uint4 PairData(const PacketRead& lo, const PacketRead& hi) {
  return make_uint4(lo.Lo(), lo.Hi(), hi.Lo(), hi.Hi());
}

// Re-reads `r` (the packet at `p`) until it is of this launch; false if
// `keep_waiting()` gives up first. keep_waiting is consulted before each
// re-read, so a fresh packet costs no call.
template <typename KeepWaiting>
__device__ __forceinline__ bool AwaitPacket(const LLPacket* p, uint32_t flag, PacketRead& r,
                                            KeepWaiting&& keep_waiting) {
  while (!r.Fresh(flag)) {
    if (!keep_waiting()) return false;
    r = ReadPacket(p);
  }
  return true;
}

// The 64-bit value a call header packet carries (SendHeader).
__device__ __forceinline__ uint64_t PacketValue(const PacketRead& r) {
  return (static_cast<uint64_t>(r.Hi()) << 32) | r.Lo();
}

}  // namespace jax_ar::gpu
