// The LL packet (layout.h LLPacket) as a device type: how one is written,
// read once, and read with a deadline. Every kernel that moves data or call
// headers as LL packets goes through these, so the flag test lives in one
// place.
//
// A packet carries 8 data bytes, each 4-byte word beside a flag word,
// stored with one 16-byte volatile store. 8-byte halves land atomically
// (within a GPU and over NVLink), so a reader that sees both flag words it
// expects holds both data words of this launch: no fence, no separate flag,
// no sentinel value in the data.
//
// The flag words (PacketFlags): the first is the launch's flag (LaunchFlag),
// so a packet of an older launch never passes. The second is that flag
// xor-ed with a 32-bit tag of the call's signature (CallTag), so a peer that
// made a different call in the same launch writes packets this launch never
// takes: agreement arrives with the data, and no launch waits for its
// peers' call headers. (A waiter that gets stuck reads the header to name
// the disagreement, launch_protocol.cuh.) Two different calls pass each
// other's packets only if their tags are equal (2^-32); a packet read while
// half of it is still an older launch's passes only if the older call's tag
// differs from this one's by exactly the xor of the two launches' flags.
#pragma once

#include <cstdint>

#include "gpu/layout.h"
#include "gpu/ptx.cuh"

namespace jax_ar::gpu {

// The flag words a launch's packets carry (see above).
struct PacketFlags {
  uint32_t launch;  // LaunchFlag(launch)
  uint32_t call;    // launch ^ CallTag(signature); call headers: launch
};

__device__ __forceinline__ uint32_t CallTag(uint64_t signature) {
  return static_cast<uint32_t>(signature) ^ static_cast<uint32_t>(signature >> 32);
}

// The flags of launch `launch`'s data packets for the call `signature`.
__device__ __forceinline__ PacketFlags DataFlags(uint64_t launch, uint64_t signature) {
  const uint32_t flag = LaunchFlag(launch);
  return {flag, flag ^ CallTag(signature)};
}

// The flags of launch `launch`'s call headers, which carry the signature
// itself.
__device__ __forceinline__ PacketFlags HeaderFlags(uint64_t launch) {
  const uint32_t flag = LaunchFlag(launch);
  return {flag, flag};
}

// Stores 8 data bytes (lo, hi) as the packet at `p`.
__device__ __forceinline__ void WritePacket(LLPacket* p, uint32_t lo, uint32_t hi,
                                            PacketFlags flags) {
  StoreVolatile16(p, make_uint4(lo, flags.launch, hi, flags.call));
}

// Stores 16 data bytes as the packet pair p[0], p[1].
__device__ __forceinline__ void WritePacketPair(LLPacket* p, uint4 data, PacketFlags flags) {
  WritePacket(p, data.x, data.y, flags);
  WritePacket(p + 1, data.z, data.w, flags);
}

// One packet as it was read, not yet known to be of this launch.
struct PacketRead {
  uint4 raw;
  __device__ __forceinline__ bool Fresh(PacketFlags flags) const {
    return raw.y == flags.launch && raw.w == flags.call;
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
__device__ __forceinline__ bool AwaitPacket(const LLPacket* p, PacketFlags flags, PacketRead& r,
                                            KeepWaiting&& keep_waiting) {
  while (!r.Fresh(flags)) {
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
