// What every backend agrees on: the numbering of reduction ops, algorithms
// (both modules export them to Python: codes(), common/module_util.h) and
// operations, and the limits of a communicator.
#pragma once

#include <cstddef>
#include <cstdint>

namespace jax_ar {

// A group never spans more than one host, so 16 ranks covers every NVLink
// node we know of with room to spare; control blocks are sized by it.
inline constexpr int kMaxRanks = 16;

// Every buffer handed between ranks starts on a 16-byte boundary so that the
// GPU kernels can use 16-byte vector accesses and any 16-byte cut of a packed
// message falls between elements.
inline constexpr size_t kAlign = 16;

// The control block (epochs, flags, headers, error record) sits in the first
// 64 KB of every workspace; data follows.
inline constexpr size_t kControlBytes = 64 * 1024;

enum class ReduceOp : int32_t { kSum = 0, kAvg = 1, kMax = 2, kMin = 3 };
// The kernel an all_reduce call runs, as Python's plan chose it
// (jax_ar/ops/plan.py): kTwoShot is the plain two-shot, kTwoShotLL the
// two-shot over LL packets (CUDA only).
enum class Algorithm : int32_t { kOneShot = 1, kTwoShot = 2, kTwoShotLL = 3 };

// The public function a call serves. Part of every call signature (ranks
// making different operations on equal operands get an error, not each
// other's data), and named by every failure message. The GPU's failure
// record carries it in 3 bits (gpu/layout.h).
enum class Operation : uint32_t {
  kUnknown = 0,
  kAllReduce = 1,
  kReduceScatter = 2,
  kAllGather = 3,
  kAllReduceRmsNorm = 4,
};
inline constexpr uint32_t kMaxOperation = 4;

inline const char* OperationName(Operation operation) {
  switch (operation) {
    case Operation::kAllReduce: return "all_reduce";
    case Operation::kReduceScatter: return "reduce_scatter";
    case Operation::kAllGather: return "all_gather";
    case Operation::kAllReduceRmsNorm: return "all_reduce_rms_norm";
    case Operation::kUnknown: break;
  }
  return "a jax_ar call";
}

inline constexpr size_t AlignUp(size_t n, size_t a = kAlign) { return (n + a - 1) / a * a; }
inline constexpr size_t AlignDown(size_t n, size_t a = kAlign) { return n / a * a; }

inline const char* OpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

inline const char* AlgorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kOneShot: return "oneshot";
    case Algorithm::kTwoShot: return "twoshot";
    case Algorithm::kTwoShotLL: return "twoshot_ll";
  }
  return "?";
}

// FNV-1a, for call signatures that peers compare: the same on every rank and
// every build, unlike std::hash.
inline constexpr uint64_t kFnvOffset = 1469598103934665603ull;
inline constexpr uint64_t HashMix(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace jax_ar
