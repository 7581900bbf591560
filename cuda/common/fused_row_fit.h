// Whether rows of the fused all-reduce + norm fit one round of a workspace:
// the rule the CUDA handler cuts calls by and both modules' capacities()
// report (max_fused_row_bytes, and max_fused_row_bytes_f32_residual for a
// float32 residual beside 16-bit x), so that Python decides exactly as the
// handler does.
#pragma once

#include <cstdint>

#include "common/protocol.h"

namespace jax_ar {

/// Rows of its group one sender's share of a data half carries in the
/// two-shot layout: per row a row of x (phase 0, `row_bytes`) and a row of
/// each output (phase 1: `residual_row_bytes` for residual_out,
/// `out_row_bytes` for out), the three regions each aligned (kAlign of slack
/// apiece). 0 when not even one row fits.
inline constexpr uint64_t FusedGroupRows(uint64_t sender_share, uint64_t row_bytes,
                                         uint64_t residual_row_bytes, uint64_t out_row_bytes) {
  constexpr uint64_t kSlack = 3 * kAlign;
  return sender_share > kSlack
             ? (sender_share - kSlack) / (row_bytes + residual_row_bytes + out_row_bytes)
             : 0;
}

/// How many bytes of residual (and residual_out) a row has per byte of x:
/// 1 when the residual is of x's type; 2 for a float32 residual beside
/// 16-bit x, the widest pair the kernels take (common/rms_norm_args.h).
inline constexpr uint64_t kWideResidualFactor = 2;

/// The longest row, in bytes up to `upper`, for which fits(row_bytes) holds,
/// where fits holds for every row up to some length and none beyond it; 0
/// when not even one byte fits. Searched rather than solved, so that the
/// answer is the handler's own rule, whatever it becomes.
template <typename Fits>
uint64_t LongestFittingRow(uint64_t upper, Fits&& fits) {
  if (upper == 0 || !fits(uint64_t{1})) return 0;
  if (fits(upper)) return upper;
  uint64_t lo = 1, hi = upper;  // fits(lo), !fits(hi)
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace jax_ar
