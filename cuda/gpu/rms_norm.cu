// Standalone CUDA RMSNorm (with an optional residual add) for jax_ar.rms_norm.
//
// Memory bound: each row is read once (x, residual), written once (out,
// residual_out), and kept in registers in between. A group of
// threads_per_row threads (a power of two) owns a row; each thread holds up
// to kVectors 16-byte vectors of it, all loads issued before any arithmetic
// so that enough bytes are in flight to saturate HBM. Groups of up to 32
// threads reduce with warp shuffles alone; wider groups add one pass
// through shared memory. Small rows pack several groups into one block.
//
// Latency matters as much for the few-token calls of decoding: with at
// most kRmsNormVectorsPerThread vectors per thread, gamma is loaded together
// with the row, so that a call waits for memory once, not twice (before and
// after the reduction). Rows of more than kMaxThreadsPerRow *
// kRmsNormVectorsPerThread vectors take up to kMaxVectorsPerThread per
// thread and load gamma after the reduction: prefetching it there costs
// registers (64 at most, for 1024-thread blocks) and measured slower. The
// plan (row_plan.h) depends on the row length alone, so a row's result does
// not depend on how many rows a call has.
//
// gamma is float32 whatever x's type (Python added scale_offset to it), so
// a vector of 16-bit x has two 16-byte words of gamma; the residual is of
// x's type or, beside 16-bit x, float32 (two words per vector of x too,
// gpu/norm_lanes.cuh).
#include "gpu/rms_norm.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/norm_limits.h"
#include "common/rms_norm_args.h"
#include "gpu/norm_lanes.cuh"
#include "gpu/row_norm.cuh"
#include "gpu/row_plan.h"
#include "gpu/vec.cuh"

