// The host backend's all-reduce protocol, the same one the CUDA kernels run:
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
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/ffi_util.h"
#include "common/protocol.h"
#include "host/rank_state.h"

namespace jax_ar::host {

// One array of the call: its input and output and where it sits in the
// packed message (arrays start on 16-byte boundaries there).
struct Segment {
  const std::byte* in = nullptr;
  std::byte* out = nullptr;
  size_t bytes = 0;
  ffi::DataType dtype = ffi::DataType::INVALID;
  size_t packed_offset = 0;
};

enum class Collective : uint32_t { kAllReduce, kReduceScatter, kAllGather };

inline const char* CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllGather: return "all_gather";
  }
  return "?";
}

// What a call says about itself in the header peers check.
struct CallIdentity {
  Collective collective = Collective::kAllReduce;
  size_t packed_bytes = 0;  // the whole message, all rounds
  uint64_t signature = 0;   // hash of everything ranks must agree on
  std::string description;  // human-readable form of the signature, for errors
};

struct Message : CallIdentity {
  Message(std::vector<Segment> segments, ReduceOp op, Algorithm algorithm, int world);

  std::vector<Segment> segments;
  ReduceOp op;
  Algorithm algorithm;
};

// A reduce-scatter or all-gather of one array split into `world` chunks of
// `chunk_bytes` each. Reduce-scatter: `in` holds every chunk (chunk j at
// j * chunk_bytes), `out` receives this rank's chunk reduced over all ranks.
// All-gather: `in` is this rank's chunk; `out` holds every rank's, in rank
// order. Chunks need not be 16-byte multiples.
struct ChunkCall : CallIdentity {
  ChunkCall(Collective collective, const std::byte* in, std::byte* out, size_t chunk_bytes,
            ffi::DataType dtype, ReduceOp op, int world);

  const std::byte* in;
  std::byte* out;
  size_t chunk_bytes;
  ffi::DataType dtype;
  ReduceOp op;  // reduce-scatter only
};

// Runs the whole call for this rank. A failure (a peer that never arrives, a
// peer in a different call) is recorded in `state`, so every later call of
// the communicator fails at once with the same message.
ffi::Error RunAllReduce(RankState& state, const Message& message);

// Runs a reduce-scatter or all-gather for this rank; failures as above.
ffi::Error RunChunkCollective(RankState& state, const ChunkCall& call);

// Builds the segments of a handler's operands; checks dtypes and sizes.
ffi::Error SegmentsFromBuffers(ffi::RemainingArgs args, ffi::RemainingRets rets,
                               std::vector<Segment>& segments);

}  // namespace jax_ar::host
