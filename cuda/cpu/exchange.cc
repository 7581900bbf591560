#include "cpu/exchange.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "common/failure_text.h"
#include "common/handler_args.h"
#include "cpu/numeric.h"
#include "cpu/rank_health.h"

namespace jax_ar::cpu {

size_t SlotBytes(const RankState& state, Algorithm algorithm) {
  const size_t slots = algorithm == Algorithm::kOneShot ? state.world : 2 * state.world;
  return AlignDown(state.half_bytes() / slots);
}

size_t RoundCapacity(const RankState& state, Algorithm algorithm) {
  const size_t slot = SlotBytes(state, algorithm);
  return algorithm == Algorithm::kOneShot ? slot : slot * state.world;
}
namespace {

CallSite SiteOf(const RankState& state, const Message& message, uint64_t epoch) {
  return {message.description, state.label, state.rank, epoch};
}

// Slot `sender` of `phase` in rank `owner`'s data half for `epoch`.
std::byte* Slot(const RankState& state, int owner, uint64_t epoch, Algorithm algorithm,
                int phase, int sender) {
  const size_t slot = SlotBytes(state, algorithm);
  return state.data_half(owner, epoch) + (static_cast<size_t>(phase) * state.world + sender) * slot;
}

// Calls fn(segment, lo, hi) for the part [lo, hi) of each segment's packed
// bytes that falls inside [begin, end).
template <typename Fn>
void ForEachOverlap(const Message& message, size_t begin, size_t end, Fn&& fn) {
  for (const Segment& s : message.segments) {
    const size_t lo = std::max(begin, s.packed_offset);
    const size_t hi = std::min(end, s.packed_offset + s.bytes);
    if (lo < hi) fn(s, lo, hi);
  }
}

// Copies the inputs' bytes of packed range [begin, end) to dst (= offset begin).
void GatherInputs(const Message& message, size_t begin, size_t end, std::byte* dst) {
  ForEachOverlap(message, begin, end, [&](const Segment& s, size_t lo, size_t hi) {
    std::memcpy(dst + (lo - begin), s.in + (lo - s.packed_offset), hi - lo);
  });
}

// Copies packed range [begin, end) from src (= offset begin) to the outputs.
void ScatterOutputs(const Message& message, size_t begin, size_t end, const std::byte* src) {
  ForEachOverlap(message, begin, end, [&](const Segment& s, size_t lo, size_t hi) {
    std::memcpy(s.out + (lo - s.packed_offset), src + (lo - begin), hi - lo);
  });
}

template <typename Traits>
void ReduceElements(ReduceOp op, int world, const std::byte* const* sources, size_t offset,
                    std::byte* dst, size_t count) {
  using Storage = typename Traits::Storage;
  using Acc = typename Traits::Acc;
  constexpr size_t kBlock = 256;
  Acc acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t n = std::min(kBlock, count - base);
    const auto* first = reinterpret_cast<const Storage*>(sources[0] + offset) + base;
    for (size_t i = 0; i < n; ++i) acc[i] = Traits::Load(first[i]);
    for (int s = 1; s < world; ++s) {  // fixed rank order: identical bits on every rank
      const auto* src = reinterpret_cast<const Storage*>(sources[s] + offset) + base;
      for (size_t i = 0; i < n; ++i) acc[i] = Combine(op, acc[i], Traits::Load(src[i]));
    }
    auto* out = reinterpret_cast<Storage*>(dst) + base;
    if constexpr (std::is_floating_point_v<Acc>) {
      if (op == ReduceOp::kAvg) {
        for (size_t i = 0; i < n; ++i) acc[i] = acc[i] / static_cast<Acc>(world);
      }
    }
    for (size_t i = 0; i < n; ++i) out[i] = Traits::Store(acc[i]);
  }
}

template <typename Fn>
void DispatchDtype(ffi::DataType dtype, Fn&& fn) {
  switch (dtype) {
    case ffi::DataType::F32: fn(F32Traits{}); break;
    case ffi::DataType::BF16: fn(Bf16Traits{}); break;
    case ffi::DataType::F16: fn(F16Traits{}); break;
    case ffi::DataType::S32: fn(S32Traits{}); break;
    default: break;  // rejected when the message was built
  }
}

// Reduces packed range [begin, end) over all senders (sources[s] = offset
// begin of sender s's copy). With `packed_dst` the result goes there (=
// offset begin), otherwise straight into the outputs.
void ReduceRange(const Message& message, int world, size_t begin, size_t end,
                 const std::byte* const* sources, std::byte* packed_dst) {
  ForEachOverlap(message, begin, end, [&](const Segment& s, size_t lo, size_t hi) {
    std::byte* dst = packed_dst != nullptr ? packed_dst + (lo - begin)
                                           : s.out + (lo - s.packed_offset);
    const size_t count = (hi - lo) / DtypeBytes(s.dtype);
    DispatchDtype(s.dtype, [&](auto traits) {
      ReduceElements<decltype(traits)>(message.op, world, sources, lo - begin, dst, count);
    });
  });
}

class Round {
 public:
  Round(RankState& state, const Message& message, size_t begin, size_t end, uint32_t index,
        uint32_t count)
      : state_(state), message_(message), begin_(begin), end_(end) {
    uint64_t& calls = state.control(state.rank).epoch;
    epoch_ = calls + 1;
    StoreRelease(calls, epoch_);
    header_.epoch = epoch_;
    header_.signature = message.signature;
    header_.packed_bytes = message.packed_bytes;
    header_.round = index;
    header_.rounds = count;
    std::snprintf(header_.description, sizeof(header_.description), "%s",
                  message.description.c_str());
  }

