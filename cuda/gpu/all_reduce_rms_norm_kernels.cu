// Fused all-reduce + residual add + RMSNorm (+ FP8 output), one kernel per
// launch for both algorithms. Per row, in float32:
//
//   t            = sum of x over ranks (rank order), + bias if given
//   with post_gamma: t = t * inverse_rms(t) * post_gamma   (Gemma 2/3 post-norm)
//   residual_out = round(t + float32(residual))   (the residual's type R)
//   v            = float32(residual_out)
//   out          = round(v * inverse_rms(v) * gamma),
//                  or float8_e4m3fn(saturate(that / scale)) with quantize
//
// gamma, post_gamma and bias are float32 (Python added scale_offset); R is
// x's type or, beside 16-bit x, float32. A group of threads_per_row threads
// (a power of two) owns a row; each holds up to kVectors 16-byte vectors of
// it. one-shot: every rank sends its rows of x as LL packets to every peer
// and computes every row itself (the all-reduce kernel's protocol, row by
// row). two-shot: rows are split into `world` groups; each rank reduces and
// normalizes its group and sends both outputs to everybody (the two-shot
// protocol with rows for chunks).
//
// Both norms' arithmetic is that of jax_ar.rms_norm's CUDA kernel (one
// RowInverseRms each, gpu/row_norm.cuh): squares summed in double per thread
// and over the row, inv_rms = 1 / sqrt(sum / hidden + eps) in double as on
// the CPU, then (v * inv_rms) * gamma in float32. The post-norm keeps the
// row's float32 lanes in registers across its reduction, so it is a
// template parameter: kernels without it hold only the rounded residual
// stream, as before.
#include <cuda_runtime.h>

#include "gpu/kernels.h"
#include "gpu/packets.cuh"
#include "gpu/norm_lanes.cuh"
#include "gpu/numeric.cuh"
#include "gpu/row_norm.cuh"
#include "gpu/row_plan.h"

namespace jax_ar::gpu {
namespace {

constexpr float kE4m3Max = 448.0f;

// float32 -> float8_e4m3fn, saturating to +-448, round to nearest even, NaN
// to NaN; bit for bit the CPU's FloatToE4m3fnSaturated.
__device__ __forceinline__ uint32_t FloatToE4m3fnSaturated(float f) {
  const uint32_t sign = (__float_as_uint(f) >> 24) & 0x80u;
  if (IsNan(f)) return sign | 0x7fu;
  const float a = fabsf(f);
  if (a >= kE4m3Max) return sign | 0x7eu;
  if (a < 0.015625f) {  // subnormal: units of 2^-9 (exact scaling, round to even)
    return sign | static_cast<uint32_t>(__float2int_rn(__fmul_rn(a, 512.0f)));
  }
  uint32_t u = __float_as_uint(a);
  u += 0x7ffffu + ((u >> 20) & 1u);  // a carry moves the exponent up
  return sign | ((((u >> 23) - 127u + 7u) << 3) | ((u >> 20) & 7u));
}

// Bytes of one row's out per 16-byte vector of x: 16, or lanes with FP8.
template <Dtype D>
__device__ __forceinline__ int OutVectorBytes(const RmsNormLaunchArgs& a) {
  return a.quantize ? Vec<D>::kLanes : 16;
}

// Stores the normalized lanes `y` of vector `vector` of a row at `dst`.
template <Dtype D>
__device__ __forceinline__ void StoreOut(const RmsNormLaunchArgs& a, float scale, const float* y,
                                         std::byte* dst) {
  using V = Vec<D>;
  if (!a.quantize) {
    Store16(dst, V::Pack(y));
    return;
  }
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < V::kLanes; ++j) {
    w[j / 4] |= FloatToE4m3fnSaturated(__fdiv_rn(y[j], scale)) << (8 * (j % 4));
  }
  if constexpr (V::kLanes == 8) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
  } else {
    *reinterpret_cast<uint32_t*>(dst) = w[0];
  }
}

template <Dtype R>
__device__ __forceinline__ int DtypeSize() {
  return R == Dtype::kF32 ? 4 : 2;
}

