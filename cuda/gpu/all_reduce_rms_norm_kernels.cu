// Fused all-reduce + residual add + RMSNorm (+ FP8 output), one kernel per
// launch for both algorithms. Per row, in float32:
//
//   t            = sum of x over ranks (rank order), + bias if given
//   with post_gamma: t = t * inverse_rms(t) * post_gamma   (Gemma 2/3 post-norm)
//   residual_out = round(t + float32(residual))   (the residual's type R)
//   v            = float32(residual_out)
//   out          = round(v * inverse_rms(v) * gamma),
//                  or float8_e4m3fn(saturate(that / scale)) with quantize
//
// gamma, post_gamma and bias are float32 (Python added scale_offset); R is
// x's type or, beside 16-bit x, float32. A group of threads_per_row threads
// (a power of two) owns a row; each holds up to kVectors 16-byte vectors of
// it. one-shot: every rank sends its rows of x as LL packets to every peer
// and computes every row itself (the all-reduce kernel's protocol, row by
// row). two-shot: rows are split into `world` groups; each rank reduces and
// normalizes its group and sends its outputs to everybody (the two-shot
// protocol with rows for chunks): over LL packets where the handler takes
// them (kTwoShotLL: calls of up to 512 KB that fit one launch) residual_out
// and each row's inverse RMS, from which the readers make out, bit for bit
// the owner's; else both outputs over plain data and two rounds of flags.
//
// Both norms (one InverseRmsOfRow each, gpu/fused_norm_row.cuh): squares
// summed in float32 per thread and over the row, inv_rms = rsqrtf(sum /
// hidden + eps), then (v * inv_rms) * gamma in float32; a row whose float32
// sum cannot serve (overflow, a mean + eps near underflow, NaN) is summed in
// double and takes the CPU's formula, as jax_ar.rms_norm's CUDA kernel
// does for every row (gpu/row_norm.cuh). The post-norm keeps the
// row's float32 lanes in registers across its reduction, so it is a
// template parameter: kernels without it hold only the rounded residual
// stream, as before.
#include <cuda_runtime.h>

#include "gpu/fused_norm_row.cuh"
#include "gpu/kernels.h"
#include "gpu/load_kernels.h"
#include "gpu/packets.cuh"

