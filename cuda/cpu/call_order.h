// jax_ar_order: keeps jax_ar's calls in program order on XLA:CPU.
#pragma once

#include "common/ffi_util.h"

namespace jax_ar::cpu {

XLA_FFI_DECLARE_HANDLER_SYMBOL(kCallOrder);

}  // namespace jax_ar::cpu
