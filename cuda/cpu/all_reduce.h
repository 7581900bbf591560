// FFI handler of jax_ar.all_reduce on CPU devices.
#pragma once

#include "common/ffi_util.h"

namespace jax_ar::cpu {

XLA_FFI_DECLARE_HANDLER_SYMBOL(kAllReduce);

}  // namespace jax_ar::cpu
