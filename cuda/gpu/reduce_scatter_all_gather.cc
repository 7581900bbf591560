// FFI handlers of jax_ar.reduce_scatter and jax_ar.all_gather on CUDA
// devices. Python hands them the canonical layout: the reduce-scatter
// operand is [world, ...] (row j for rank j), the all-gather result is
// [world, ...] (row j from rank j); a row is a chunk. Like the all-reduce
// handler, they compute everything from static sizes and the rank state, so
// CUDA graph replays need no host work; chunks larger than a workspace slot
// take several launches, each a full protocol instance.
#include <algorithm>
#include <string>

#include "common/handler_start.h"
#include "gpu/handlers.h"
#include "gpu/reduce_scatter_all_gather.h"
#include "gpu/reduce_scatter_all_gather_handlers.h"

namespace jax_ar::gpu {
namespace {

enum class ChunkCollective : uint64_t { kReduceScatter = 1, kAllGather = 2 };

// What peers compare: the collective, op, world, dtype and chunk size, in a
// hash apart from all-reduce signatures (whose first word is the op, < 16).
uint64_t ChunkSignature(ChunkCollective kind, int32_t op, int world, ffi::DataType dtype,
                        uint64_t chunk_bytes) {
  uint64_t hash = HashMix(kFnvOffset, 0x5ca7'0000u + static_cast<uint64_t>(kind));
  hash = HashMix(hash, static_cast<uint64_t>(op));
  hash = HashMix(hash, static_cast<uint64_t>(world));
  return HashMix(HashMix(hash, static_cast<uint64_t>(dtype)), chunk_bytes);
}

// Launches the collective over `a.chunk_bytes` of every chunk, one slot's
// worth per launch.
ffi::Error RunChunkLaunches(cudaStream_t stream, RankState& state, ChunkCollective kind,
                            ChunkLaunchArgs& a, uint64_t signature) {
  const uint64_t slot = SlotBytes(state.layout(), state.world, Algorithm::kOneShot);
  if (slot == 0) return Internal("workspace too small for " + std::to_string(state.world) + " ranks");
  const Operation operation = kind == ChunkCollective::kReduceScatter ? Operation::kReduceScatter
                                                                      : Operation::kAllGather;
  FillProtocolArgs(state, operation, a);
  a.slot_bytes = slot;
  for (uint64_t offset = 0, index = 0; offset < a.chunk_bytes; offset += slot, ++index) {
    a.offset = offset;
    a.bytes = std::min(slot, a.chunk_bytes - offset);
    a.signature = SignatureOf(operation, HashMix(HashMix(signature, index), a.bytes));
    // Blocks from this launch's size and the world size alone, as two-shot
    // does for a message of `world` such chunks.
    const TwoShotPlan plan = PlanTwoShot(a.bytes * state.world, state.world, kChunkThreads);
    a.vectors_per_block = plan.vectors_per_block;
    const cudaError_t err = kind == ChunkCollective::kReduceScatter
                                ? LaunchReduceScatter(a, plan.blocks, stream)
                                : LaunchAllGather(a, plan.blocks, stream);
    if (err != cudaSuccess) return LaunchFailed(state, operation, err);
  }
  return ffi::Error::Success();
}

ffi::Error ReduceScatterHandler(cudaStream_t stream,
                                int32_t device_ordinal,           // XLA's ordinal of this GPU
                                ffi::AnyBuffer in,                // [world, ...], row j for rank j
                                ffi::Result<ffi::AnyBuffer> out,  // [...], my row reduced
                                int64_t comm_id,                  // Communicator.comm_id
                                int32_t op) {                     // ReduceOp
  ffi::Error error = ffi::Error::Success();
  auto state = StartReduceScatter<RankState>(comm_id, device_ordinal, in, *out, op, error);
  if (state == nullptr) return error;
  if (out->size_bytes() == 0) return ffi::Error::Success();
  ChunkLaunchArgs a{};
  ToDtype(in.element_type(), a.dtype);  // reducible: StartReduceScatter checked
  a.in = static_cast<const std::byte*>(in.untyped_data());
  a.out = static_cast<std::byte*>(out->untyped_data());
  a.chunk_bytes = out->size_bytes();
  a.op = op;
  const uint64_t signature = ChunkSignature(ChunkCollective::kReduceScatter, op, state->world,
                                            in.element_type(), a.chunk_bytes);
  return RunChunkLaunches(stream, *state, ChunkCollective::kReduceScatter, a, signature);
}

ffi::Error AllGatherHandler(cudaStream_t stream,
                            int32_t device_ordinal,           // XLA's ordinal of this GPU
                            ffi::AnyBuffer in,                // [...], my chunk
                            ffi::Result<ffi::AnyBuffer> out,  // [world, ...], row j from rank j
                            int64_t comm_id) {                // Communicator.comm_id
  ffi::Error error = ffi::Error::Success();
  auto state = StartAllGather<RankState>(comm_id, device_ordinal, in, *out, error);
  if (state == nullptr) return error;
  if (in.size_bytes() == 0) return ffi::Error::Success();
  ChunkLaunchArgs a{};
  a.in = static_cast<const std::byte*>(in.untyped_data());
  a.out = static_cast<std::byte*>(out->untyped_data());
  a.chunk_bytes = in.size_bytes();
  const uint64_t signature = ChunkSignature(ChunkCollective::kAllGather, 0, state->world,
                                            in.element_type(), a.chunk_bytes);
  return RunChunkLaunches(stream, *state, ChunkCollective::kAllGather, a, signature);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kReduceScatter, ReduceScatterHandler,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("comm_id")
                                  .Attr<int32_t>("op"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(kAllGather, AllGatherHandler,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("comm_id"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace jax_ar::gpu
