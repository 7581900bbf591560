// FFI handlers of jax_ar.reduce_scatter and jax_ar.all_gather on CPU devices.
#pragma once

#include "common/ffi_util.h"

namespace jax_ar::cpu {

XLA_FFI_DECLARE_HANDLER_SYMBOL(kReduceScatter);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kAllGather);

}  // namespace jax_ar::cpu