template <Dtype D, Dtype R>
__device__ __forceinline__ void FillRmsNormOutputs(const RmsNormLaunchArgs& a) {
  const uint64_t elements =
      static_cast<uint64_t>(a.rows) * a.row_vectors * Vec<D>::kLanes;
  FillBytes(a.residual_out, elements * DtypeSize<R>());
  FillBytes(a.out, elements * (a.quantize ? 1 : DtypeSize<D>()));
}

__device__ __forceinline__ const std::byte* RowOf(const void* base, int64_t row, uint64_t bytes) {
  return static_cast<const std::byte*>(base) + row * bytes;
}
__device__ __forceinline__ std::byte* RowOf(void* base, int64_t row, uint64_t bytes) {
  return static_cast<std::byte*>(base) + row * bytes;
}

// Bytes of one row of the residual (and residual_out).
template <Dtype D, Dtype R>
__device__ __forceinline__ uint64_t ResidualRowBytes(const RmsNormLaunchArgs& a) {
  return static_cast<uint64_t>(a.row_vectors) * ResidualLanes<D, R>::kBytes;
}

// Row `group` of a [groups, hidden] scale vector.
__device__ __forceinline__ const float* GroupRow(const float* vectors, int group, int hidden) {
  return vectors + static_cast<size_t>(group) * hidden;
}

// t += bias (lanes of vector i of this row's group), when there is a bias.
template <int kLanes>
__device__ __forceinline__ void AddBias(const RmsNormLaunchArgs& a, int group, int hidden, int i,
                                        float* t) {
  if (a.bias == nullptr) return;
  float b[kLanes];
  LoadFloatLanes<kLanes>(GroupRow(a.bias, group, hidden), i, b);
#pragma unroll
  for (int j = 0; j < kLanes; ++j) t[j] = __fadd_rn(t[j], b[j]);
}

// The norm of the row this thread works on, after the sum over ranks: for
// each of its vectors i of row `row` (when `active`), reduce(k, i, t) puts
// the float32 sum over ranks of vector i (the k-th of this thread) in t;
// the bias is added, the post-norm applied, the residual added, and the
// residual_out words (R rounded) go to emit_residual(i, words); the
// normalized lanes go to emit_out(i, y). Every thread of the block must call
// it together (RowInverseRms synchronizes).
template <Dtype D, Dtype R, bool kPostNorm, int kVectors, typename Reduce, typename EmitResidual,
          typename EmitOut>