  ffi::Error OneShot() {
    const int world = state_.world;
    for (int i = 1; i <= world; ++i) {  // start with the next rank to spread the load
      const int peer = (state_.rank + i) % world;
      GatherInputs(message_, begin_, end_,
                   Slot(state_, peer, epoch_, Algorithm::kOneShot, 0, state_.rank));
      Deliver(peer, /*phase=*/0);
    }
    const std::byte* sources[kMaxRanks];
    for (int s = 0; s < world; ++s) {
      if (auto error = WaitFor(s, /*phase=*/0); error.failure()) return error;
      sources[s] = Slot(state_, state_.rank, epoch_, Algorithm::kOneShot, 0, s);
    }
    ReduceRange(message_, world, begin_, end_, sources, nullptr);
    return ffi::Error::Success();
  }

  ffi::Error TwoShot() {
    const int world = state_.world;
    const int rank = state_.rank;
    const size_t chunk = AlignUp((end_ - begin_ + world - 1) / world);
    auto chunk_begin = [&](int j) { return std::min(end_, begin_ + j * chunk); };
    auto chunk_end = [&](int j) { return std::min(end_, begin_ + (j + 1) * chunk); };

    // Reduce-scatter: my j-th chunk goes to rank j.
    for (int i = 1; i <= world; ++i) {
      const int peer = (rank + i) % world;
      GatherInputs(message_, chunk_begin(peer), chunk_end(peer),
                   Slot(state_, peer, epoch_, Algorithm::kTwoShot, 0, rank));
      Deliver(peer, 0);
    }
    const std::byte* sources[kMaxRanks];
    for (int s = 0; s < world; ++s) {
      if (auto error = WaitFor(s, 0); error.failure()) return error;
      sources[s] = Slot(state_, rank, epoch_, Algorithm::kTwoShot, 0, s);
    }
    std::byte* reduced = Slot(state_, rank, epoch_, Algorithm::kTwoShot, 1, rank);
    ReduceRange(message_, world, chunk_begin(rank), chunk_end(rank), sources, reduced);

    // All-gather: my reduced chunk goes to every peer's slot `rank`.
    const size_t my_bytes = chunk_end(rank) - chunk_begin(rank);
    for (int i = 1; i <= world; ++i) {
      const int peer = (rank + i) % world;
      if (peer != rank) {
        std::memcpy(Slot(state_, peer, epoch_, Algorithm::kTwoShot, 1, rank), reduced, my_bytes);
      }
      Deliver(peer, 1);
    }
    for (int s = 0; s < world; ++s) {
      if (auto error = WaitFor(s, 1); error.failure()) return error;
      ScatterOutputs(message_, chunk_begin(s), chunk_end(s),
                     Slot(state_, rank, epoch_, Algorithm::kTwoShot, 1, s));
    }
    return ffi::Error::Success();
  }

