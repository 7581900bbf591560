// The rows the CUDA norm kernels serve, in numbers the compiled modules
// report to Python (limits()). Both modules report them: the CPU kernels
// take any row, but Python sends the fused op on CPU down the same paths it
// would take on a GPU, so that CI exercises the GPU's decisions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/protocol.h"

namespace jax_ar {

// Rows move as whole 16-byte vectors: hidden * itemsize must be a multiple.
inline constexpr size_t kNormVectorBytes = kAlign;

// Hidden sizes of all_reduce_rms_norm's fused kernel, for every dtype: the
// largest is a float32 row of 4096 vectors, the most its row plan holds
// (gpu/row_plan.h checks it).
inline constexpr int64_t kFusedMinHidden = 128;
inline constexpr int64_t kFusedMaxHidden = 16384;

}  // namespace jax_ar
