// FFI handler of jax_ar.all_reduce on CPU devices.
#include "cpu/all_reduce.h"

#include <string>

#include "common/handler_start.h"
#include "cpu/exchange.h"
#include "cpu/rank_state.h"

namespace jax_ar::cpu {

namespace {

ffi::Error AllReduceHandler(int32_t device_ordinal,
                            ffi::RemainingArgs args,  // arrays to reduce
                            ffi::RemainingRets rets,  // their reductions, same shapes
                            int64_t comm_id,          // Communicator.comm_id
                            int32_t op,               // ReduceOp
                            int32_t algorithm) {      // Algorithm
  ffi::Error error = ffi::Error::Success();
  // No LL packets here: the CPU protocol has the one-shot and the two-shot.
  auto state = StartAllReduce<RankState>(comm_id, device_ordinal, op, algorithm,
                                         /*has_two_shot_ll=*/false, error);
  if (state == nullptr) return error;
  std::vector<Segment> segments;
  if (auto error = SegmentsFromBuffers(args, rets, segments); error.failure()) return error;
  Message message(std::move(segments), static_cast<ReduceOp>(op),
                  static_cast<Algorithm>(algorithm), state->world);
  return RunAllReduce(*state, message);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kAllReduce, AllReduceHandler,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("comm_id")
                                  .Attr<int32_t>("op")
                                  .Attr<int32_t>("algorithm"));

}  // namespace jax_ar::cpu