namespace jax_ar::gpu {
namespace {

// Peers' packets of a row vector in flight at once (packets.cuh): the
// four-vector kernels' blocks of up to 1024 threads leave 64 registers a
// thread (row_plan.h FusedMaxThreads).
constexpr int kFusedRanksInFlight = 2;
// Ranks whose packets at one place the LL two-shot's phase 1 reads at once
// (measured when phase 1 carried both outputs' words). Eight
// spilled 0.5-1.4 KB a thread (ptxas); four took 0.1-0.5 us a call more
// than two at hidden 4096 (one cell 0.07 less) and -0.2..+2.5 at 8192 (16
// and 256 KB, 2, 4 and 8 ranks, one run each; docs/latency_log.md "Latency,
// twenty-first push").
constexpr int kPhase1RanksInFlight = 2;

// How many of a thread's vectors have their residual and gamma words loaded
// before the first reduce (NormalizeReducedRow); registers decide. One-shot,
// one or two vectors a thread: the first only, whose latency then hides
// behind the packet waits (the fused call ran 3.5 us above the one-shot
// all-reduce at 1 token without); holding the second's too, the two-vector
// kernels spilled 32-80 bytes a thread and ran up to 1.4 us slower at 8
// ranks (docs/latency_log.md "Latency, sixteenth push"). Two-shot: both of a
// two-vector thread, which holds no packets and spills nothing then; the
// first only ran 0.1-1.2 us slower at 2 ranks (hidden 8192, 256 KB-4 MB)
// and 0.7-2.5 at 4 ranks and 256 KB, with the runs overlapping at 4 ranks
// from 1 MB and at 8 ("seventeenth push"). Four vectors a thread: none
// (blocks of up to 1024 threads leave 64 registers a thread, row_plan.h).
template <int kVectors>
inline constexpr int kOneShotEarlyVectors = kVectors <= 2 ? 1 : 0;
template <int kVectors>
inline constexpr int kTwoShotEarlyVectors = kVectors <= 2 ? kVectors : 0;

// acc = the float32 sum, in rank order, of every rank's 16-byte vector at
// packet pair `packet` of its slot in `half` (this rank's LL half of the
// launch, plus a region; `mine` stands for this rank's own): a fused row
// vector's sum over ranks. Zeros, and false, when `ok` is false on entry
// or a wait was given up (the rank is then aborted).
template <Dtype D>
__device__ __forceinline__ bool SumRanksOfPacket(const RmsNormLaunchArgs& a, const LLPacket* half,
                                                 uint64_t slot_bytes, uint64_t packet,
                                                 PacketFlags flags, Waiter& waiter, uint4 mine,
                                                 bool ok, float* acc) {
  constexpr int kLanes = Vec<D>::kLanes;
#pragma unroll
  for (int j = 0; j < kLanes; ++j) acc[j] = 0.0f;
  return ok && TakeInRankOrder<kFusedRanksInFlight>(
                   a, half, slot_bytes, packet, flags, waiter, mine,
                   [&](const RankBatch<kFusedRanksInFlight>& batch) {
                     float next[kLanes];
#pragma unroll
                     for (int r = 0; r < kFusedRanksInFlight; ++r) {
                       if (r >= batch.count) break;
                       // Unpacked into `next` always, then added in
                       // registers: unpacking into `first ? acc : next` (a
                       // destination chosen at run time) kept acc in local
                       // memory, and calls of 32-128 tokens ran 1.3-1.4x
                       // slower at 4 and 8 ranks (docs/latency_log.md "Latency,
                       // thirteenth push").
                       const bool first = batch.base + r == 0;
                       Vec<D>::Unpack(batch.Data(r), next);
#pragma unroll
                       for (int j = 0; j < kLanes; ++j) {
                         acc[j] = first ? next[j] : __fadd_rn(acc[j], next[j]);
                       }
                     }
                   });
}

// kCluster: a row's threads span a cluster of a.blocks_per_row blocks, one
// row a cluster (row_plan.h PlanFusedClusterRow); otherwise a block works on
// blockDim.x / threads_per_row rows at once. kOut: kPlain or kFp8, as the
// launch's a.quantize (fused_norm_row.cuh OutKind).
template <Dtype D, Dtype R, bool kPostNorm, int kVectors, bool kCluster, OutKind kOut>
__global__ void __launch_bounds__(FusedMaxThreads(kVectors), 1) OneShotRmsNormKernel(
    const __grid_constant__ RmsNormLaunchArgs a) {
  static_assert(kOut != OutKind::kByLaunch, "a one-shot kernel is either kind's");
  using RL = ResidualLanes<D, R>;
  // Clustered rows: a slot for each of the row's sums (ClusterRowSum).
  // Rows of one block: partials' buffers, which the block's turns take in
  // alternation (InverseRmsOfRow).
  __shared__ RowSumScratch<kCluster> scratch[kCluster ? kRowSumSlots : kBlockRowSumBuffers];
  static_assert(kBlockRowSumBuffers == 2, "the turns below alternate two buffers");
  // The other blocks' stores into this block's slots wait for this
  // (ClusterWait below).
  if constexpr (kCluster) ReadyClusterRowSums(scratch, kRowSumSlots, a.threads_per_row / 32);
  const int tpr = a.threads_per_row;
  const int lane = RowLane<kCluster>(a);
  const int rows_at_once = kCluster ? 1 : blockDim.x / tpr;
  const int row_groups = kCluster ? gridDim.x / a.blocks_per_row : gridDim.x;
  const int row_group = kCluster ? blockIdx.x / a.blocks_per_row : blockIdx.x;
  const uint64_t row_bytes = static_cast<uint64_t>(a.row_vectors) * 16;
  const int64_t first_base = static_cast<int64_t>(row_group) * rows_at_once;
  const int64_t base_stride = static_cast<int64_t>(row_groups) * rows_at_once;
  // The first row's vectors stay in registers for its sum. They do not
  // depend on the launch number: their loads go out before BeginLaunch's,
  // so the two round trips overlap (as in the all-reduce one-shot).
  uint4 first_row[kVectors];
  {
    const int64_t row = first_base + RowInBlock(tpr);
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      const int i = lane + k * tpr;
      if (row < a.rows && i < a.row_vectors) {
        first_row[k] = LoadShared16(RowOf(a.x, row, row_bytes) + 16 * i);
      }
    }
  }
  // A launch that may not run fills its outputs. Its blocks return at once,
  // except in clusters: there every block takes part in the cluster barrier
  // and the row sums (ClusterRowSum), sending, awaiting and storing nothing
  // else, so that no block waits for one that left (the blocks of a launch
  // may disagree on running if a failure is recorded as they start).
  LaunchContext ctx;
  const bool live = StartLaunch(a, ctx, [&] { FillRmsNormOutputs<D, R>(a); });
  if (!kCluster && !live) return;
  const PacketFlags flags = ctx.flags;
  const int parity = ctx.parity;
  Waiter waiter(a, ctx.launch);
  bool ok = live;
  const float scale = Quantized<kOut>(a) ? __ldg(a.scale) : 1.0f;
  const uint64_t residual_row_bytes = ResidualRowBytes<D, R>(a);
  const int out_bytes = OutVectorBytes<D, kOut>(a);
  const LLPacket* half = PacketSlot(a, a.rank, parity, a.slot_bytes, 0);

