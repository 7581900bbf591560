// How the CUDA norm kernels (rms_norm.cu and all_reduce_rms_norm_kernels.cu)
// read and write the operands that sit beside a 16-byte vector of x: the
// residual (and residual_out), of x's type or float32, and the float32
// scale vectors (gamma, post_gamma, bias). A vector of x holds kLanes
// elements (4 float32 or 8 16-bit); its residual lanes take one 16-byte
// word of x's type, or kLanes / 4 words of float32, and so do its gamma
// lanes (always float32). Every operand is 16-byte aligned (the handlers
// check) and rows of whole vectors keep every word aligned.
#pragma once

#include <cstdint>

#include "gpu/layout.h"
#include "gpu/ptx.cuh"
#include "gpu/vec.cuh"

namespace jax_ar::gpu {

/// The residual lanes of one vector of x (type D): kWords 16-byte words of
/// type R (R is D or float32), converted as Vec<D, Policy> converts.
template <Dtype D, Dtype R, typename Policy = KeepNanPayloads>
struct ResidualLanes {
  static_assert(R == D || R == Dtype::kF32, "a residual of x's type or float32");
  static constexpr int kLanes = Vec<D, Policy>::kLanes;
  static constexpr int kWords = R == D ? 1 : kLanes / 4;
  static constexpr int kBytes = 16 * kWords;  // per vector of x

  /// Words [vector * kWords, +kWords) of a row at `row`, through the
  /// read-only path (an XLA input).
  __device__ static void Load(const std::byte* row, int vector, uint4 (&w)[kWords]) {
#pragma unroll
    for (int q = 0; q < kWords; ++q) w[q] = LoadInput16(row + kBytes * vector + 16 * q);
  }
  __device__ static void Store(std::byte* row, int vector, const uint4 (&w)[kWords]) {
#pragma unroll
    for (int q = 0; q < kWords; ++q) Store16(row + kBytes * vector + 16 * q, w[q]);
  }
  __device__ static void Unpack(const uint4 (&w)[kWords], float* lanes) {
    if constexpr (R == D) {
      Vec<D, Policy>::Unpack(w[0], lanes);
    } else {
#pragma unroll
      for (int q = 0; q < kWords; ++q) Vec<Dtype::kF32>::Unpack(w[q], lanes + 4 * q);
    }
  }
  /// Rounds the float32 lanes to R (round to nearest even; nothing to round
  /// for float32).
  __device__ static void Pack(const float* lanes, uint4 (&w)[kWords]) {
    if constexpr (R == D) {
      w[0] = Vec<D, Policy>::Pack(lanes);
    } else {
#pragma unroll
      for (int q = 0; q < kWords; ++q) w[q] = Vec<Dtype::kF32>::Pack(lanes + 4 * q);
    }
  }
};

/// Lanes [vector * kLanes, +kLanes) of a float32 row (a scale vector),
/// through the read-only path.
template <int kLanes>
__device__ __forceinline__ void LoadFloatLanes(const float* row, int vector, float* lanes) {
  static_assert(kLanes % 4 == 0, "whole 16-byte words");
#pragma unroll
  for (int q = 0; q < kLanes / 4; ++q) {
    Vec<Dtype::kF32>::Unpack(LoadInput16(row + kLanes * vector + 4 * q), lanes + 4 * q);
  }
}

}  // namespace jax_ar::gpu