__device__ __forceinline__ void NormalizeReducedRow(const RmsNormLaunchArgs& a, int64_t row,
                                                    bool active, double* partials, Reduce&& reduce,
                                                    EmitResidual&& emit_residual,
                                                    EmitOut&& emit_out) {
  using RL = ResidualLanes<D, R>;
  constexpr int kLanes = Vec<D>::kLanes;
  const int tpr = a.threads_per_row;
  const int lane = threadIdx.x % tpr;
  const int hidden = a.row_vectors * kLanes;
  // This row's group: its row of gamma, post_gamma and bias. One group
  // unless vmap stacked several, and then no division (the kernel runs at
  // its register limit: a 32-bit division, kept out of the common path; a
  // call's rows fit 32 bits, the handler checks).
  const int group =
      a.groups > 1 && active
          ? static_cast<int>(static_cast<uint32_t>(a.first_row + row) /
                             static_cast<uint32_t>(a.rows_per_group))
          : 0;
  // Rows are kept as the stored residual stream in between (half the
  // registers of float lanes for 16-bit types when R is x's type).
  uint4 stored[kVectors][RL::kWords];
  double sum_of_squares = 0.0;
  const auto add_residual = [&](int k, int i, float* t) {
    uint4 words[RL::kWords];
    float r[kLanes];
    RL::Load(RowOf(a.residual, row, ResidualRowBytes<D, R>(a)), i, words);
    RL::Unpack(words, r);
#pragma unroll
    for (int j = 0; j < kLanes; ++j) t[j] = __fadd_rn(t[j], r[j]);
    RL::Pack(t, stored[k]);
    RL::Unpack(stored[k], r);  // the norm reads what residual_out holds
    AddSquares<kLanes>(r, sum_of_squares);
    emit_residual(i, stored[k]);
  };
  if constexpr (kPostNorm) {
    float t[kVectors][kLanes];
    double post_sum_of_squares = 0.0;
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      const int i = lane + k * tpr;
      if (!active || i >= a.row_vectors) continue;
      reduce(k, i, t[k]);
      AddBias<kLanes>(a, group, hidden, i, t[k]);
      AddSquares<kLanes>(t[k], post_sum_of_squares);
    }
    const float post_inv_rms = RowInverseRms</*kPartialsReused=*/true>(
        post_sum_of_squares, hidden, a.eps, tpr, lane, threadIdx.x / tpr, partials);
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      const int i = lane + k * tpr;
      if (!active || i >= a.row_vectors) continue;
      float g[kLanes];
      LoadFloatLanes<kLanes>(GroupRow(a.post_gamma, group, hidden), i, g);
#pragma unroll
      for (int j = 0; j < kLanes; ++j) t[k][j] = __fmul_rn(__fmul_rn(t[k][j], post_inv_rms), g[j]);
      add_residual(k, i, t[k]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      const int i = lane + k * tpr;
      if (!active || i >= a.row_vectors) continue;
      float t[kLanes];
      reduce(k, i, t);
      AddBias<kLanes>(a, group, hidden, i, t);
      add_residual(k, i, t);
    }
  }
  // Blocks loop over rows: partials are written again by the next row.
  const float inv_rms = RowInverseRms</*kPartialsReused=*/true>(
      sum_of_squares, hidden, a.eps, tpr, lane, threadIdx.x / tpr, partials);
#pragma unroll
  for (int k = 0; k < kVectors; ++k) {
    const int i = lane + k * tpr;
    if (!active || i >= a.row_vectors) continue;
    float v[kLanes], g[kLanes], y[kLanes];
    RL::Unpack(stored[k], v);
    LoadFloatLanes<kLanes>(GroupRow(a.gamma, group, hidden), i, g);
#pragma unroll
    for (int j = 0; j < kLanes; ++j) y[j] = __fmul_rn(__fmul_rn(v[j], inv_rms), g[j]);
    emit_out(i, y);
  }
}

template <Dtype D, Dtype R, bool kPostNorm, int kVectors>
__global__ void __launch_bounds__(kMaxThreadsPerRow) OneShotRmsNormKernel(
    const __grid_constant__ RmsNormLaunchArgs a) {
  using RL = ResidualLanes<D, R>;
  __shared__ double partials[kMaxThreadsPerRow / 32];
  const LaunchContext ctx = BeginLaunch(a);
  if (!ctx.live) {
    FillRmsNormOutputs<D, R>(a);
    return;
  }
  SendHeader(a, ctx.launch);
  const uint32_t flag = LaunchFlag(ctx.launch);
  const int parity = static_cast<int>(ctx.launch & 1);
  Waiter waiter(a, ctx.launch);
  bool ok = true;
  const float scale = a.quantize ? __ldg(a.scale) : 1.0f;
  const int tpr = a.threads_per_row;
  const int lane = threadIdx.x % tpr;
  const int rows_at_once = blockDim.x / tpr;
  const uint64_t row_bytes = static_cast<uint64_t>(a.row_vectors) * 16;
  const uint64_t residual_row_bytes = ResidualRowBytes<D, R>(a);
  const int out_bytes = OutVectorBytes<D>(a);

  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rows_at_once; base < a.rows;
       base += static_cast<int64_t>(gridDim.x) * rows_at_once) {
    const int64_t row = base + threadIdx.x / tpr;
    const bool active = row < a.rows;
    uint4 mine[kVectors];
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      const int i = lane + k * tpr;
      if (!active || i >= a.row_vectors) continue;
      mine[k] = LoadInput16(RowOf(a.x, row, row_bytes) + 16 * i);
      SendPacketPair(a, parity, a.slot_bytes, 2 * (row * a.row_vectors + i), mine[k], flag);
    }
    NormalizeReducedRow<D, R, kPostNorm, kVectors>(
        a, row, active, partials,
        [&](int k, int i, float* acc) {
          const uint64_t packet = 2 * (row * a.row_vectors + i);
          AccumulateVector<D>(static_cast<int>(ReduceOp::kSum), a.world, [&](int s) {
            return PacketPairFrom(a, s, mine[k], parity, a.slot_bytes, packet, flag, waiter, ok);
          }, acc);
        },
        [&](int i, const uint4 (&words)[RL::kWords]) {
          if (ok) RL::Store(RowOf(a.residual_out, row, residual_row_bytes), i, words);
        },
        [&](int i, const float* y) {
          if (ok) StoreOut<D>(a, scale, y, RowOf(a.out, row, row_bytes / 16 * out_bytes) + out_bytes * i);
        });
  }
  if (ok) CheckHeader(a, waiter);
  FinishLaunch(a, ctx);
}