  // Either half of two-shot alone, on bytes [offset, offset + bytes) of
  // every chunk (RunChunkCollective); one phase, one slot per sender.
  ffi::Error ReduceScatterChunks(size_t chunk_bytes, size_t offset, size_t bytes) {
    const int world = state_.world;
    const int rank = state_.rank;
    const Segment& s = message_.segments[0];
    for (int i = 1; i <= world; ++i) {  // my part of chunk j goes to rank j
      const int peer = (rank + i) % world;
      std::memcpy(Slot(state_, peer, epoch_, Algorithm::kOneShot, 0, rank),
                  s.in + peer * chunk_bytes + offset, bytes);
      Deliver(peer, 0);
    }
    const std::byte* sources[kMaxRanks];
    for (int sender = 0; sender < world; ++sender) {
      if (auto error = WaitFor(sender, 0); error.failure()) return error;
      sources[sender] = Slot(state_, rank, epoch_, Algorithm::kOneShot, 0, sender);
    }
    DispatchDtype(s.dtype, [&](auto traits) {
      ReduceElements<decltype(traits)>(message_.op, world, sources, 0, s.out + offset,
                                       bytes / DtypeBytes(s.dtype));
    });
    return ffi::Error::Success();
  }

  ffi::Error AllGatherChunks(size_t chunk_bytes, size_t offset, size_t bytes) {
    const int world = state_.world;
    const int rank = state_.rank;
    const Segment& s = message_.segments[0];
    for (int i = 1; i <= world; ++i) {  // my chunk goes to every rank
      const int peer = (rank + i) % world;
      std::memcpy(Slot(state_, peer, epoch_, Algorithm::kOneShot, 0, rank), s.in + offset, bytes);
      Deliver(peer, 0);
    }
    for (int sender = 0; sender < world; ++sender) {
      if (auto error = WaitFor(sender, 0); error.failure()) return error;
      std::memcpy(s.out + sender * chunk_bytes + offset,
                  Slot(state_, rank, epoch_, Algorithm::kOneShot, 0, sender), bytes);
    }
    return ffi::Error::Success();
  }

 private:
  // Publishes this rank's data for `phase` to `peer`: header, then the flag
  // with release order so the peer that sees the flag sees the data.
  void Deliver(int peer, int phase) {
    Mailbox& box = state_.control(peer).mailboxes[state_.rank];
    if (phase == 0) box.headers[epoch_ & 1] = header_;
    StoreRelease(box.flags[phase], epoch_);
  }

  // Waits for `sender`'s data of `phase`; in phase 0 its call must be this
  // rank's (same signature and round).
  ffi::Error WaitFor(int sender, int phase) {
    const Mailbox& box = state_.control(state_.rank).mailboxes[sender];
    if (auto error = WaitForFlag(state_, box.flags[phase], epoch_, sender, message_.description);
        error.failure()) {
      return error;
    }
    if (phase == 0) {
      const CallHeader& theirs = box.headers[epoch_ & 1];
      if (theirs.signature != header_.signature || theirs.round != header_.round ||
          theirs.rounds != header_.rounds || theirs.packed_bytes != header_.packed_bytes) {
        const std::string their_call(theirs.description,
                                     strnlen(theirs.description, sizeof(theirs.description)));
        return FailCall(state_, epoch_, ffi::ErrorCode::kFailedPrecondition,
                        MismatchText(SiteOf(state_, message_, epoch_), sender, their_call));
      }
    }
    return ffi::Error::Success();
  }

  RankState& state_;
  const Message& message_;
  size_t begin_, end_;
  uint64_t epoch_ = 0;
  CallHeader header_{};
};

}  // namespace

Message::Message(std::vector<Segment> segs, ReduceOp op_, Algorithm algorithm_, int world,
                 Operation operation_)
    : segments(std::move(segs)), op(op_), algorithm(algorithm_), operation(operation_) {
  const char* name = OperationName(operation);
  uint64_t hash = kFnvOffset;
  for (const char* c = name; *c != '\0'; ++c) hash = HashMix(hash, static_cast<uint8_t>(*c));
  hash = HashMix(hash, static_cast<uint64_t>(op));
  hash = HashMix(hash, static_cast<uint64_t>(algorithm));
  hash = HashMix(hash, static_cast<uint64_t>(world));
  description = std::string(name) + " " + OpName(op) + " " + AlgorithmName(algorithm) + " of";
  for (Segment& s : segments) {
    s.packed_offset = packed_bytes;
    packed_bytes += AlignUp(s.bytes);
    hash = HashMix(HashMix(hash, static_cast<uint64_t>(s.dtype)), s.bytes);
    if (description.size() < 80) {
      description += std::string(" ") + DtypeName(s.dtype) + "[" +
                     std::to_string(s.bytes / std::max<size_t>(1, DtypeBytes(s.dtype))) + "]";
    }
  }
  if (segments.size() > 1) description += " (" + std::to_string(segments.size()) + " arrays)";
  signature = hash;
}

