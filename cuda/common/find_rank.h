// How every FFI handler of both backends finds its rank: the registry entry
// of (communicator, device), refused once the rank has failed, so that every
// call after a failure fails at once (and names the failure) instead of
// waiting for peers that stopped.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/failure_text.h"
#include "common/ffi_util.h"
#include "common/protocol.h"
#include "common/registry.h"

namespace jax_ar {

// State: a RankIdentity with `static constexpr const char* kDeviceKind`
// ("CPU", "GPU") and `std::string Failure()`, the core of its failure or ""
// (failure_text.h). Returns nullptr with `error` set when there is no usable
// rank.
template <typename State>
std::shared_ptr<State> FindRank(uint64_t comm_id, int device_ordinal, Operation operation,
                                ffi::Error& error) {
  auto state = Registry<State>::Instance().Find(comm_id, device_ordinal);
  if (state == nullptr) {
    error = InvalidArgument(
        NotFoundText(operation, comm_id, State::kDeviceKind, device_ordinal) + ".");
    return nullptr;
  }
  if (std::string failure = state->Failure(); !failure.empty()) {
    error = ffi::Error(
        ffi::ErrorCode::kFailedPrecondition,
        "jax_ar: " + Unusable(FailedEarlierText(operation, state->rank, state->label, failure)));
    return nullptr;
  }
  return state;
}

}  // namespace jax_ar