  // Every row of this block goes out before the first wait: a block with
  // several rows then waits for one exchange, not one per row.
  for (int64_t base = first_base; live && base < a.rows; base += base_stride) {
    const int64_t row = base + RowInBlock(tpr);
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      const int i = lane + k * tpr;
      if (row >= a.rows || i >= a.row_vectors) continue;
      const uint4 v =
          base == first_base ? first_row[k] : LoadShared16(RowOf(a.x, row, row_bytes) + 16 * i);
      SendPacketPair(a, parity, a.slot_bytes, 2 * (row * a.row_vectors + i), v, flags);
    }
  }
  // Every block of the cluster has started and readied its slots: they may
  // be written. A cluster has one row (the launch has a cluster a row), so
  // its loop below runs once and each slot takes one sum.
  if constexpr (kCluster) ClusterWait();
  int turn = 0;
  for (int64_t base = first_base; base < a.rows; base += base_stride, ++turn) {
    const int64_t row = base + RowInBlock(tpr);
    const bool active = row < a.rows;
    uint4 mine[kVectors];
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      const int i = lane + k * tpr;
      if (!active || i >= a.row_vectors) continue;
      // Later rows from L2 (the loop above read them).
      mine[k] = base == first_base ? first_row[k] : LoadShared16(RowOf(a.x, row, row_bytes) + 16 * i);
    }
    NormalizeReducedRow<D, R, kPostNorm, kVectors, kCluster, kOneShotEarlyVectors<kVectors>,
                        /*kAlternatingScratch=*/!kCluster>(
        a, row, active, kCluster ? scratch : scratch + (turn & 1),
        [&](int k, int i, float* acc) {
          ok = SumRanksOfPacket<D>(a, half, a.slot_bytes, 2 * (row * a.row_vectors + i), flags,
                                   waiter, mine[k], ok, acc);
        },
        [&](int i, const uint4 (&words)[RL::kWords]) {
          if (ok) RL::Store(RowOf(a.residual_out, row, residual_row_bytes), i, words);
        },
        [&](int i, const float* y) {
          if (ok) StoreOut<D, kOut>(a, scale, y, RowOf(a.out, row, row_bytes / 16 * out_bytes) + out_bytes * i);
        });
  }
  if (live) FinishLaunch(a, ctx);
}