namespace jax_ar::gpu {
namespace {

// The standalone norm converts with CUDA's intrinsics (vec.cuh says why).
template <Dtype D>
using NormVec = Vec<D, FastIntrinsics>;

struct NormArgs {
  const void* x;
  const void* residual;  // null without a residual
  const float* gamma;
  void* out;
  void* residual_out;
  int64_t rows;
  int row_vectors;      // hidden / lanes
  int threads_per_row;  // power of two
  float eps;
};

// Normalizes the row group starting at row `first` (blockDim.y rows, one per
// threadIdx.y). R is the residual's type (x's, or float32 beside 16-bit x).
template <Dtype D, int kVectors, bool kResidual, Dtype R>
__device__ __forceinline__ void NormalizeRowGroup(const NormArgs& args, int64_t first,
                                                  double* partials) {
  using V = NormVec<D>;
  using RL = ResidualLanes<D, R, FastIntrinsics>;
  constexpr int kLanes = V::kLanes;
  const int64_t row = first + threadIdx.y;
  const bool active = row < args.rows;
  const int64_t base = row * args.row_vectors;
  const auto* x = static_cast<const uint4*>(args.x) + base;
  // Residual rows hold RL::kWords words per vector of x (offset where used).
  const auto* residual = static_cast<const uint4*>(args.residual);
  auto* residual_out = static_cast<uint4*>(args.residual_out);

  // The same for every row: cached.
  const float* gamma = args.gamma;
  constexpr bool kPrefetchGamma = kVectors <= kRmsNormVectorsPerThread;
  uint4 loaded[kVectors], loaded_residual[kVectors][RL::kWords];
  float loaded_gamma[kPrefetchGamma ? kVectors : 1][kLanes];
#pragma unroll
  for (int k = 0; k < kVectors; ++k) {
    const int i = threadIdx.x + k * args.threads_per_row;
    if (active && i < args.row_vectors) {
      loaded[k] = x[i];
      if constexpr (kResidual) {
#pragma unroll
        for (int q = 0; q < RL::kWords; ++q) {
          loaded_residual[k][q] = residual[(base + i) * RL::kWords + q];
        }
      }
      if constexpr (kPrefetchGamma) LoadFloatLanes<kLanes>(gamma, i, loaded_gamma[k]);
    }
  }

  float v[kVectors][kLanes];
  double sum_of_squares = 0.0;
#pragma unroll
  for (int k = 0; k < kVectors; ++k) {
    const int i = threadIdx.x + k * args.threads_per_row;
    if (active && i < args.row_vectors) {
      V::Unpack(loaded[k], v[k]);
      if constexpr (kResidual) {
        // The residual stream is kept in its own type: round the sum, store
        // it, and normalize the stored value.
        float r[kLanes];
        RL::Unpack(loaded_residual[k], r);
#pragma unroll
        for (int j = 0; j < kLanes; ++j) v[k][j] = __fadd_rn(v[k][j], r[j]);
        uint4 rounded[RL::kWords];
        RL::Pack(v[k], rounded);
#pragma unroll
        for (int q = 0; q < RL::kWords; ++q) residual_out[(base + i) * RL::kWords + q] = rounded[q];
        RL::Unpack(rounded, v[k]);
      }
      AddSquares<kLanes>(v[k], sum_of_squares);
    }
  }

  // One row group per block: partials are written once.
  const float inv_rms = RowInverseRms</*kPartialsReused=*/false>(
      sum_of_squares, args.row_vectors * kLanes, args.eps, args.threads_per_row, threadIdx.x,
      threadIdx.y, partials);
  if (!active) return;
  auto* out = static_cast<uint4*>(args.out) + base;
#pragma unroll
  for (int k = 0; k < kVectors; ++k) {
    const int i = threadIdx.x + k * args.threads_per_row;
    if (i < args.row_vectors) {
      float g[kLanes];
      if constexpr (kPrefetchGamma) {
#pragma unroll
        for (int j = 0; j < kLanes; ++j) g[j] = loaded_gamma[k][j];
      } else {
        LoadFloatLanes<kLanes>(gamma, i, g);
      }
#pragma unroll
      for (int j = 0; j < kLanes; ++j) v[k][j] = __fmul_rn(__fmul_rn(v[k][j], inv_rms), g[j]);
      out[i] = V::Pack(v[k]);
    }
  }
}

// One block per row group. (A persistent grid striding over the row groups,
// with or without streaming cache hints, measured 2-8% slower on an H200:
// see docs/rms_norm.md.)
template <Dtype D, int kVectors, bool kResidual, Dtype R>
__global__ void __launch_bounds__(kMaxThreadsPerRow, 1) RmsNormKernel(NormArgs args) {
  extern __shared__ double partials[];
  NormalizeRowGroup<D, kVectors, kResidual, R>(
      args, static_cast<int64_t>(blockIdx.x) * blockDim.y, partials);
}

template <Dtype D, int kVectors, bool kResidual, Dtype R>
cudaError_t LaunchVectors(cudaStream_t stream, const NormArgs& args, const RowPlan& plan) {
  const dim3 block(plan.threads_per_row, plan.rows_per_block);
  const int64_t blocks = (args.rows + plan.rows_per_block - 1) / plan.rows_per_block;
  const size_t shared = plan.threads_per_row > 32
                            ? sizeof(double) * plan.rows_per_block * (plan.threads_per_row / 32)
                            : 0;
  RmsNormKernel<D, kVectors, kResidual, R><<<blocks, block, shared, stream>>>(args);
  return cudaGetLastError();
}

// One, two, or (three and four: rows over 2048 vectors, whose threads
// then leave lanes past the row idle) four vectors per thread: three
// instantiations instead of four (build time and module size).
template <Dtype D, bool kResidual, Dtype R>
cudaError_t LaunchTyped(cudaStream_t stream, const NormArgs& args, const RowPlan& plan) {
  static_assert(kMaxVectorsPerThread == 4, "kernels for 1, 2 and 4 vectors per thread");
  switch (plan.vectors_per_thread) {
    case 1: return LaunchVectors<D, 1, kResidual, R>(stream, args, plan);
    case 2: return LaunchVectors<D, 2, kResidual, R>(stream, args, plan);
    default: return LaunchVectors<D, 4, kResidual, R>(stream, args, plan);
  }
}

// Without a residual, with one of x's type, or (16-bit x) with a float32 one.
template <Dtype D>
cudaError_t Launch(cudaStream_t stream, const NormArgs& args, const RowPlan& plan,
                   bool with_residual, bool float32_residual) {
  if (!with_residual) return LaunchTyped<D, false, D>(stream, args, plan);
  if constexpr (D != Dtype::kF32) {
    if (float32_residual) return LaunchTyped<D, true, Dtype::kF32>(stream, args, plan);
  }
  return LaunchTyped<D, true, D>(stream, args, plan);
}

ffi::Error Run(cudaStream_t stream, const ffi::AnyBuffer& x, const ffi::AnyBuffer* residual,
               const ffi::AnyBuffer& gamma, ffi::AnyBuffer& out, ffi::AnyBuffer* residual_out,
               float eps) {
  constexpr const char* kOp = "rms_norm";
  size_t rows = 0, hidden = 0;
  if (auto error = CheckRmsNormCall(kOp, x, residual, gamma, out, residual_out, eps, rows,
                                    hidden);
      error.failure()) {
    return error;
  }
  const ffi::DataType dtype = x.element_type();
  const size_t lanes = kNormVectorBytes / DtypeBytes(dtype);
  if (hidden % lanes != 0 || hidden / lanes > static_cast<size_t>(kMaxRowVectors)) {
    return InvalidCall(kOp, "the CUDA kernel needs a hidden size that is a multiple of " +
                                std::to_string(lanes) + " up to " +
                                std::to_string(lanes * kMaxRowVectors) + ", got " +
                                std::to_string(hidden));
  }
  if (rows == 0) return ffi::Error::Success();
  if (auto error = CheckAligned(kOp, {x.untyped_data(), gamma.untyped_data(), out.untyped_data(),
                                      residual ? residual->untyped_data() : nullptr,
                                      residual_out ? residual_out->untyped_data() : nullptr});
      error.failure()) {
    return error;
  }
  NormArgs args;
  args.x = x.untyped_data();
  args.residual = residual ? residual->untyped_data() : nullptr;
  args.gamma = static_cast<const float*>(gamma.untyped_data());
  args.out = out.untyped_data();
  args.residual_out = residual_out ? residual_out->untyped_data() : nullptr;
  args.rows = static_cast<int64_t>(rows);
  args.row_vectors = static_cast<int>(hidden / lanes);
  args.eps = eps;
  const RowPlan plan = PlanRow(args.row_vectors, kRmsNormVectorsPerThread);
  args.threads_per_row = plan.threads_per_row;
  cudaError_t status = cudaSuccess;
  const bool with_residual = residual != nullptr;
  const bool float32_residual = with_residual && residual->element_type() == ffi::DataType::F32;
  switch (dtype) {
    case ffi::DataType::F32:
      status = Launch<Dtype::kF32>(stream, args, plan, with_residual, float32_residual);
      break;
    case ffi::DataType::BF16:
      status = Launch<Dtype::kBF16>(stream, args, plan, with_residual, float32_residual);
      break;
    default:
      status = Launch<Dtype::kF16>(stream, args, plan, with_residual, float32_residual);
      break;
  }
  if (status != cudaSuccess) {
    return Internal(std::string(kOp) + ": kernel launch failed: " + cudaGetErrorString(status));
  }
  return ffi::Error::Success();
}

ffi::Error RmsNormHandler(cudaStream_t stream,
                          ffi::AnyBuffer x,                 // [..., hidden]
                          ffi::AnyBuffer gamma,             // float32 [hidden]
                          ffi::Result<ffi::AnyBuffer> out,  // like x
                          float eps) {
  return Run(stream, x, nullptr, gamma, *out, nullptr, eps);
}

ffi::Error AddRmsNormHandler(cudaStream_t stream,
                             ffi::AnyBuffer x,                          // [..., hidden]
                             ffi::AnyBuffer residual,                   // x's type or float32
                             ffi::AnyBuffer gamma,                      // float32 [hidden]
                             ffi::Result<ffi::AnyBuffer> out,           // like x
                             ffi::Result<ffi::AnyBuffer> residual_out,  // like residual
                             float eps) {
  return Run(stream, x, &residual, gamma, *out, &(*residual_out), eps);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kRmsNorm, RmsNormHandler,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Arg<ffi::AnyBuffer>()  // gamma
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Attr<float>("eps"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(kAddRmsNorm, AddRmsNormHandler,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Arg<ffi::AnyBuffer>()  // residual
                                  .Arg<ffi::AnyBuffer>()  // gamma
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::AnyBuffer>()  // residual_out
                                  .Attr<float>("eps"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace jax_ar::gpu
