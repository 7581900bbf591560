// FFI handler of jax_ar.all_reduce_rms_norm on CPU devices (operands as
// common/all_reduce_rms_norm_ffi.h binds them). Per row, in float32:
//
//   t            = sum of x over ranks (rank order 0..N-1), + bias if given
//   with post_gamma: t = t * inverse_rms(t) * post_gamma
//   residual_out = round(t + float32(residual))     (the residual's type)
//   out          = norm(float32(residual_out)) * gamma, in x's type, or with
//                  quantize=1 float8_e4m3fn(saturate(that / scale))
//
// The sum is the CPU all-reduce protocol run on float32 copies of x, so it
// is exactly the float32 rank-order sum the CUDA kernel forms (16-bit inputs
// widen exactly) and is not rounded to x's type before the residual is added.
#include <cstdio>
#include <string>
#include <vector>

#include "common/all_reduce_rms_norm_ffi.h"
#include "common/handler_start.h"
#include "cpu/exchange.h"
#include "cpu/rms_norm.h"

namespace jax_ar::cpu {
namespace {

constexpr Operation kOperation = Operation::kAllReduceRmsNorm;

// The call as a peer's mismatch error names it (rank_state.h: at most 103
// characters), e.g. "all_reduce_rms_norm oneshot of bfloat16[2,256],
// float32 residual, eps 1e-06, post_gamma, bias, float8 out".
std::string CallText(Algorithm algorithm, const ffi::AnyBuffer& x, const ffi::AnyBuffer& residual,
                     size_t rows, size_t hidden, bool quantize, float eps,
                     const NormVectors& vectors) {
  char eps_text[32];
  std::snprintf(eps_text, sizeof(eps_text), "%g", eps);
  std::string text = std::string("all_reduce_rms_norm ") + AlgorithmName(algorithm) + " of " +
                     DtypeName(x.element_type()) + "[" + std::to_string(rows) + "," +
                     std::to_string(hidden) + "], " + DtypeName(residual.element_type()) +
                     " residual, eps " + eps_text;
  if (vectors.groups > 1) text += ", " + std::to_string(vectors.groups) + " gammas";
  if (vectors.post_norm) text += ", post_gamma";
  if (vectors.bias) text += ", bias";
  if (quantize) text += ", float8 out";
  return text;
}

template <typename XTraits, typename RTraits>
ffi::Error ReduceAndNormalize(RankState& state, Algorithm algorithm, const ffi::AnyBuffer& x,
                              const ffi::AnyBuffer& residual, const ffi::AnyBuffer& gamma,
                              const ffi::AnyBuffer& post_gamma, const ffi::AnyBuffer& bias,
                              const NormVectors& vectors, float scale, bool quantize,
                              ffi::AnyBuffer& out, ffi::AnyBuffer& residual_out, size_t rows,
                              size_t hidden, float eps) {
  using Storage = typename XTraits::Storage;
  using ResidualStorage = typename RTraits::Storage;
  const size_t count = rows * hidden;
  const auto* xs = static_cast<const Storage*>(x.untyped_data());
  std::vector<float> widened;
  const float* partial = nullptr;
  if constexpr (std::is_same_v<XTraits, F32Traits>) {
    partial = xs;
  } else {
    widened.resize(count);
    for (size_t i = 0; i < count; ++i) widened[i] = XTraits::Load(xs[i]);
    partial = widened.data();
  }
  std::vector<float> summed(count);
  Segment segment;
  segment.in = reinterpret_cast<const std::byte*>(partial);
  segment.out = reinterpret_cast<std::byte*>(summed.data());
  segment.bytes = count * sizeof(float);
  segment.dtype = ffi::DataType::F32;
  Message message({segment}, ReduceOp::kSum, algorithm, state.world, kOperation);
  // Peers must make the same fused call, not only send as many floats.
  message.signature = HashMix(message.signature,
                              NormCallHash(x.element_type(), residual.element_type(), rows, hidden,
                                           quantize ? 1 : 0, eps, vectors));
  message.description = CallText(algorithm, x, residual, rows, hidden, quantize, eps, vectors);
  if (auto error = RunAllReduce(state, message); error.failure()) return error;

  // The residual add and the norms keep subnormals too (XLA:CPU's threads
  // flush them): a row of huge values has a subnormal inverse RMS.
  KeepSubnormals keep_subnormals;
  const auto* rs = static_cast<const ResidualStorage*>(residual.untyped_data());
  auto* ros = static_cast<ResidualStorage*>(residual_out.untyped_data());
  const auto* gammas = static_cast<const float*>(gamma.untyped_data());
  const auto* post_gammas = static_cast<const float*>(post_gamma.untyped_data());
  const auto* biases = static_cast<const float*>(bias.untyped_data());
  std::vector<float> v(hidden);
  for (size_t row = 0; row < rows; ++row) {
    const size_t base = row * hidden;
    const size_t group = (row / vectors.rows_per_group) * hidden;  // this row's scale vectors
    float* t = summed.data() + base;
    if (vectors.bias) {
      for (size_t i = 0; i < hidden; ++i) t[i] += biases[group + i];
    }
    if (vectors.post_norm) {
      // The post-norm (Gemma 2/3) of the float32 sum, not rounded before
      // the residual add.
      NormalizeRow(t, post_gammas + group, hidden, eps, [&](size_t i, float y) { t[i] = y; });
    }
    for (size_t i = 0; i < hidden; ++i) {
      const ResidualStorage rounded = RTraits::Store(t[i] + RTraits::Load(rs[base + i]));
      ros[base + i] = rounded;
      v[i] = RTraits::Load(rounded);
    }
    if (quantize) {
      auto* os = static_cast<uint8_t*>(out.untyped_data()) + base;
      NormalizeRow(v.data(), gammas + group, hidden, eps,
                   [&](size_t i, float y) { os[i] = FloatToE4m3fnSaturated(y / scale); });
    } else {
      auto* os = static_cast<Storage*>(out.untyped_data()) + base;
      NormalizeRow(v.data(), gammas + group, hidden, eps,
                   [&](size_t i, float y) { os[i] = XTraits::Store(y); });
    }
  }
  return ffi::Error::Success();
}

// Parameters after the context: common/all_reduce_rms_norm_ffi.h.
ffi::Error AllReduceRmsNormHandler(int32_t device_ordinal, ffi::AnyBuffer x,
                                   ffi::AnyBuffer residual, ffi::AnyBuffer gamma,
                                   ffi::AnyBuffer post_gamma, ffi::AnyBuffer bias,
                                   ffi::BufferR0<ffi::F32> scale, ffi::Result<ffi::AnyBuffer> out,
                                   ffi::Result<ffi::AnyBuffer> residual_out, int64_t comm_id,
                                   int32_t algorithm, float eps, int32_t quantize) {
  size_t rows = 0, hidden = 0;
  NormVectors vectors;
  ffi::Error error = ffi::Error::Success();
  auto state = StartAllReduceRmsNorm<RankState>(comm_id, device_ordinal, algorithm, quantize, x,
                                                residual, gamma, post_gamma, bias, *out,
                                                *residual_out, eps, rows, hidden, vectors, error);
  if (state == nullptr) return error;
  const float scale_value = quantize ? *scale.typed_data() : 1.0f;
  DispatchNormDtypes(x.element_type(), residual.element_type(), [&](auto x_traits, auto r_traits) {
    error = ReduceAndNormalize<decltype(x_traits), decltype(r_traits)>(
        *state, static_cast<Algorithm>(algorithm), x, residual, gamma, post_gamma, bias, vectors,
        scale_value, quantize != 0, *out, *residual_out, rows, hidden, eps);
  });
  return error;
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kAllReduceRmsNorm, AllReduceRmsNormHandler,
                              BindAllReduceRmsNorm(ffi::Ffi::Bind().Ctx<ffi::DeviceOrdinal>()));

}  // namespace jax_ar::cpu
