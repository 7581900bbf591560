// FFI handler of jax_ar.all_reduce on CPU devices.
#include "cpu/all_reduce.h"

#include <string>

#include "common/handler_args.h"
#include "common/registry.h"
#include "cpu/exchange.h"

namespace jax_ar::cpu {

std::shared_ptr<RankState> FindRank(uint64_t comm_id, int device_ordinal, ffi::Error& error) {
  auto state = Registry<RankState>::Instance().Find(comm_id, device_ordinal);
  if (state == nullptr) {
    error = InvalidArgument(
        "no communicator " + std::to_string(comm_id) + " on CPU device " +
        std::to_string(device_ordinal) +
        ": it was closed, or this device is not in the mesh given to jax_ar.setup()");
  }
  return state;
}

namespace {

constexpr const char* kOperation = "all_reduce";

ffi::Error AllReduceHandler(int32_t device_ordinal,
                            ffi::RemainingArgs args,  // arrays to reduce
                            ffi::RemainingRets rets,  // their reductions, same shapes
                            int64_t comm_id,          // Communicator.comm_id
                            int32_t op,               // ReduceOp
                            int32_t algorithm) {      // Algorithm
  if (auto error = CheckReduceOp(kOperation, op); error.failure()) return error;
  if (auto error = CheckAlgorithm(kOperation, algorithm); error.failure()) return error;
  ffi::Error error = ffi::Error::Success();
  auto state = FindRank(static_cast<uint64_t>(comm_id), device_ordinal, error);
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