template <Dtype D, Dtype R, bool kPostNorm, int kVectors>
__global__ void __launch_bounds__(kMaxThreadsPerRow) TwoShotRmsNormKernel(
    const __grid_constant__ RmsNormLaunchArgs a) {
  using RL = ResidualLanes<D, R>;
  __shared__ double partials[kMaxThreadsPerRow / 32];
  const LaunchContext ctx = BeginLaunch(a);
  if (!ctx.live) {
    FillRmsNormOutputs<D, R>(a);
    return;
  }
  SendHeader(a, ctx.launch);
  const int parity = static_cast<int>(ctx.launch & 1);
  Waiter waiter(a, ctx.launch);
  const float scale = a.quantize ? __ldg(a.scale) : 1.0f;
  const int tpr = a.threads_per_row;
  const int lane = threadIdx.x % tpr;
  const int rows_at_once = blockDim.x / tpr;
  const uint64_t row_bytes = static_cast<uint64_t>(a.row_vectors) * 16;
  const uint64_t residual_row_bytes = ResidualRowBytes<D, R>(a);
  const int residual_row_words = a.row_vectors * RL::kWords;
  const int out_bytes = OutVectorBytes<D>(a);
  const uint64_t out_row_bytes = static_cast<uint64_t>(a.row_vectors) * out_bytes;
  // This block's rows of a group: [lo, hi).
  const int64_t lo = blockIdx.x * a.rows_per_block;
  const int64_t hi = min(lo + a.rows_per_block, a.group_rows);
  const auto phase0 = [&](int owner, int sender) {
    return PlainHalf(a, owner, parity) + sender * a.phase0_slot_bytes;
  };
  const auto phase1 = [&](int owner, int sender) {
    return PlainHalf(a, owner, parity) + a.world * a.phase0_slot_bytes +
           sender * a.phase1_slot_bytes;
  };

  // Phase 0: my x rows of group j go to rank j.
  for (int step = 1; step < a.world; ++step) {
    const int peer = (a.rank + step) % a.world;
    for (int64_t base = lo; base < hi; base += rows_at_once) {
      const int64_t group_row = base + threadIdx.x / tpr;
      const int64_t row = peer * a.group_rows + group_row;
      if (group_row >= hi || row >= a.rows) continue;
      for (int i = lane; i < a.row_vectors; i += tpr) {
        Store16(phase0(peer, a.rank) + group_row * row_bytes + 16 * i,
                LoadInput16(RowOf(a.x, row, row_bytes) + 16 * i));
      }
    }
  }
  SignalPeers(a, 0, ctx.launch);
  bool ok = WaitForPeers(a, 0, waiter);

  // My group: reduce, add the residual, normalize; both outputs go to my
  // outputs and to slot `rank` of every peer's phase-1 area.
  if (ok) {
    for (int64_t base = lo; base < hi; base += rows_at_once) {  // uniform: RowInverseRms syncs
      const int64_t group_row = base + threadIdx.x / tpr;
      const int64_t row = a.rank * a.group_rows + group_row;
      const bool active = group_row < hi && row < a.rows;
      NormalizeReducedRow<D, R, kPostNorm, kVectors>(
          a, row, active, partials,
          [&](int, int i, float* acc) {
            const uint4 mine = LoadInput16(RowOf(a.x, row, row_bytes) + 16 * i);
            AccumulateVector<D>(static_cast<int>(ReduceOp::kSum), a.world, [&](int s) {
              if (s == a.rank) return mine;
              return LoadShared16(phase0(a.rank, s) + group_row * row_bytes + 16 * i);
            }, acc);
          },
          [&](int i, const uint4 (&words)[RL::kWords]) {
            RL::Store(RowOf(a.residual_out, row, residual_row_bytes), i, words);
            for (int step = 1; step < a.world; ++step) {
              RL::Store(phase1((a.rank + step) % a.world, a.rank) + group_row * residual_row_bytes,
                        i, words);
            }
          },
          [&](int i, const float* y) {
            StoreOut<D>(a, scale, y, RowOf(a.out, row, out_row_bytes) + out_bytes * i);
            for (int step = 1; step < a.world; ++step) {
              std::byte* theirs = phase1((a.rank + step) % a.world, a.rank) + a.out_offset +
                                  group_row * out_row_bytes + out_bytes * i;
              StoreOut<D>(a, scale, y, theirs);
            }
          });
    }
    SignalPeers(a, 1, ctx.launch);
    ok = WaitForPeers(a, 1, waiter);
  }

  // Phase 1: every other group's outputs into mine.
  if (ok) {
    for (int step = 1; step < a.world; ++step) {
      const int owner = (a.rank + step) % a.world;
      const std::byte* src = phase1(a.rank, owner);
      for (int64_t base = lo; base < hi; base += rows_at_once) {
        const int64_t group_row = base + threadIdx.x / tpr;
        const int64_t row = owner * a.group_rows + group_row;
        if (group_row >= hi || row >= a.rows) continue;
        for (int w = lane; w < residual_row_words; w += tpr) {
          Store16(RowOf(a.residual_out, row, residual_row_bytes) + 16 * w,
                  LoadShared16(src + group_row * residual_row_bytes + 16 * w));
        }
        for (int i = lane; i < a.row_vectors; i += tpr) {
          const std::byte* from = src + a.out_offset + group_row * out_row_bytes + out_bytes * i;
          std::byte* to = RowOf(a.out, row, out_row_bytes) + out_bytes * i;
          if (out_bytes == 16) {
            Store16(to, LoadShared16(from));
          } else if (out_bytes == 8) {
            *reinterpret_cast<uint2*>(to) = __ldcg(reinterpret_cast<const uint2*>(from));
          } else {
            *reinterpret_cast<uint32_t*>(to) = __ldcg(reinterpret_cast<const unsigned int*>(from));
          }
        }
      }
    }
    CheckHeader(a, waiter);
  }
  FinishLaunch(a, ctx);
}

