// The standalone CUDA RMSNorm kernels of jax_ar.rms_norm: FFI handlers
// jax_ar_rms_norm (x, gamma -> out) and jax_ar_add_rms_norm (x, residual,
// gamma -> out, residual_out), attribute eps:f32. Arithmetic as on the CPU
// (cuda/cpu/rms_norm.h): float32 inside, one rounding per output.
#pragma once

#include "common/ffi_util.h"

namespace jax_ar::gpu {

// A row is held in registers as 16-byte vectors: at most this many vectors
// per row (4 per thread, 1024 threads), i.e. hidden <= 32768 for 16-bit
// types and 16384 for float32. jax_ar/rms_norm.py mirrors the limit and
// serves larger or unaligned rows with XLA's own ops.
inline constexpr int kMaxRowVectors = 4096;

XLA_FFI_DECLARE_HANDLER_SYMBOL(kRmsNorm);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kAddRmsNorm);

}  // namespace jax_ar::gpu
