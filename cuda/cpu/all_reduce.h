// FFI handlers of the CPU backend and the lookup they share.
#pragma once

#include <cstdint>
#include <memory>

#include "common/ffi_util.h"
#include "cpu/rank_state.h"

namespace jax_ar::cpu {

// The rank state of (comm_id, device), or nullptr with `error` set.
std::shared_ptr<RankState> FindRank(uint64_t comm_id, int device_ordinal, ffi::Error& error);

XLA_FFI_DECLARE_HANDLER_SYMBOL(kAllReduce);

}  // namespace jax_ar::cpu
