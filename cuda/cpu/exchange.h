// The CPU backend's all-reduce protocol, the same one the CUDA kernels run:
//
//   one-shot  every rank pushes its whole input into its slot of every peer's
//             workspace, raises its flag there, waits for all flags, and
//             reduces the slots in rank order 0..N-1;
//   two-shot  reduce-scatter (rank j receives everybody's j-th chunk and
//             reduces it), then all-gather (rank j pushes its reduced chunk to
//             everybody).
//
// Epochs count calls, live in the workspace and are advanced by the call
// itself; data alternates between two halves of the workspace by epoch
// parity, which is enough because no rank can start call e+2 before every
// peer has finished reading call e. Messages larger than the workspace run
// in several rounds, each a full protocol instance with its own epoch.
//
// Faults (rank_health.h): a rank that fails records why in its own control
// block, and a rank that closes says so there; a rank waiting for a peer
// stops at once when the peer (or any other rank) has failed, when the peer
// has closed, or when the peer's process has exited, and otherwise at its
// deadline. A rank never returns the result of a call in which a peer
// failed.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/ffi_util.h"
#include "common/protocol.h"
#include "cpu/rank_health.h"  // the lifecycle calls (InitControlBlock ... CallsNeverMade)
#include "cpu/rank_state.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace jax_ar::cpu {

// XLA:CPU runs its threads with subnormals flushed to zero; jax_ar's results
// must be exact for every bit pattern, so reductions (and any arithmetic a
// handler does on their results, such as a fused residual add) run inside
// one of these.
class KeepSubnormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  static constexpr unsigned kFlushBits = 0x8040;  // MXCSR flush-to-zero | denormals-are-zero
  KeepSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~kFlushBits); }
  ~KeepSubnormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#elif defined(__aarch64__)
  static constexpr uint64_t kFlushBit = 1ull << 24;  // FPCR.FZ
  KeepSubnormals() {
    __asm__ volatile("mrs %0, fpcr" : "=r"(saved_));
    const uint64_t cleared = saved_ & ~kFlushBit;
    __asm__ volatile("msr fpcr, %0" : : "r"(cleared));
  }
  ~KeepSubnormals() { __asm__ volatile("msr fpcr, %0" : : "r"(saved_)); }

 private:
  uint64_t saved_;
#endif
};

// One array of the call: its input and output and where it sits in the
// packed message (arrays start on 16-byte boundaries there).
struct Segment {
  const std::byte* in = nullptr;
  std::byte* out = nullptr;
  size_t bytes = 0;
  ffi::DataType dtype = ffi::DataType::INVALID;
  size_t packed_offset = 0;
};

// Bytes of one slot: a sender's share of a data half (one-shot), or of its
// phase (two-shot).
size_t SlotBytes(const RankState& state, Algorithm algorithm);

// The largest packed range one round of `algorithm` carries.
size_t RoundCapacity(const RankState& state, Algorithm algorithm);

// `operation` is the public call the exchange serves; its name is part of
// the signature, so ranks making different calls with equal operands get an
// error, not each other's data, and it begins the description.
struct Message {
  Message(std::vector<Segment> segments, ReduceOp op, Algorithm algorithm, int world,
          Operation operation = Operation::kAllReduce);

  std::vector<Segment> segments;
  ReduceOp op;
  Algorithm algorithm;
  Operation operation;
  size_t packed_bytes = 0;
  uint64_t signature = 0;
  std::string description;  // "all_reduce sum oneshot of float32[4]"
};

// Runs the whole call for this rank. A failure (a peer that never arrives, a
// peer in a different call, a peer that failed) is recorded in `state` and
// published to the peers, so every later call of the communicator, on every
// rank, fails at once.
ffi::Error RunAllReduce(RankState& state, const Message& message);

// Either half of two-shot on its own, for a message of one segment split
// into `world` chunks of `chunk_bytes` each (not necessarily 16-byte
// multiples). Reduce-scatter: the segment's input holds every chunk (chunk
// j at j * chunk_bytes) and its output receives this rank's chunk reduced
// over all ranks in rank order. All-gather: the input is this rank's chunk
// and the output holds every rank's, in rank order. Failures as above.
enum class ChunkHalf { kReduceScatter, kAllGather };
ffi::Error RunChunkCollective(RankState& state, const Message& message, ChunkHalf half,
                              size_t chunk_bytes);

// Builds the segments of a handler's operands; checks dtypes and sizes.
ffi::Error SegmentsFromBuffers(ffi::RemainingArgs args, ffi::RemainingRets rets,
                               std::vector<Segment>& segments);

}  // namespace jax_ar::cpu
