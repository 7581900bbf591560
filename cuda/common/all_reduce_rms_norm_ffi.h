// The FFI contract of jax_ar_all_reduce_rms_norm, one binding for both
// backends: what jax_ar/ops/all_reduce_rms_norm.py binds and each handler
// receives, in this order after the backend's own context entries. Shapes
// and types are checked by CheckAllReduceRmsNormCall (rms_norm_args.h);
// the arithmetic is in each backend's handler.
#pragma once

#include <utility>

#include "common/ffi_util.h"

namespace jax_ar {

/// `context` (ffi::Ffi::Bind() with the backend's .Ctx entries) followed by
/// the operands, results and attributes of the fused call. The handler's
/// parameters follow its context parameters in the same order.
template <typename Binding>
auto BindAllReduceRmsNorm(Binding context) {
  return std::move(context)
      .template Arg<ffi::AnyBuffer>()           // x [T, H]: this rank's partial sums
      .template Arg<ffi::AnyBuffer>()           // residual [T, H]: x's type or float32
      .template Arg<ffi::AnyBuffer>()           // gamma f32[G, H]: group g's rows use row g
      .template Arg<ffi::AnyBuffer>()           // post_gamma f32[G, H], or f32[0, H]: none
      .template Arg<ffi::AnyBuffer>()           // bias f32[G, H], or f32[0, H]: none
      .template Arg<ffi::BufferR0<ffi::F32>>()  // scale f32[]: read when quantize = 1
      .template Ret<ffi::AnyBuffer>()           // out [T, H]: x's type, or float8_e4m3fn
      .template Ret<ffi::AnyBuffer>()           // residual_out [T, H]: the residual's type
      .template Attr<int64_t>("comm_id")        // Communicator.comm_id
      .template Attr<int32_t>("algorithm")      // Algorithm: 1 one-shot, 2 two-shot
      .template Attr<float>("eps")              // > 0, inside the rsqrt
      .template Attr<int32_t>("quantize");      // 1: out = float8_e4m3fn(saturate(y / scale))
}

}  // namespace jax_ar
