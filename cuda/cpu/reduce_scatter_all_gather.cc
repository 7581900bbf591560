// FFI handlers of jax_ar.reduce_scatter and jax_ar.all_gather on CPU devices.
//
// Python hands them arrays in a canonical layout: the reduce-scatter operand
// is [world, ...] (row j is rank j's share), the all-gather result is
// [world, ...]. Rows are contiguous, so a chunk is a plain byte range.
#include "cpu/reduce_scatter_all_gather.h"

#include <algorithm>
#include <string>

#include "common/handler_start.h"
#include "cpu/exchange.h"

namespace jax_ar::cpu {
namespace {

// The call as the protocol sees it: one array. Its size in the signature
// (the operand for reduce-scatter, the result for all-gather: the whole
// message) fixes the chunk size that peers must agree on.
Message OneArrayMessage(ffi::AnyBuffer in, ffi::AnyBuffer out, int32_t op, Operation operation,
                        const RankState& state) {
  Segment s;
  s.in = static_cast<const std::byte*>(in.untyped_data());
  s.out = static_cast<std::byte*>(out.untyped_data());
  s.bytes = std::max(in.size_bytes(), out.size_bytes());
  s.dtype = in.element_type();
  return Message({s}, static_cast<ReduceOp>(op), Algorithm::kTwoShot, state.world, operation);
}

ffi::Error ReduceScatterHandler(int32_t device_ordinal,
                                ffi::AnyBuffer in,                 // [world, ...], row j for rank j
                                ffi::Result<ffi::AnyBuffer> out,   // [...], this rank's row reduced
                                int64_t comm_id,                   // Communicator.comm_id
                                int32_t op) {                      // ReduceOp
  ffi::Error error = ffi::Error::Success();
  auto state = StartReduceScatter<RankState>(comm_id, device_ordinal, in, *out, op, error);
  if (state == nullptr) return error;
  return RunChunkCollective(*state, OneArrayMessage(in, *out, op, Operation::kReduceScatter, *state),
                            ChunkHalf::kReduceScatter, out->size_bytes());
}

ffi::Error AllGatherHandler(int32_t device_ordinal,
                            ffi::AnyBuffer in,                 // [...], this rank's chunk
                            ffi::Result<ffi::AnyBuffer> out,   // [world, ...], row j from rank j
                            int64_t comm_id) {                 // Communicator.comm_id
  ffi::Error error = ffi::Error::Success();
  auto state = StartAllGather<RankState>(comm_id, device_ordinal, in, *out, error);
  if (state == nullptr) return error;
  return RunChunkCollective(*state,
                            OneArrayMessage(in, *out, static_cast<int32_t>(ReduceOp::kSum),
                                            Operation::kAllGather, *state),
                            ChunkHalf::kAllGather, in.size_bytes());
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kReduceScatter, ReduceScatterHandler,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("comm_id")
                                  .Attr<int32_t>("op"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(kAllGather, AllGatherHandler,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("comm_id"));

}  // namespace jax_ar::cpu
