// The memory operations jax_ar's kernels build their protocols from, each
// with its ordering contract in one line.
#pragma once

#include <cstdint>

namespace jax_ar::gpu {

// Nanoseconds of the GPU's global timer; deadlines are measured with it.
__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// 16-byte store that is not cached in L1 and not merged or reordered with
// other volatile accesses of this thread; used for LL packets.
__device__ __forceinline__ void StoreVolatile16(void* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x),
               "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// 16-byte load that always goes to the memory system (sees peers' stores).
__device__ __forceinline__ uint4 LoadVolatile16(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ uint32_t LoadVolatile32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t LoadVolatile64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void StoreVolatile64(uint64_t* p, uint64_t v) {
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Acquire at system scope: accesses after it see everything the releasing
// thread (of any GPU or process) did before its matching release.
__device__ __forceinline__ uint64_t LoadAcquireSys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Release at system scope: publishes this thread's earlier accesses (and,
// after a __syncthreads, those of its block) to a matching acquire.
__device__ __forceinline__ void StoreReleaseSys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Read-only input of this kernel (an XLA buffer): through the read-only path.
__device__ __forceinline__ uint4 LoadInput16(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// Workspace data written by peers: cached in L2 only, never a stale L1 line.
__device__ __forceinline__ uint4 LoadShared16(const void* p) {
  return __ldcg(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ void Store16(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }

}  // namespace jax_ar::gpu
