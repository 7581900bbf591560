// FFI handlers of jax_ar.rms_norm on CPU devices: jax_ar_rms_norm (x, gamma
// -> out) and jax_ar_add_rms_norm (x, residual, gamma -> out, residual_out);
// operands as common/rms_norm_args.h lists them.
#include "cpu/rms_norm.h"

#include <string>
#include <vector>

#include "cpu/exchange.h"  // KeepSubnormals

namespace jax_ar::cpu {

namespace {

// Normalizes rows of x (+ residual) into out (and residual_out). XTraits is
// x's (and out's) type, RTraits the residual's (and residual_out's).
template <typename XTraits, typename RTraits>
void NormRows(const ffi::AnyBuffer& x, const ffi::AnyBuffer* residual, const ffi::AnyBuffer& gamma,
              ffi::AnyBuffer& out, ffi::AnyBuffer* residual_out, size_t rows, size_t hidden,
              float eps) {
  using Storage = typename XTraits::Storage;
  using ResidualStorage = typename RTraits::Storage;
  const auto* xs = static_cast<const Storage*>(x.untyped_data());
  const auto* gs = static_cast<const float*>(gamma.untyped_data());
  auto* os = static_cast<Storage*>(out.untyped_data());
  const auto* rs =
      residual ? static_cast<const ResidualStorage*>(residual->untyped_data()) : nullptr;
  auto* ros = residual_out ? static_cast<ResidualStorage*>(residual_out->untyped_data()) : nullptr;
  std::vector<float> v(hidden);
  for (size_t row = 0; row < rows; ++row) {
    const size_t base = row * hidden;
    for (size_t i = 0; i < hidden; ++i) {
      float value = XTraits::Load(xs[base + i]);
      if (rs != nullptr) {
        // The residual stream is kept in its own type: round the sum, and
        // normalize what was stored, so out is the norm of residual_out.
        const ResidualStorage rounded = RTraits::Store(value + RTraits::Load(rs[base + i]));
        ros[base + i] = rounded;
        value = RTraits::Load(rounded);
      }
      v[i] = value;
    }
    NormalizeRow(v.data(), gs, hidden, eps,
                 [&](size_t i, float y) { os[base + i] = XTraits::Store(y); });
  }
}

ffi::Error Run(const char* op, const ffi::AnyBuffer& x, const ffi::AnyBuffer* residual,
               const ffi::AnyBuffer& gamma, ffi::AnyBuffer& out, ffi::AnyBuffer* residual_out,
               float eps) {
  // Subnormals are kept (XLA:CPU's threads flush them): a row of huge values
  // has a subnormal inverse RMS, and residual sums may be subnormal.
  KeepSubnormals keep_subnormals;
  size_t rows = 0, hidden = 0;
  if (auto error = CheckRmsNormCall(op, x, residual, gamma, out, residual_out, eps, rows,
                                    hidden);
      error.failure()) {
    return error;
  }
  const ffi::DataType residual_dtype = residual ? residual->element_type() : x.element_type();
  DispatchNormDtypes(x.element_type(), residual_dtype, [&](auto x_traits, auto r_traits) {
    NormRows<decltype(x_traits), decltype(r_traits)>(x, residual, gamma, out, residual_out, rows,
                                                     hidden, eps);
  });
  return ffi::Error::Success();
}

ffi::Error RmsNormHandler(ffi::AnyBuffer x,                 // [..., hidden]
                          ffi::AnyBuffer gamma,             // float32 [hidden]
                          ffi::Result<ffi::AnyBuffer> out,  // like x
                          float eps) {
  return Run("rms_norm", x, nullptr, gamma, *out, nullptr, eps);
}

ffi::Error AddRmsNormHandler(ffi::AnyBuffer x,                          // [..., hidden]
                             ffi::AnyBuffer residual,                   // x's type or float32
                             ffi::AnyBuffer gamma,                      // float32 [hidden]
                             ffi::Result<ffi::AnyBuffer> out,           // like x
                             ffi::Result<ffi::AnyBuffer> residual_out,  // like residual
                             float eps) {
  return Run("rms_norm", x, &residual, gamma, *out, &(*residual_out), eps);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kRmsNorm, RmsNormHandler,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Arg<ffi::AnyBuffer>()  // gamma
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Attr<float>("eps"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(kAddRmsNorm, AddRmsNormHandler,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Arg<ffi::AnyBuffer>()  // residual
                                  .Arg<ffi::AnyBuffer>()  // gamma
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::AnyBuffer>()  // residual_out
                                  .Attr<float>("eps"));

}  // namespace jax_ar::cpu