template <Dtype D, Dtype R, bool kPostNorm, int kVectors>
cudaError_t LaunchTyped(Algorithm algorithm, const RmsNormLaunchArgs& args, int blocks, int threads,
                        cudaStream_t stream) {
  if (algorithm == Algorithm::kOneShot) {
    OneShotRmsNormKernel<D, R, kPostNorm, kVectors><<<blocks, threads, 0, stream>>>(args);
  } else {
    TwoShotRmsNormKernel<D, R, kPostNorm, kVectors><<<blocks, threads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

template <Dtype D, Dtype R, bool kPostNorm>
cudaError_t LaunchVectors(Algorithm algorithm, const RmsNormLaunchArgs& args, int blocks,
                          int threads, int vectors_per_thread, cudaStream_t stream) {
  switch (vectors_per_thread) {
    case 1: return LaunchTyped<D, R, kPostNorm, 1>(algorithm, args, blocks, threads, stream);
    case 2: return LaunchTyped<D, R, kPostNorm, 2>(algorithm, args, blocks, threads, stream);
    case 3: return LaunchTyped<D, R, kPostNorm, 3>(algorithm, args, blocks, threads, stream);
    default: return LaunchTyped<D, R, kPostNorm, 4>(algorithm, args, blocks, threads, stream);
  }
}

template <Dtype D, Dtype R>
cudaError_t LaunchPostNorm(Algorithm algorithm, const RmsNormLaunchArgs& args, int blocks,
                           int threads, int vectors_per_thread, cudaStream_t stream) {
  return args.post_gamma != nullptr
             ? LaunchVectors<D, R, true>(algorithm, args, blocks, threads, vectors_per_thread,
                                         stream)
             : LaunchVectors<D, R, false>(algorithm, args, blocks, threads, vectors_per_thread,
                                          stream);
}

// A residual of x's type, or (16-bit x) float32.
template <Dtype D>
cudaError_t LaunchResidual(Algorithm algorithm, const RmsNormLaunchArgs& args, int blocks,
                           int threads, int vectors_per_thread, cudaStream_t stream) {
  if constexpr (D != Dtype::kF32) {
    if (args.residual_dtype == Dtype::kF32) {
      return LaunchPostNorm<D, Dtype::kF32>(algorithm, args, blocks, threads, vectors_per_thread,
                                            stream);
    }
  }
  return LaunchPostNorm<D, D>(algorithm, args, blocks, threads, vectors_per_thread, stream);
}

template <Dtype D, Dtype R, bool kPostNorm>
cudaError_t LoadVariant() {
  cudaFuncAttributes attributes;
  const void* kernels[] = {
      reinterpret_cast<const void*>(OneShotRmsNormKernel<D, R, kPostNorm, 1>),
      reinterpret_cast<const void*>(OneShotRmsNormKernel<D, R, kPostNorm, 2>),
      reinterpret_cast<const void*>(OneShotRmsNormKernel<D, R, kPostNorm, 3>),
      reinterpret_cast<const void*>(OneShotRmsNormKernel<D, R, kPostNorm, 4>),
      reinterpret_cast<const void*>(TwoShotRmsNormKernel<D, R, kPostNorm, 1>),
      reinterpret_cast<const void*>(TwoShotRmsNormKernel<D, R, kPostNorm, 2>),
      reinterpret_cast<const void*>(TwoShotRmsNormKernel<D, R, kPostNorm, 3>),
      reinterpret_cast<const void*>(TwoShotRmsNormKernel<D, R, kPostNorm, 4>),
  };
  for (const void* kernel : kernels) {
    if (const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel); err != cudaSuccess) {
      return err;
    }
  }
  return cudaSuccess;
}

template <Dtype D, Dtype R>
cudaError_t LoadTyped() {
  if (const cudaError_t err = LoadVariant<D, R, false>(); err != cudaSuccess) return err;
  return LoadVariant<D, R, true>();
}

}  // namespace

cudaError_t LaunchAllReduceRmsNorm(Algorithm algorithm, const RmsNormLaunchArgs& args, int blocks,
                                   int threads, int vectors_per_thread, cudaStream_t stream) {
  switch (args.dtype) {
    case Dtype::kF32:
      return LaunchResidual<Dtype::kF32>(algorithm, args, blocks, threads, vectors_per_thread, stream);
    case Dtype::kBF16:
      return LaunchResidual<Dtype::kBF16>(algorithm, args, blocks, threads, vectors_per_thread, stream);
    case Dtype::kF16:
      return LaunchResidual<Dtype::kF16>(algorithm, args, blocks, threads, vectors_per_thread, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LoadRmsNormKernels() {
  for (cudaError_t err : {LoadTyped<Dtype::kF32, Dtype::kF32>(),
                          LoadTyped<Dtype::kBF16, Dtype::kBF16>(),
                          LoadTyped<Dtype::kBF16, Dtype::kF32>(),
                          LoadTyped<Dtype::kF16, Dtype::kF16>(),
                          LoadTyped<Dtype::kF16, Dtype::kF32>()}) {
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace jax_ar::gpu