template <Dtype D, Dtype R, bool kPostNorm, int kVectors>
__global__ void __launch_bounds__(FusedMaxThreads(kVectors), 1) TwoShotRmsNormKernel(
    const __grid_constant__ RmsNormLaunchArgs a) {
  using RL = ResidualLanes<D, R>;
  __shared__ BlockRowSums partials;
  LaunchContext ctx;
  if (!StartLaunch(a, ctx, [&] { FillRmsNormOutputs<D, R>(a); })) return;
  const int parity = ctx.parity;
  Waiter waiter(a, ctx.launch);
  const float scale = a.quantize ? __ldg(a.scale) : 1.0f;
  const int tpr = a.threads_per_row;
  const int lane = RowLane</*kCluster=*/false>(a);
  const int rows_at_once = blockDim.x / tpr;
  const uint64_t row_bytes = static_cast<uint64_t>(a.row_vectors) * 16;
  const uint64_t residual_row_bytes = ResidualRowBytes<D, R>(a);
  const int residual_row_words = a.row_vectors * RL::kWords;
  const int out_bytes = OutVectorBytes<D>(a);
  const uint64_t out_row_bytes = static_cast<uint64_t>(a.row_vectors) * out_bytes;
  // This block's rows of a group: [lo, hi).
  const int64_t lo = blockIdx.x * a.rows_per_block;
  const int64_t hi = min(lo + a.rows_per_block, a.group_rows);
  const auto phase0 = [&](int owner, int sender) {
    return PlainHalf(a, owner, parity) + sender * a.phase0_slot_bytes;
  };
  const auto phase1 = [&](int owner, int sender) {
    return PlainHalf(a, owner, parity) + a.world * a.phase0_slot_bytes +
           sender * a.phase1_slot_bytes;
  };

  // Phase 0: my x rows of group j go to rank j.
  for (int step = 1; step < a.world; ++step) {
    const int peer = PeerAfter(a, step);
    for (int64_t base = lo; base < hi; base += rows_at_once) {
      const int64_t group_row = base + RowInBlock(tpr);
      const int64_t row = peer * a.group_rows + group_row;
      if (group_row >= hi || row >= a.rows) continue;
      for (int i = lane; i < a.row_vectors; i += tpr) {
        Store16(phase0(peer, a.rank) + group_row * row_bytes + 16 * i,
                LoadInput16(RowOf(a.x, row, row_bytes) + 16 * i));
      }
    }
  }
  SignalPeers(a, 0, ctx.launch);
  bool ok = WaitForPeers(a, 0, waiter);

  // My group: reduce, add the residual, normalize; both outputs go to my
  // outputs and to slot `rank` of every peer's phase-1 area.
  if (ok) {
    for (int64_t base = lo; base < hi; base += rows_at_once) {  // uniform: InverseRmsOfRow syncs
      const int64_t group_row = base + RowInBlock(tpr);
      const int64_t row = a.rank * a.group_rows + group_row;
      const bool active = group_row < hi && row < a.rows;
      NormalizeReducedRow<D, R, kPostNorm, kVectors, /*kCluster=*/false,
                          kTwoShotEarlyVectors<kVectors>>(
          a, row, active, &partials,
          [&](int, int i, float* acc) {
            const uint4 mine = LoadInput16(RowOf(a.x, row, row_bytes) + 16 * i);
            TypedAccumulator<D, SumLanes>::SumRanks(a.world, [&](int s) {
              if (s == a.rank) return mine;
              return LoadShared16(phase0(a.rank, s) + group_row * row_bytes + 16 * i);
            }, acc);
          },
          [&](int i, const uint4 (&words)[RL::kWords]) {
            RL::Store(RowOf(a.residual_out, row, residual_row_bytes), i, words);
            for (int step = 1; step < a.world; ++step) {
              RL::Store(phase1(PeerAfter(a, step), a.rank) + group_row * residual_row_bytes,
                        i, words);
            }
          },
          [&](int i, const float* y) {
            StoreOut<D>(a, scale, y, RowOf(a.out, row, out_row_bytes) + out_bytes * i);
            for (int step = 1; step < a.world; ++step) {
              std::byte* theirs = phase1(PeerAfter(a, step), a.rank) + a.out_offset +
                                  group_row * out_row_bytes + out_bytes * i;
              StoreOut<D>(a, scale, y, theirs);
            }
          });
    }
    SignalPeers(a, 1, ctx.launch);
    ok = WaitForPeers(a, 1, waiter);
  }

  // Phase 1: every other group's outputs into mine.
  if (ok) {
    for (int step = 1; step < a.world; ++step) {
      const int owner = PeerAfter(a, step);
      const std::byte* src = phase1(a.rank, owner);
      for (int64_t base = lo; base < hi; base += rows_at_once) {
        const int64_t group_row = base + RowInBlock(tpr);
        const int64_t row = owner * a.group_rows + group_row;
        if (group_row >= hi || row >= a.rows) continue;
        for (int w = lane; w < residual_row_words; w += tpr) {
          Store16(RowOf(a.residual_out, row, residual_row_bytes) + 16 * w,
                  LoadShared16(src + group_row * residual_row_bytes + 16 * w));
        }
        for (int i = lane; i < a.row_vectors; i += tpr) {
          const std::byte* from = src + a.out_offset + group_row * out_row_bytes + out_bytes * i;
          std::byte* to = RowOf(a.out, row, out_row_bytes) + out_bytes * i;
          if (out_bytes == 16) {
            Store16(to, LoadShared16(from));
          } else if (out_bytes == 8) {
            *reinterpret_cast<uint2*>(to) = __ldcg(reinterpret_cast<const uint2*>(from));
          } else {
            *reinterpret_cast<uint32_t*>(to) = __ldcg(reinterpret_cast<const unsigned int*>(from));
          }
        }
      }
    }
    CheckHeader(a, waiter);
  }
  FinishLaunch(a, ctx);
}

