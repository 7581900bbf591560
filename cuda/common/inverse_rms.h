// 1 / sqrt(mean(v * v) + eps) of a row from its sum of squares in double:
// the CPU's norms (cpu/rms_norm.h), the CUDA rms_norm kernel's, and the
// fused CUDA kernels' for the rows their float32 sum cannot serve
// (gpu/row_norm.cuh FloatInverseRms). The callers sum the squares in
// double (in float32 a row with |v| above about 1.8e19 overflows to inf and
// normalizes to 0), then the mean, eps and the square root are taken in
// double and the result rounded once to float32. Host and device code both
// include it.
#pragma once

#include <math.h>

#include <cstddef>

#if defined(__CUDACC__)
#define JAX_AR_HOST_DEVICE __host__ __device__
#else
#define JAX_AR_HOST_DEVICE
#endif

namespace jax_ar {

/// IEEE double division and square root (CUDA's double `/` and sqrt round
/// correctly whatever -prec-div / -prec-sqrt say), one rounding to float32.
JAX_AR_HOST_DEVICE inline float InverseRmsOfSumOfSquares(double sum_of_squares, size_t hidden,
                                                         float eps) {
  const double mean = sum_of_squares / static_cast<double>(hidden);
  return static_cast<float>(1.0 / ::sqrt(mean + static_cast<double>(eps)));
}

}  // namespace jax_ar

#undef JAX_AR_HOST_DEVICE
