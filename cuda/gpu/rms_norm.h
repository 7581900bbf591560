// The standalone CUDA RMSNorm kernels of jax_ar.rms_norm: FFI handlers
// jax_ar_rms_norm (x, gamma -> out) and jax_ar_add_rms_norm (x, residual,
// gamma -> out, residual_out), attribute eps:f32; operands as
// common/rms_norm_args.h lists them. Arithmetic as on the CPU
// (cuda/cpu/rms_norm.h): float32 inside, one rounding per output.
#pragma once

#include "common/ffi_util.h"

namespace jax_ar::gpu {

XLA_FFI_DECLARE_HANDLER_SYMBOL(kRmsNorm);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kAddRmsNorm);

}  // namespace jax_ar::gpu