// The LL two-shot's packet pairs of a group row in phase 1: first the
// row's inverse RMS (the first of its 16 bytes), then vector i's
// residual_out words (RL::kWords) at 1 + i * RL::kWords. A reader makes
// out from residual_out and the inverse RMS as the owner did (bit for
// bit: NormalizeLanes), so out never travels: half the phase's packets
// for residuals of x's type.
template <Dtype D, Dtype R>
struct Phase1Pairs {
  static constexpr int kWords = ResidualLanes<D, R>::kWords;
  uint64_t row_pairs;
  __device__ explicit Phase1Pairs(int row_vectors)
      : row_pairs(static_cast<uint64_t>(row_vectors) * kWords + 1) {}
  __device__ uint64_t InverseRms(int64_t g) const { return g * row_pairs; }
  __device__ uint64_t Word(int64_t g, int i, int q) const {
    return g * row_pairs + 1 + static_cast<uint64_t>(i) * kWords + q;
  }
};

// The two-shot over LL packets, for rows of one or two vectors a thread
// that fit one launch (the handler decides, all_reduce_rms_norm.cc): the
// plain two-shot's split of rows into `world` groups, without its two
// rounds of flags. Rank j's LL half holds two regions of `world` slots of
// a.slot_bytes: phase 0, sender s's rows of group j (packet pair
// 2 * (g * row_vectors + i) for vector i of group row g); phase 1, sender
// s's residual_out and inverse RMS of group s (Phase1Pairs). Every rank
// sends those of every row of its group, zeros for rows past the call's
// last, so that whoever reads a place of the slots reads every rank's.
//
// kCluster: a group row's threads span a cluster of a.blocks_per_row blocks,
// one group row a cluster, as the one-shot's rows do (row_plan.h
// PlanFusedClusterRow); otherwise a block works on blockDim.x /
// threads_per_row rows at once.
template <Dtype D, Dtype R, bool kPostNorm, int kVectors, bool kCluster>
__global__ void __launch_bounds__(FusedMaxThreads(kVectors), 1) TwoShotLLRmsNormKernel(
    const __grid_constant__ RmsNormLaunchArgs a) {
  static_assert(kVectors <= 2, "the LL two-shot takes rows of one or two vectors a thread");
  static_assert(!kCluster || kVectors == 1, "clustered rows hold one vector a thread");
  using RL = ResidualLanes<D, R>;
  constexpr int kLanes = Vec<D>::kLanes;
  __shared__ RowSumScratch<kCluster> scratch[kCluster ? kRowSumSlots : 1];
  if constexpr (kCluster) ReadyClusterRowSums(scratch, kRowSumSlots, a.threads_per_row / 32);
  // As in the one-shot: a launch that may not run fills its outputs, and
  // in clusters its blocks still take part in the row sums, touching no
  // workspace.
  LaunchContext ctx;
  const bool live = StartLaunch(a, ctx, [&] { FillRmsNormOutputs<D, R>(a); });
  if (!kCluster && !live) return;
  const PacketFlags flags = ctx.flags;
  const int parity = ctx.parity;
  Waiter waiter(a, ctx.launch);
  const float scale = a.quantize ? __ldg(a.scale) : 1.0f;
  const int tpr = a.threads_per_row;
  const int lane = RowLane<kCluster>(a);
  const int rows_at_once = kCluster ? 1 : blockDim.x / tpr;
  const int row_group = kCluster ? blockIdx.x / a.blocks_per_row : blockIdx.x;
  const uint64_t row_bytes = static_cast<uint64_t>(a.row_vectors) * 16;
  const uint64_t residual_row_bytes = ResidualRowBytes<D, R>(a);
  const int out_bytes = OutVectorBytes<D>(a);
  const uint64_t out_row_bytes = static_cast<uint64_t>(a.row_vectors) * out_bytes;
  const uint64_t phase1 = static_cast<uint64_t>(a.world) * a.slot_bytes;
  // This block's (cluster's) rows of a group: [lo, hi).
  const int64_t lo = static_cast<int64_t>(row_group) * a.rows_per_block;
  const int64_t hi = min(lo + a.rows_per_block, a.group_rows);

  // Phase 0: my rows of group j go to rank j.
  for (int step = 1; live && step < a.world; ++step) {
    const int peer = PeerAfter(a, step);
    LLPacket* theirs = PacketSlot(a, peer, parity, a.slot_bytes, a.rank);
    for (int64_t base = lo; base < hi; base += rows_at_once) {
      const int64_t g = base + RowInBlock(tpr);
      const int64_t row = peer * a.group_rows + g;
      if (g >= hi || row >= a.rows) continue;  // rows past the last are never reduced
#pragma unroll
      for (int k = 0; k < kVectors; ++k) {
        const int i = lane + k * tpr;
        if (i < a.row_vectors) {
          WritePacketPair(theirs + 2 * (g * a.row_vectors + i),
                          LoadShared16(RowOf(a.x, row, row_bytes) + 16 * i), flags);
        }
      }
    }
  }

  // My group: reduce as the parts arrive, add the residual, normalize; both
  // outputs go to mine, and residual_out and the inverse RMS, as packets,
  // to every peer.
  const LLPacket* parts = PacketSlot(a, a.rank, parity, a.slot_bytes, 0);
  const Phase1Pairs<D, R> pairs(a.row_vectors);
  const auto send = [&](uint64_t pair, uint4 word) {
    SendPacketPair(a, parity, a.slot_bytes, 2 * pair, word, flags, phase1);
  };
  // Every block of the cluster has started and readied its slots (a
  // cluster has one group row: its loop below runs once).
  if constexpr (kCluster) ClusterWait();
  bool ok = live;
  for (int64_t base = lo; base < hi; base += rows_at_once) {  // uniform: the row sums sync
    const int64_t g = base + RowInBlock(tpr);
    const int64_t row = a.rank * a.group_rows + g;
    const bool active = g < hi && row < a.rows;
    uint4 mine[kVectors];
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      const int i = lane + k * tpr;
      if (active && i < a.row_vectors) mine[k] = LoadShared16(RowOf(a.x, row, row_bytes) + 16 * i);
    }
    const float inv_rms = NormalizeReducedRow<D, R, kPostNorm, kVectors, kCluster,
                                              kOneShotEarlyVectors<kVectors>>(
        a, row, active, scratch,
        [&](int k, int i, float* acc) {
          ok = SumRanksOfPacket<D>(a, parts, a.slot_bytes, 2 * (g * a.row_vectors + i), flags,
                                   waiter, mine[k], ok, acc);
        },
        [&](int i, const uint4 (&words)[RL::kWords]) {
          if (!ok) return;
          RL::Store(RowOf(a.residual_out, row, residual_row_bytes), i, words);
#pragma unroll
          for (int q = 0; q < RL::kWords; ++q) send(pairs.Word(g, i, q), words[q]);
        },
        [&](int i, const float* y) {
          if (ok) StoreOut<D>(a, scale, y, RowOf(a.out, row, out_row_bytes) + out_bytes * i);
        });
    if (ok && active && lane == 0) {
      send(pairs.InverseRms(g), make_uint4(__float_as_uint(inv_rms), 0, 0, 0));
    }
    // Rows of my group past the call's last: zeros, which their readers
    // take and drop.
    if (live && g < hi && row >= a.rows) {
      if (lane == 0) send(pairs.InverseRms(g), make_uint4(0, 0, 0, 0));
#pragma unroll
      for (int k = 0; k < kVectors; ++k) {
        const int i = lane + k * tpr;
        if (i >= a.row_vectors) continue;
#pragma unroll
        for (int q = 0; q < RL::kWords; ++q) send(pairs.Word(g, i, q), make_uint4(0, 0, 0, 0));
      }
    }
  }

  // Phase 1: every other group's rows into mine: residual_out as it came,
  // out made from it and the owner's inverse RMS. Every rank's packets at
  // one place of the slots are read at once (they have mostly arrived by
  // now), kPhase1RanksInFlight ranks at a time.
  const LLPacket* outputs = PacketSlot(a, a.rank, parity, a.slot_bytes, 0, phase1);
  const int hidden = a.row_vectors * kLanes;
  for (int64_t base = lo; base < hi && ok; base += rows_at_once) {
    const int64_t g = base + RowInBlock(tpr);
    if (g >= hi) continue;
    for (int first = 0; first < a.world && ok; first += kPhase1RanksInFlight) {
      RankBatch<kPhase1RanksInFlight> inverse;
      inverse.base = first;
      ok = GatherRanks(a, outputs, a.slot_bytes, 2 * pairs.InverseRms(g), flags, waiter,
                       make_uint4(0, 0, 0, 0), inverse);
#pragma unroll
      for (int k = 0; k < kVectors; ++k) {
        const int i = lane + k * tpr;
        if (!ok || i >= a.row_vectors) continue;
        RankBatch<kPhase1RanksInFlight> words[RL::kWords];
#pragma unroll
        for (int q = 0; q < RL::kWords; ++q) {
          words[q].base = first;
          ok = ok && GatherRanks(a, outputs, a.slot_bytes, 2 * pairs.Word(g, i, q), flags, waiter,
                                 make_uint4(0, 0, 0, 0), words[q]);
        }
        if (!ok) continue;
#pragma unroll
        for (int r = 0; r < kPhase1RanksInFlight; ++r) {
          const int s = first + r;
          const int64_t row = s * a.group_rows + g;
          if (r >= inverse.count || s == a.rank || row >= a.rows) continue;
          uint4 stored[RL::kWords];
#pragma unroll
          for (int q = 0; q < RL::kWords; ++q) stored[q] = words[q].Data(r);
          RL::Store(RowOf(a.residual_out, row, residual_row_bytes), i, stored);
          float v[kLanes], gamma[kLanes], y[kLanes];
          RL::Unpack(stored, v);
          LoadFloatLanes<kLanes>(GroupRow(a.gamma, RowGroup(a, row, true), hidden), i, gamma);
          NormalizeLanes<kLanes>(v, __uint_as_float(inverse.Data(r).x), gamma, y);
          StoreOut<D>(a, scale, y, RowOf(a.out, row, out_row_bytes) + out_bytes * i);
        }
      }
    }
  }
  if (live) FinishLaunch(a, ctx);
}

