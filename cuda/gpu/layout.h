// What the host and the kernels of the CUDA backend agree on: the layout of a
// workspace, the per-device control words, the failure record, and the
// arguments of one kernel launch. Plain structs only; no CUDA headers, so
// both the host compiler and nvcc read this file.
//
// A workspace (one per rank, cudaMalloc'd, peers map it through CUDA IPC or
// peer access):
//
//   [0, kControlBytes)   PeerControl: what peers write to this rank (call
//                        headers, two-shot flags, the P2P probe, the abort
//                        word)
//   LL region            two halves (a quarter of the data area) for LL
//                        packets: one-shot launches
//   plain region         two halves (the rest) for plain data behind flags:
//                        two-shot launches
//
// A launch uses the half of its launch number's parity in its region. The
// regions never overlap: plain data left by a two-shot launch could hold,
// by chance, the flag words a later LL launch waits for, and would be read
// as fresh packets.
//
// Per-launch counters do not live in the workspace but in LocalControl, in a
// table of the module's own device memory that is never freed: a kernel
// replayed from a CUDA graph after close() finds its token gone and touches
// no workspace (see all_reduce_kernels.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/protocol.h"

namespace jax_ar::gpu {

// Kernels of all ranks must be resident at the same time (they spin on each
// other), also when several ranks share one GPU under MPS. A budget of 128
// blocks over all ranks keeps every block of every rank resident on any
// GPU with 128 or more SMs even at one block per SM; each launch gets its
// share, decided from the world size alone so every rank agrees.
inline constexpr int kMaxBlocksAllRanks = 128;
inline constexpr int kMaxBlocks = 64;  // per launch; sizes the flag arrays

inline constexpr int BlockCap(int world) {
  const int share = kMaxBlocksAllRanks / (world > 0 ? world : 1);
  return share < 1 ? 1 : (share > kMaxBlocks ? kMaxBlocks : share);
}

// The one-shot gives each thread one vector in blocks of kOneShotThreads
// (two fit an SM) while the block budget allows, then blocks of
// kOneShotMaxThreads, then of kOneShotWideThreads once 256 a block would
// give a thread more than one vector (8 ranks from 128 KB, 4 from 256 KB,
// 2 from 512 KB): each vector a thread holds costs it a round trip. The
// one-shot reads one or two ranks' packets at a time (76-80 and 95-104
// registers a thread in the typed instances, so 512-thread blocks need no
// spills). Measured on the H200: docs/latency_log.md.
inline constexpr int kOneShotThreads = 128;
inline constexpr int kOneShotMaxThreads = 256;
inline constexpr int kOneShotWideThreads = 512;
inline constexpr int kTwoShotThreads = 512;

// Arrays one launch carries; a call with more leaves takes several launches.
inline constexpr int kMaxSegmentsPerLaunch = 48;

// Communicators that may be registered on one device at a time.
inline constexpr int kMaxLiveSlots = 64;

struct DataLayout {
  uint64_t ll_half;     // bytes of one LL half
  uint64_t plain_half;  // bytes of one plain half
};

inline constexpr DataLayout LayoutOf(uint64_t workspace_bytes) {
  const uint64_t data = workspace_bytes - kControlBytes;
  const uint64_t ll_half = AlignDown(data / 8);
  return {ll_half, AlignDown((data - 2 * ll_half) / 2)};
}

// LL ("low latency") packet: 8 bytes of data, each 4-byte word stored next to
// a copy of the launch's flag, written with one 16-byte store. A reader that
// sees both flags equal to its own launch's flag holds valid data, whatever
// the data bits are: no sentinel value, so -0.0 and NaN payloads pass
// unchanged. (8-byte halves are written atomically over NVLink and within
// a GPU; the flag in each half covers the word next to it.)
struct alignas(16) LLPacket {
  uint32_t data0;
  uint32_t flag0;
  uint32_t data1;
  uint32_t flag1;
};

// Written by peers into this rank's workspace.
struct alignas(128) PeerControl {
  // Set (compare-and-swap from 0) by a peer that gave up: this rank stops
  // waiting at once instead of running into its own deadline.
  uint32_t abort;
  uint32_t reserved[31];
  // Call headers: the signature of the sender's launch, per launch parity
  // and sender, as LL packets so that no separate flag is needed.
  LLPacket headers[2][kMaxRanks];
  // Two-shot: flags[phase][sender][block] = the last launch whose data that
  // sender's block has fully stored here (release order after the data).
  uint64_t flags[2][kMaxRanks][kMaxBlocks];
  // P2P probe at setup: probe[sender] = a token derived from the
  // communicator id, written by the sender through its mapping.
  uint64_t probe[kMaxRanks];
};
static_assert(sizeof(PeerControl) <= kControlBytes, "peer control block outgrew its region");

// Per rank, in the module's never-freed device table (one slot per rank).
struct alignas(64) LocalControl {
  uint64_t token;    // identifies the registration; 0 once closed
  uint64_t started;  // launches claimed; differs from completed + 1 only if two overlap
  uint32_t abort;     // encoded failure (EncodeAbort), 0 while healthy
  uint32_t reported;  // the failure record has been written
  // launches finished, one counter per block index (launch_protocol.cuh)
  uint64_t completed[kMaxBlocks];
};

// Failure kinds, in LocalControl::abort / PeerControl::abort and the record.
// `culprit` is the rank that found the failure, `peer` the rank it blamed.
// A rank that learns of a failure from a peer records the peer's kind with
// kToldByPeer added.
enum FailureKind : uint32_t {
  kHealthy = 0,
  kTimeout = 1,     // culprit waited for peer past its deadline
  kMismatch = 2,    // peer's call differs from culprit's (launch signatures)
  kConcurrent = 3,  // two launches of the communicator overlapped on culprit
  kToldByPeer = 0x80,
};

// An abort code, one 32-bit word so that it is set with one compare-and-swap
// at every peer: kind, culprit, peer, the culprit's operation and (for a
// mismatch) the peer's, as far as its signature tells (failure_text.h words
// them). Bit 0 is set, so no code is 0 (healthy).
inline constexpr uint32_t EncodeAbort(uint32_t kind, int culprit, int peer,
                                      Operation culprit_operation,
                                      Operation peer_operation = Operation::kUnknown) {
  return (kind << 24) | ((static_cast<uint32_t>(culprit) & 0xff) << 16) |
         ((static_cast<uint32_t>(peer) & 0xff) << 8) |
         ((static_cast<uint32_t>(peer_operation) & 7u) << 4) |
         ((static_cast<uint32_t>(culprit_operation) & 7u) << 1) | 1u;
}
static_assert(kMaxOperation <= 7, "abort codes carry operations in 3 bits");
inline constexpr uint32_t AbortKind(uint32_t code) { return code >> 24; }
inline constexpr int AbortCulprit(uint32_t code) { return (code >> 16) & 0xff; }
inline constexpr int AbortPeer(uint32_t code) { return (code >> 8) & 0xff; }
inline constexpr uint32_t AbortCulpritOperation(uint32_t code) { return (code >> 1) & 7u; }
inline constexpr uint32_t AbortPeerOperation(uint32_t code) { return (code >> 4) & 7u; }
// The same failure as a peer learns it.
inline constexpr uint32_t ToldByPeer(uint32_t code) { return code | (kToldByPeer << 24); }

// In host-mapped memory: the kernel that first notices a failure fills it,
// the host reads it (kind last written, first read) to raise an error.
// Operations are Operation values (0: not known).
struct FailureRecord {
  uint32_t kind;
  int32_t rank;
  int32_t culprit;
  int32_t peer;
  uint64_t launch;
  uint32_t operation;          // of this rank's launch that recorded it
  uint32_t culprit_operation;  // of the culprit's launch
  uint32_t peer_operation;     // a mismatch's peer's, from its signature
};

// Call signatures carry the launch's operation in their top byte (the rest
// is a hash of the call), so a rank whose peer's signature differs can name
// the peer's operation.
inline constexpr uint64_t SignatureOf(Operation operation, uint64_t call_hash) {
  return (call_hash & 0x00ff'ffff'ffff'ffffull) | (static_cast<uint64_t>(operation) << 56);
}
inline constexpr uint32_t SignatureOperation(uint64_t signature) {
  const uint32_t operation = static_cast<uint32_t>(signature >> 56);
  return operation <= kMaxOperation ? operation : 0u;
}

// Element types the kernels reduce.
enum class Dtype : int32_t { kF32 = 0, kBF16 = 1, kF16 = 2, kS32 = 3 };

// One array's part of a launch: its bytes [offset, offset + bytes) of the
// launch's packed range (offset a multiple of 16).
struct SegmentArg {
  const void* in;
  void* out;
  uint64_t offset;
  uint64_t bytes;
  Dtype dtype;
  int32_t aligned;  // in and out are 16-byte aligned: vector loads/stores
};

// What every launch's protocol needs (launch_protocol.cuh).
struct ProtocolArgs {
  std::byte* workspaces[kMaxRanks];  // as this device addresses them; [rank] is ours
  // workspaces[rank]'s control block, where peers raise the failure word. A
  // launch's start reads the word; through workspaces[a.rank] its address
  // took two dependent constant loads (the second indexed by the rank) on
  // thread 0's way to the block's barrier (SASS; docs/latency_log.md "Latency, ninth
  // push").
  PeerControl* own_control;
  LocalControl* local;               // our slot of the never-freed table
  FailureRecord* record;             // host-mapped, device address
  uint64_t token;                    // must equal local->token, else the launch is stale
  uint64_t timeout_ns;
  uint64_t signature;   // SignatureOf(operation, ...), compared with every peer's
  uint64_t ll_half_bytes;     // LayoutOf(workspace bytes)
  uint64_t plain_half_bytes;
  int32_t rank;
  int32_t world;
  Operation operation;  // the public call this launch serves, for failure records
};

// One launch of the all-reduce kernels, carrying up to kSegments arrays.
// Kernel parameters are copied at every launch (also on CUDA-graph replay),
// so a launch of one array passes AllReduceArgs<1> (about 300 bytes), not
// room for kMaxSegmentsPerLaunch (2 KB; measured +0.26 us per launch).
template <int kSegments>
struct AllReduceArgs : ProtocolArgs {
  uint64_t bytes;              // packed bytes of this launch (a multiple of 16)
  uint64_t slot_bytes;         // bytes of one sender's slot in a data half
  uint64_t chunk_bytes;        // two-shot: bytes each rank reduces
  uint64_t vectors_per_block;  // two-shot: 16-byte vectors of a chunk per block
  int32_t op;                  // ReduceOp
  int32_t num_segments;
  SegmentArg segments[kSegments];
};
using LaunchArgs = AllReduceArgs<kMaxSegmentsPerLaunch>;

// One launch of the fused all-reduce + residual + RMSNorm kernels: `rows`
// rows of `hidden` elements starting at the given pointers. One-shot: every
// rank sends all its rows (LL packets, slot per sender of
// rows * row_bytes * 2 bytes) and normalizes all rows. Two-shot: rank j owns
// rows [j * group_rows, (j + 1) * group_rows); phase 0 sends each group's x
// to its owner (phase0_slot_bytes per sender), the owner reduces and
// normalizes, phase 1 sends both outputs of the group to everybody
// (phase1_slot_bytes per sender: residual_out rows, then out rows; over LL
// packets, the LL two-shot, residual_out and each row's inverse RMS, all
// in slots of slot_bytes). Rows of
// the call fall into groups of rows_per_group (vmap over stacked layers):
// row r of the launch (row first_row + r of the call) uses row
// (first_row + r) / rows_per_group of gamma, post_gamma and bias.
struct RmsNormLaunchArgs : ProtocolArgs {
  const void* x;
  const void* residual;     // residual_dtype: x's type, or float32
  const float* gamma;       // [groups, hidden]
  const float* post_gamma;  // [groups, hidden]; null: no post-norm
  const float* bias;        // [groups, hidden]; null: no bias
  const float* scale;       // read only when quantize
  void* out;                // x's type, or float8_e4m3fn when quantize
  void* residual_out;       // residual_dtype
  int64_t rows;
  int64_t first_row;       // of this launch, within the call
  int64_t rows_per_group;  // >= 1
  int32_t groups;          // rows of gamma (1 outside vmap)
  int64_t group_rows;      // two-shot
  int64_t rows_per_block;  // two-shot: rows of a group each block covers
  uint64_t slot_bytes;          // one-shot
  uint64_t phase0_slot_bytes;   // two-shot
  uint64_t phase1_slot_bytes;   // two-shot
  uint64_t out_offset;          // two-shot: where out rows start in a phase-1 slot
  int32_t row_vectors;      // hidden / lanes
  int32_t threads_per_row;  // power of two; blockDim.x / threads_per_row rows at a time
  int32_t blocks_per_row;   // one-shot: > 1 when a row spans a cluster of blocks
  float eps;
  int32_t quantize;
  Dtype dtype;
  Dtype residual_dtype;
};

// The LL flag of a launch: never 0, the value of freshly zeroed memory.
inline constexpr uint32_t LaunchFlag(uint64_t launch) {
  return static_cast<uint32_t>(launch % 0xffffffffull) + 1u;
}

}  // namespace jax_ar::gpu
