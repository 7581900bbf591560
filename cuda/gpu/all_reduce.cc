// FFI handler of jax_ar.all_reduce on CUDA devices. It does host work only
// when XLA runs or records it (a CUDA graph replays the kernels alone), so
// everything it computes comes from static shapes and the rank state; the
// launch numbers live on the device.
//
// A call's arrays are packed one after another, each starting on a 16-byte
// boundary. The packed message is cut into launches of at most one round's
// capacity (the workspace's data half split into slots) and at most
// kMaxSegmentsPerLaunch arrays; each launch is a complete protocol instance.
#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "common/failure_text.h"
#include "common/handler_args.h"
#include "common/handler_start.h"
#include "gpu/handlers.h"
#include "gpu/kernels.h"

namespace jax_ar::gpu {

void FillProtocolArgs(const RankState& state, Operation operation, ProtocolArgs& a) {
  for (int r = 0; r < state.world; ++r) a.workspaces[r] = state.workspaces[r];
  a.own_control = reinterpret_cast<PeerControl*>(state.workspaces[state.rank]);
  a.local = state.local;
  a.record = state.record_device;
  a.token = state.token;
  a.timeout_ns = static_cast<uint64_t>(state.timeout_s * 1e9);
  a.ll_half_bytes = state.layout().ll_half;
  a.plain_half_bytes = state.layout().plain_half;
  a.rank = state.rank;
  a.world = state.world;
  a.operation = operation;
}

ffi::Error LaunchFailed(RankState& state, Operation operation, cudaError_t err) {
  const std::string core =
      LaunchFailedText(operation, state.rank, state.label, cudaGetErrorString(err));
  state.SetHostFailure(core);
  return Internal(Unusable(core));
}

LaunchShape OneShotShape(uint64_t bytes, int world, int threads) {
  const uint64_t vectors = (bytes + 15) / 16;
  const uint64_t cap = static_cast<uint64_t>(BlockCap(world));
  if (threads == 0) {
    threads = vectors <= cap * kOneShotThreads      ? kOneShotThreads
              : vectors <= cap * kOneShotMaxThreads ? kOneShotMaxThreads
                                                    : kOneShotWideThreads;
  }
  const uint64_t blocks = (vectors + threads - 1) / threads;
  return {static_cast<int>(std::clamp<uint64_t>(blocks, 1, cap)), threads};
}

TwoShotPlan PlanTwoShot(uint64_t bytes, int world, int threads) {
  TwoShotPlan plan;
  plan.chunk_bytes = AlignUp((bytes + world - 1) / world);
  const uint64_t vectors = plan.chunk_bytes / 16;
  // About two vectors per thread and phase before adding blocks.
  const uint64_t wanted = (vectors + 2 * threads - 1) / (2 * threads);
  plan.blocks = static_cast<int>(std::clamp<uint64_t>(wanted, 1, BlockCap(world)));
  plan.vectors_per_block = (vectors + plan.blocks - 1) / plan.blocks;
  return plan;
}

bool ToDtype(ffi::DataType t, Dtype& d) {
  switch (t) {
    case ffi::DataType::F32: d = Dtype::kF32; return true;
    case ffi::DataType::BF16: d = Dtype::kBF16; return true;
    case ffi::DataType::F16: d = Dtype::kF16; return true;
    case ffi::DataType::S32: d = Dtype::kS32; return true;
    default: return false;
  }
}

namespace {

constexpr Operation kOperation = Operation::kAllReduce;

std::atomic<uint64_t> handler_calls{0};

// One array of the call and its place in the packed message.
struct Piece {
  const std::byte* in;
  std::byte* out;
  uint64_t bytes;
  uint64_t packed_offset;
  Dtype dtype;
};

ffi::Error PiecesFromBuffers(ffi::RemainingArgs args, ffi::RemainingRets rets,
                             std::vector<Piece>& pieces, uint64_t& packed_bytes) {
  packed_bytes = 0;
  return ForEachAllReduceOperand(args, rets, [&](ffi::AnyBuffer in, ffi::AnyBuffer out) {
    Piece p;
    ToDtype(in.element_type(), p.dtype);  // reducible: ForEachAllReduceOperand checked
    p.in = static_cast<const std::byte*>(in.untyped_data());
    p.out = static_cast<std::byte*>(out.untyped_data());
    p.bytes = in.size_bytes();
    p.packed_offset = packed_bytes;
    if (p.bytes == 0) return ffi::Error::Success();
    packed_bytes += AlignUp(p.bytes);
    pieces.push_back(p);
    return ffi::Error::Success();
  });
}

uint64_t CallSignature(const std::vector<Piece>& pieces, ReduceOp op, Algorithm algorithm,
                       int world) {
  uint64_t hash = HashMix(kFnvOffset, static_cast<uint64_t>(op));
  hash = HashMix(hash, static_cast<uint64_t>(algorithm));
  hash = HashMix(hash, static_cast<uint64_t>(world));
  for (const Piece& p : pieces) hash = HashMix(HashMix(hash, static_cast<uint64_t>(p.dtype)), p.bytes);
  return hash;
}

bool IsAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kAlign == 0; }

// The LL two-shot's chunk (rank j reduces bytes [j * chunk, (j + 1) * chunk) of
// a launch): ceil(bytes / world), at least one vector (every rank then sends
// to every peer), and from kLLChunkRoundedFrom on a multiple of
// kLLChunkGranule, one warp's vectors. Chunks that were a multiple of 128 or
// 256 bytes only ran 1.2-1.3x slower at 4 and 8 ranks (4 ranks: 523264 bytes
// 17.5 us, 522240 and 524288 14.2-14.6; 8 ranks: 522240 and 523264 33.2-33.3
// us, 516096 and 524288 27.3; docs/latency_log.md "Latency, fifteenth push"). The
// last rank's chunk is then shorter; from 16 KB the others' grow by less
// than 1/32.
constexpr uint64_t kLLChunkGranule = 512;
constexpr uint64_t kLLChunkRoundedFrom = 16 << 10;

uint64_t LLTwoShotChunk(uint64_t bytes, int world, uint64_t capacity) {
  const uint64_t chunk = std::max<uint64_t>(kAlign, AlignUp((bytes + world - 1) / world));
  if (chunk < kLLChunkRoundedFrom) return chunk;
  // A launch's bytes fit its capacity, so a chunk of capacity / world holds
  // ceil(bytes / world).
  return std::min<uint64_t>(AlignUp(chunk, kLLChunkGranule), capacity / world);
}

int LLTwoShotBlocks(uint64_t chunk_bytes, int world) {
  const uint64_t blocks = (chunk_bytes / 16 + kOneShotThreads - 1) / kOneShotThreads;
  return static_cast<int>(std::clamp<uint64_t>(blocks, 1, BlockCap(world)));
}

ffi::Error RunAllReduce(cudaStream_t stream, RankState& state, const std::vector<Piece>& pieces,
                        uint64_t total, ReduceOp op, Algorithm algorithm, const KernelPlan& kernel,
                        int one_shot_threads = 0, OneShotPart part = OneShotPart::kAll) {
  if (kernel.capacity == 0) {
    return Internal("workspace too small for " + std::to_string(state.world) + " ranks");
  }
  const uint64_t signature = CallSignature(pieces, op, algorithm, state.world);
  LaunchArgs a{};
  FillProtocolArgs(state, kOperation, a);
  a.slot_bytes = kernel.slot_bytes;
  a.op = static_cast<int32_t>(op);

  size_t first = 0;  // first piece overlapping the launch
  for (uint64_t begin = 0, index = 0; begin < total; ++index) {
    uint64_t end = std::min(total, begin + kernel.capacity);
    while (pieces[first].packed_offset + AlignUp(pieces[first].bytes) <= begin) ++first;
    a.num_segments = 0;
    for (size_t i = first; i < pieces.size() && pieces[i].packed_offset < end; ++i) {
      if (a.num_segments == kMaxSegmentsPerLaunch) {
        end = pieces[i].packed_offset;  // the rest goes to the next launch
        break;
      }
      const Piece& p = pieces[i];
      const uint64_t lo = std::max(begin, p.packed_offset);
      const uint64_t hi = std::min(end, p.packed_offset + p.bytes);
      SegmentArg& s = a.segments[a.num_segments++];
      s.in = p.in + (lo - p.packed_offset);
      s.out = p.out + (lo - p.packed_offset);
      s.offset = lo - begin;
      s.bytes = hi - lo;
      s.dtype = p.dtype;
      s.aligned = IsAligned(s.in) && IsAligned(s.out);
    }
    a.bytes = end - begin;
    a.signature = SignatureOf(kOperation, HashMix(HashMix(signature, index), a.bytes));
    int blocks = 1;
    int threads = kOneShotThreads;
    switch (kernel.kernel) {
      case AllReduceKernel::kOneShot: {
        const LaunchShape shape = OneShotShape(a.bytes, state.world, one_shot_threads);
        blocks = shape.blocks;
        threads = shape.threads;
        break;
      }
      case AllReduceKernel::kTwoShotLL:
        a.chunk_bytes = LLTwoShotChunk(a.bytes, state.world, kernel.capacity);
        blocks = LLTwoShotBlocks(a.chunk_bytes, state.world);
        break;
      case AllReduceKernel::kTwoShotPlain: {
        const TwoShotPlan plan = PlanTwoShot(a.bytes, state.world, kTwoShotThreads);
        a.chunk_bytes = plan.chunk_bytes;
        a.vectors_per_block = plan.vectors_per_block;
        blocks = plan.blocks;
        break;
      }
    }
    if (const cudaError_t err =
            LaunchAllReduce(kernel.kernel, a, blocks, threads, stream, part);
        err != cudaSuccess) {
      return LaunchFailed(state, kOperation, err);
    }
    begin = end;
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::Error SumOneArray(cudaStream_t stream, RankState& state, const ffi::AnyBuffer& in,
                       ffi::AnyBuffer& out, AllReduceKernel kernel, int one_shot_threads,
                       OneShotPart part) {
  Piece p;
  if (!ToDtype(in.element_type(), p.dtype)) {
    return InvalidArgument(std::string("protocol_probe does not support dtype ") +
                           DtypeName(in.element_type()));
  }
  p.in = static_cast<const std::byte*>(in.untyped_data());
  p.out = static_cast<std::byte*>(out.untyped_data());
  p.bytes = in.size_bytes();
  p.packed_offset = 0;
  if (p.bytes == 0) return ffi::Error::Success();
  const Algorithm algorithm =
      kernel == AllReduceKernel::kOneShot ? Algorithm::kOneShot : Algorithm::kTwoShot;
  return RunAllReduce(stream, state, {p}, AlignUp(p.bytes), ReduceOp::kSum, algorithm,
                      PlanKernel(state.layout(), state.world, kernel), one_shot_threads, part);
}

namespace {

// The kernel of each algorithm code: the one Python's plan chose (every rank
// the same), run as it is.
bool KernelOf(int32_t algorithm, AllReduceKernel& kernel) {
  switch (static_cast<Algorithm>(algorithm)) {
    case Algorithm::kOneShot: kernel = AllReduceKernel::kOneShot; return true;
    case Algorithm::kTwoShot: kernel = AllReduceKernel::kTwoShotPlain; return true;
    case Algorithm::kTwoShotLL: kernel = AllReduceKernel::kTwoShotLL; return true;
  }
  return false;
}

ffi::Error AllReduceHandler(cudaStream_t stream,
                            int32_t device_ordinal,   // XLA's ordinal of this GPU
                            ffi::RemainingArgs args,  // arrays to reduce
                            ffi::RemainingRets rets,  // their reductions, same shapes
                            int64_t comm_id,          // Communicator.comm_id
                            int32_t op,               // ReduceOp
                            int32_t algorithm) {      // Algorithm: the kernel to run
  handler_calls.fetch_add(1, std::memory_order_relaxed);
  ffi::Error error = ffi::Error::Success();
  auto state = StartAllReduce<RankState>(comm_id, device_ordinal, op, algorithm,
                                         /*has_two_shot_ll=*/true, error);
  if (state == nullptr) return error;
  AllReduceKernel kernel;
  KernelOf(algorithm, kernel);  // a known code: StartAllReduce checked it
  std::vector<Piece> pieces;
  uint64_t total = 0;
  if (auto e = PiecesFromBuffers(args, rets, pieces, total); e.failure()) return e;
  if (total == 0) return ffi::Error::Success();
  return RunAllReduce(stream, *state, pieces, total, static_cast<ReduceOp>(op),
                      static_cast<Algorithm>(algorithm),
                      PlanKernel(state->layout(), state->world, kernel));
}

}  // namespace

uint64_t AllReduceHandlerCalls() { return handler_calls.load(std::memory_order_relaxed); }

XLA_FFI_DEFINE_HANDLER_SYMBOL(kAllReduce, AllReduceHandler,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("comm_id")
                                  .Attr<int32_t>("op")
                                  .Attr<int32_t>("algorithm"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace jax_ar::gpu