// A launch of `kernel` whose rows' threads span clusters of
// args.blocks_per_row blocks.
template <typename Kernel>
cudaError_t LaunchClustered(Kernel kernel, const RmsNormLaunchArgs& args, int blocks, int threads,
                            cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(args.blocks_per_row);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, args);
}

template <Dtype D, Dtype R, bool kPostNorm, int kVectors, OutKind kOut>
cudaError_t LaunchOneShot(const RmsNormLaunchArgs& args, int blocks, int threads,
                          cudaStream_t stream) {
  if (args.blocks_per_row == 1) {
    OneShotRmsNormKernel<D, R, kPostNorm, kVectors, false, kOut>
        <<<blocks, threads, 0, stream>>>(args);
    return cudaGetLastError();
  }
  if constexpr (kVectors == 1) {
    // A row spans a cluster of blocks, one vector a thread (row_plan.h
    // PlanFusedClusterRow).
    return LaunchClustered(OneShotRmsNormKernel<D, R, kPostNorm, kVectors, true, kOut>, args,
                           blocks, threads, stream);
  }
  return cudaErrorInvalidValue;  // the plan never clusters threads of more vectors
}

template <Dtype D, Dtype R, bool kPostNorm, int kVectors>
cudaError_t LaunchTyped(Algorithm algorithm, const RmsNormLaunchArgs& args, int blocks, int threads,
                        cudaStream_t stream) {
  if (algorithm == Algorithm::kTwoShot) {
    TwoShotRmsNormKernel<D, R, kPostNorm, kVectors><<<blocks, threads, 0, stream>>>(args);
    return cudaGetLastError();
  }
  if (algorithm == Algorithm::kTwoShotLL) {
    if constexpr (kVectors <= 2) {
      if (args.blocks_per_row == 1) {
        TwoShotLLRmsNormKernel<D, R, kPostNorm, kVectors, false>
            <<<blocks, threads, 0, stream>>>(args);
        return cudaGetLastError();
      }
      if constexpr (kVectors == 1) {
        return LaunchClustered(TwoShotLLRmsNormKernel<D, R, kPostNorm, kVectors, true>, args,
                               blocks, threads, stream);
      }
    }
    // The handler takes it for rows of up to two vectors a thread, and the
    // plan clusters only threads of one.
    return cudaErrorInvalidValue;
  }
  return args.quantize
             ? LaunchOneShot<D, R, kPostNorm, kVectors, OutKind::kFp8>(args, blocks, threads, stream)
             : LaunchOneShot<D, R, kPostNorm, kVectors, OutKind::kPlain>(args, blocks, threads,
                                                                         stream);
}

