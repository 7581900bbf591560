// FFI handler of jax_ar.all_reduce_rms_norm on CUDA devices: one fused
// kernel per launch (all_reduce_rms_norm_kernels.cu). A call runs in one
// launch unless its rows do not fit one round of the workspace; then it
// takes several launches of whole rows (all captured in the same graph).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "common/all_reduce_rms_norm_ffi.h"
#include "common/handler_start.h"
#include "common/norm_limits.h"
#include "common/rms_norm_args.h"
#include "gpu/handlers.h"
#include "gpu/kernels.h"
#include "gpu/row_plan.h"

namespace jax_ar::gpu {
namespace {

constexpr Operation kOperation = Operation::kAllReduceRmsNorm;
constexpr const char* kOp = "all_reduce_rms_norm";
ffi::Error Invalid(const std::string& text) { return InvalidCall(kOp, text); }

// The largest call (bytes of x per rank) the fused two-shot runs over LL
// packets, if it fits one launch of them (with the default workspace up to
// about 2 MB of hidden 4096 in 16-bit types at 2, 4 and 8 ranks). Since
// its clusters and its phase 1 of residual_out and inverse RMS (5fcf780),
// the LL kernel took 0.50-0.80x the plain one's time at 1 MB and
// 0.69-0.98x at 1.5 MB (hidden 4096 and 8192, 2, 4 and 8 ranks, one H200,
// 2026-12-05, docs/latency_log.md "Latency, thirty-third push"); the limit
// was 512 KB when the older LL kernel took 1.04-1.06x the plain one's
// time at 1 MB ("twenty-first push").
constexpr uint64_t kFusedLLMaxBytes = 2 << 20;

uint64_t Signature(Algorithm algorithm, int world, uint64_t norm_call) {
  return HashMix(HashMix(norm_call, static_cast<uint64_t>(algorithm)), static_cast<uint64_t>(world));
}

// What the kernel needs beyond what both backends check: [tokens, hidden]
// operands, a hidden size it serves, 16-byte aligned buffers.
ffi::Error CheckKernelTakes(const ffi::AnyBuffer& x, const ffi::AnyBuffer& residual,
                            const ffi::AnyBuffer& gamma, const ffi::AnyBuffer& post_gamma,
                            const ffi::AnyBuffer& bias, const ffi::AnyBuffer& out,
                            const ffi::AnyBuffer& residual_out, const NormVectors& vectors,
                            int64_t hidden) {
  if (x.dimensions().size() != 2) return Invalid("x must be [tokens, hidden], got " + ShapeText(x));
  const auto lanes = static_cast<int64_t>(kNormVectorBytes / DtypeBytes(x.element_type()));
  if (hidden < kFusedMinHidden || hidden > kFusedMaxHidden || hidden % lanes != 0) {
    return Invalid("the CUDA kernel needs a hidden size in [" + std::to_string(kFusedMinHidden) +
                   ", " + std::to_string(kFusedMaxHidden) + "] that is a multiple of " +
                   std::to_string(lanes) + ", got " + std::to_string(hidden));
  }
  // The kernels find a row's group by 32-bit division.
  if (vectors.groups > 1 && x.element_count() / hidden > static_cast<size_t>(INT32_MAX)) {
    return Invalid("rows with scale vectors per group must be fewer than 2^31, got " +
                   std::to_string(x.element_count() / hidden));
  }
  return CheckAligned(kOp, {x.untyped_data(), residual.untyped_data(), gamma.untyped_data(),
                            vectors.post_norm ? post_gamma.untyped_data() : nullptr,
                            vectors.bias ? bias.untyped_data() : nullptr,
                            residual_out.untyped_data(), out.untyped_data()});
}

// Parameters after the context: common/all_reduce_rms_norm_ffi.h.
ffi::Error AllReduceRmsNormHandler(cudaStream_t stream, int32_t device_ordinal, ffi::AnyBuffer x,
                                   ffi::AnyBuffer residual, ffi::AnyBuffer gamma,
                                   ffi::AnyBuffer post_gamma, ffi::AnyBuffer bias,
                                   ffi::BufferR0<ffi::F32> scale, ffi::Result<ffi::AnyBuffer> out,
                                   ffi::Result<ffi::AnyBuffer> residual_out, int64_t comm_id,
                                   int32_t algorithm, float eps, int32_t quantize) {
  size_t row_count = 0, hidden_size = 0;
  NormVectors vectors;
  ffi::Error error = ffi::Error::Success();
  auto state = StartAllReduceRmsNorm<RankState>(comm_id, device_ordinal, algorithm, quantize, x,
                                                residual, gamma, post_gamma, bias, *out,
                                                *residual_out, eps, row_count, hidden_size,
                                                vectors, error);
  if (state == nullptr) return error;
  const int64_t rows = static_cast<int64_t>(row_count), hidden = static_cast<int64_t>(hidden_size);
  if (auto error = CheckKernelTakes(x, residual, gamma, post_gamma, bias, *out, *residual_out,
                                    vectors, hidden);
      error.failure()) {
    return error;
  }
  if (rows == 0) return ffi::Error::Success();
  const size_t element_bytes = DtypeBytes(x.element_type());
  const size_t residual_element_bytes = DtypeBytes(residual.element_type());
  const int64_t lanes = static_cast<int64_t>(kNormVectorBytes / element_bytes);
  Dtype dtype, residual_dtype;
  // Both of the types CheckAllReduceRmsNormCall accepts.
  ToDtype(x.element_type(), dtype);
  ToDtype(residual.element_type(), residual_dtype);

  const int world = state->world;
  const int row_vectors = static_cast<int>(hidden / lanes);
  const uint64_t row_bytes = static_cast<uint64_t>(hidden) * element_bytes;
  const uint64_t residual_row_bytes = static_cast<uint64_t>(hidden) * residual_element_bytes;
  const uint64_t out_row_bytes = static_cast<uint64_t>(hidden) * (quantize ? 1 : element_bytes);
  const DataLayout layout = state->layout();
  const auto rows_per_launch_of = [&](Algorithm a) {
    return FusedRowsPerLaunch(layout, world, a, row_bytes, residual_row_bytes, out_row_bytes);
  };
  Algorithm algo = static_cast<Algorithm>(algorithm);
  // The LL region is a quarter of the data area: a row too long for it goes
  // two-shot (decided from sizes alone, so every rank switches alike).
  if (algo == Algorithm::kOneShot && rows_per_launch_of(algo) == 0) algo = Algorithm::kTwoShot;
  // The two-shot runs over LL packets for calls of up to kFusedLLMaxBytes
  // of x that fit one launch of it, rows of one or two vectors a thread
  // (row_plan.h); else over plain data and flags. From sizes alone, as
  // above.
  if (algo == Algorithm::kTwoShot &&
      PlanFusedRow(row_vectors).vectors_per_thread <= 2 &&
      static_cast<uint64_t>(rows) * row_bytes <= kFusedLLMaxBytes &&
      rows <= rows_per_launch_of(Algorithm::kTwoShotLL)) {
    algo = Algorithm::kTwoShotLL;
  }
  const int64_t rows_per_launch = rows_per_launch_of(algo);
  if (rows_per_launch == 0) {
    return Invalid("one row of " + std::to_string(row_bytes) + " bytes does not fit the workspace (" +
                   std::to_string(state->workspace_bytes) + " bytes for " + std::to_string(world) +
                   " ranks); set up the communicator with a larger workspace_bytes");
  }
  const uint64_t signature =
      Signature(algo, world,
                NormCallHash(x.element_type(), residual.element_type(), row_count, hidden_size,
                             quantize, eps, vectors));

  RmsNormLaunchArgs a{};
  FillProtocolArgs(*state, kOperation, a);
  a.gamma = static_cast<const float*>(gamma.untyped_data());
  a.post_gamma = vectors.post_norm ? static_cast<const float*>(post_gamma.untyped_data()) : nullptr;
  a.bias = vectors.bias ? static_cast<const float*>(bias.untyped_data()) : nullptr;
  a.rows_per_group = static_cast<int64_t>(vectors.rows_per_group);
  a.groups = static_cast<int32_t>(vectors.groups);
  a.scale = scale.typed_data();
  a.row_vectors = row_vectors;
  a.eps = eps;
  a.quantize = quantize;
  a.dtype = dtype;
  a.residual_dtype = residual_dtype;
  for (int64_t first = 0, index = 0; first < rows; first += rows_per_launch, ++index) {
    a.rows = std::min(rows_per_launch, rows - first);
    a.first_row = first;
    a.x = static_cast<const std::byte*>(x.untyped_data()) + first * row_bytes;
    a.residual = static_cast<const std::byte*>(residual.untyped_data()) + first * residual_row_bytes;
    a.residual_out =
        static_cast<std::byte*>(residual_out->untyped_data()) + first * residual_row_bytes;
    a.out = static_cast<std::byte*>(out->untyped_data()) + first * out_row_bytes;
    a.signature =
        SignatureOf(kOperation, HashMix(HashMix(signature, static_cast<uint64_t>(index)), a.rows));
    // Every rank plans a launch alike: from its rows, the row length and
    // the world size.
    // The LL kernels spread a row over a cluster where every row they
    // reduce (all of them one-shot, a group's two-shot) can have one.
    a.group_rows = (a.rows + world - 1) / world;
    const RowPlan plan =
        algo == Algorithm::kOneShot
            ? PlanFusedClusterRow(row_vectors, a.rows, BlockCap(world))
            : algo == Algorithm::kTwoShotLL
                  ? PlanFusedClusterRow(row_vectors, a.group_rows, BlockCap(world))
                  : PlanFusedRow(row_vectors);
    const int rows_at_once = plan.rows_per_block;
    a.threads_per_row = plan.threads_per_row;
    a.blocks_per_row = plan.blocks_per_row;
    int64_t blocks;
    if (algo == Algorithm::kOneShot) {
      a.slot_bytes = SlotBytes(layout, world, Algorithm::kOneShot);
      blocks = (a.rows + rows_at_once - 1) / rows_at_once * plan.blocks_per_row;
    } else {
      if (algo == Algorithm::kTwoShotLL) {
        a.slot_bytes = PlanKernel(layout, world, AllReduceKernel::kTwoShotLL).slot_bytes;
      } else {
        a.phase0_slot_bytes = AlignUp(a.group_rows * row_bytes);
        a.out_offset = AlignUp(a.group_rows * residual_row_bytes);
        a.phase1_slot_bytes = a.out_offset + AlignUp(a.group_rows * out_row_bytes);
      }
      blocks = (a.group_rows + rows_at_once - 1) / rows_at_once * plan.blocks_per_row;
    }
    // A clustered launch has a cluster a row within the cap (row_plan.h).
    blocks = std::clamp<int64_t>(blocks, 1, BlockCap(world));
    if (algo != Algorithm::kOneShot) {
      const int64_t row_groups = blocks / plan.blocks_per_row;  // blocks or clusters
      a.rows_per_block = (a.group_rows + row_groups - 1) / row_groups;
    }
    const cudaError_t err =
        LaunchAllReduceRmsNorm(algo, a, static_cast<int>(blocks), plan.block_threads(),
                               plan.vectors_per_thread, stream);
    if (err != cudaSuccess) return LaunchFailed(*state, kOperation, err);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kAllReduceRmsNorm, AllReduceRmsNormHandler,
                              BindAllReduceRmsNorm(ffi::Ffi::Bind()
                                                       .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                                       .Ctx<ffi::DeviceOrdinal>()),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace jax_ar::gpu