namespace {

// What every call does around its rounds (a rank that failed earlier never
// gets here: FindRank refuses it): fail at once on a rank that was closed
// meanwhile, or whose peer failed (that peer will not take part); one call
// at a time per rank; subnormals kept; and never a result from a call in
// which a peer failed (after sending its part, e.g. at its deadline).
template <typename RunRounds>
ffi::Error RunCall(RankState& state, const Message& message, RunRounds&& run_rounds) {
  std::lock_guard<std::mutex> lock(state.call_mutex);
  const uint64_t first_epoch = state.control(state.rank).epoch + 1;
  auto fail_because_of_peer = [&](const PeerFailure& failed) {
    return FailCall(state, first_epoch, ffi::ErrorCode::kAborted,
                    PeerFailedText(SiteOf(state, message, first_epoch), failed.peer,
                                   failed.core));
  };
  if (HealthOf(state, state.rank) == RankHealth::kClosed) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jax_ar: " + ClosedText(SiteOf(state, message, first_epoch)) + ".");
  }
  if (PeerFailure failed = FailedPeer(state); failed.peer >= 0) {
    return fail_because_of_peer(failed);
  }
  KeepSubnormals keep_subnormals;
  if (ffi::Error error = run_rounds(); error.failure()) return error;
  const uint64_t last = state.control(state.rank).epoch;
  if (PeerFailure failed = FailedPeer(state, last); failed.peer >= 0) {
    return fail_because_of_peer(failed);
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::Error RunAllReduce(RankState& state, const Message& message) {
  return RunCall(state, message, [&]() -> ffi::Error {
    const size_t capacity = RoundCapacity(state, message.algorithm);
    if (capacity == 0) {
      return Internal("workspace too small for " + std::to_string(state.world) + " ranks");
    }
    const size_t total = message.packed_bytes;
    const uint32_t rounds =
        static_cast<uint32_t>(std::max<size_t>(1, (total + capacity - 1) / capacity));
    for (uint32_t r = 0; r < rounds; ++r) {
      const size_t begin = static_cast<size_t>(r) * capacity;
      const size_t end = std::min(total, begin + capacity);
      Round round(state, message, begin, end, r, rounds);
      ffi::Error error =
          message.algorithm == Algorithm::kOneShot ? round.OneShot() : round.TwoShot();
      if (error.failure()) return error;
    }
    return ffi::Error::Success();
  });
}

ffi::Error RunChunkCollective(RankState& state, const Message& message, ChunkHalf half,
                              size_t chunk_bytes) {
  return RunCall(state, message, [&]() -> ffi::Error {
    // One sender's slot bounds what a round carries of each chunk.
    const size_t slot = SlotBytes(state, Algorithm::kOneShot);
    if (slot == 0) {
      return Internal("workspace too small for " + std::to_string(state.world) + " ranks");
    }
    const uint32_t rounds =
        static_cast<uint32_t>(std::max<size_t>(1, (chunk_bytes + slot - 1) / slot));
    for (uint32_t r = 0; r < rounds; ++r) {
      const size_t offset = std::min(chunk_bytes, static_cast<size_t>(r) * slot);
      const size_t bytes = std::min(slot, chunk_bytes - offset);
      Round round(state, message, offset, offset + bytes, r, rounds);
      ffi::Error error = half == ChunkHalf::kReduceScatter
                             ? round.ReduceScatterChunks(chunk_bytes, offset, bytes)
                             : round.AllGatherChunks(chunk_bytes, offset, bytes);
      if (error.failure()) return error;
    }
    return ffi::Error::Success();
  });
}

ffi::Error SegmentsFromBuffers(ffi::RemainingArgs args, ffi::RemainingRets rets,
                               std::vector<Segment>& segments) {
  segments.clear();
  segments.reserve(args.size());
  return ForEachAllReduceOperand(args, rets, [&](ffi::AnyBuffer in, ffi::AnyBuffer out) {
    Segment s;
    s.in = static_cast<const std::byte*>(in.untyped_data());
    s.out = static_cast<std::byte*>(out.untyped_data());
    s.bytes = in.size_bytes();
    s.dtype = in.element_type();
    segments.push_back(s);
    return ffi::Error::Success();
  });
}

}  // namespace jax_ar::cpu