// Kernels hold one vector of a row per thread (rows of up to 512 vectors:
// hidden 4096 in 16-bit types), two (up to 1024: hidden 8192), or up to four
// (longer rows, row_plan.h PlanFusedRow). Three takes the four-vector
// kernel, whose lanes past the row stay idle: three instantiations instead
// of four (build time and module size; rows that long are rare and
// bandwidth-bound).
template <Dtype D, Dtype R, bool kPostNorm>
cudaError_t LaunchVectors(Algorithm algorithm, const RmsNormLaunchArgs& args, int blocks,
                          int threads, int vectors_per_thread, cudaStream_t stream) {
  switch (vectors_per_thread) {
    case 1: return LaunchTyped<D, R, kPostNorm, 1>(algorithm, args, blocks, threads, stream);
    case 2: return LaunchTyped<D, R, kPostNorm, 2>(algorithm, args, blocks, threads, stream);
    default:
      return LaunchTyped<D, R, kPostNorm, kMaxVectorsPerThread>(algorithm, args, blocks, threads,
                                                                stream);
  }
}

template <Dtype D, Dtype R>
cudaError_t LaunchPostNorm(Algorithm algorithm, const RmsNormLaunchArgs& args, int blocks,
                           int threads, int vectors_per_thread, cudaStream_t stream) {
  return args.post_gamma != nullptr
             ? LaunchVectors<D, R, true>(algorithm, args, blocks, threads, vectors_per_thread,
                                         stream)
             : LaunchVectors<D, R, false>(algorithm, args, blocks, threads, vectors_per_thread,
                                          stream);
}

// A residual of x's type, or (16-bit x) float32.
template <Dtype D>
cudaError_t LaunchResidual(Algorithm algorithm, const RmsNormLaunchArgs& args, int blocks,
                           int threads, int vectors_per_thread, cudaStream_t stream) {
  if constexpr (D != Dtype::kF32) {
    if (args.residual_dtype == Dtype::kF32) {
      return LaunchPostNorm<D, Dtype::kF32>(algorithm, args, blocks, threads, vectors_per_thread,
                                            stream);
    }
  }
  return LaunchPostNorm<D, D>(algorithm, args, blocks, threads, vectors_per_thread, stream);
}

// The one-shot kernels of one OutKind: those LaunchTyped takes.
template <Dtype D, Dtype R, bool kPostNorm, OutKind kOut>
cudaError_t LoadOneShot() {
  return LoadEach(OneShotRmsNormKernel<D, R, kPostNorm, 1, false, kOut>,
                  OneShotRmsNormKernel<D, R, kPostNorm, 2, false, kOut>,
                  OneShotRmsNormKernel<D, R, kPostNorm, kMaxVectorsPerThread, false, kOut>,
                  OneShotRmsNormKernel<D, R, kPostNorm, 1, true, kOut>);
}

template <Dtype D, Dtype R, bool kPostNorm>
cudaError_t LoadVariant() {
  for (const cudaError_t err :
       {LoadOneShot<D, R, kPostNorm, OutKind::kPlain>(),
        LoadOneShot<D, R, kPostNorm, OutKind::kFp8>(),
        LoadEach(TwoShotRmsNormKernel<D, R, kPostNorm, 1>,
                 TwoShotRmsNormKernel<D, R, kPostNorm, 2>,
                 TwoShotRmsNormKernel<D, R, kPostNorm, kMaxVectorsPerThread>,
                 TwoShotLLRmsNormKernel<D, R, kPostNorm, 1, false>,
                 TwoShotLLRmsNormKernel<D, R, kPostNorm, 2, false>,
                 TwoShotLLRmsNormKernel<D, R, kPostNorm, 1, true>)}) {
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <Dtype D, Dtype R>
cudaError_t LoadTyped() {
  if (const cudaError_t err = LoadVariant<D, R, false>(); err != cudaSuccess) return err;
  return LoadVariant<D, R, true>();
}

}  // namespace

cudaError_t LaunchAllReduceRmsNorm(Algorithm algorithm, const RmsNormLaunchArgs& args, int blocks,
                                   int threads, int vectors_per_thread, cudaStream_t stream) {
  switch (args.dtype) {
    case Dtype::kF32:
      return LaunchResidual<Dtype::kF32>(algorithm, args, blocks, threads, vectors_per_thread, stream);
    case Dtype::kBF16:
      return LaunchResidual<Dtype::kBF16>(algorithm, args, blocks, threads, vectors_per_thread, stream);
    case Dtype::kF16:
      return LaunchResidual<Dtype::kF16>(algorithm, args, blocks, threads, vectors_per_thread, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LoadRmsNormKernels() {
  for (cudaError_t err : {LoadTyped<Dtype::kF32, Dtype::kF32>(),
                          LoadTyped<Dtype::kBF16, Dtype::kBF16>(),
                          LoadTyped<Dtype::kBF16, Dtype::kF32>(),
                          LoadTyped<Dtype::kF16, Dtype::kF16>(),
                          LoadTyped<Dtype::kF16, Dtype::kF32>()}) {
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace jax_ar::gpu
