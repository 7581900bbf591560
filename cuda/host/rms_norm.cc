// FFI handlers of jax_ar.rms_norm on CPU devices: jax_ar_rms_norm (x, gamma
// -> out) and jax_ar_add_rms_norm (x, residual, gamma -> out, residual_out).
#include "host/rms_norm.h"

#include <string>
#include <vector>

namespace jax_ar::host {

namespace {

std::string ShapeText(const ffi::AnyBuffer& b) {
  std::string text = "[";
  for (size_t i = 0; i < b.dimensions().size(); ++i) {
    text += (i ? ", " : "") + std::to_string(b.dimensions()[i]);
  }
  return text + "]";
}

bool SameShape(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b) {
  auto da = a.dimensions(), db = b.dimensions();
  if (da.size() != db.size()) return false;
  for (size_t i = 0; i < da.size(); ++i) {
    if (da[i] != db[i]) return false;
  }
  return true;
}

}  // namespace

ffi::Error CheckNormOperands(const char* op, const ffi::AnyBuffer& x, const ffi::AnyBuffer& gamma,
                             float eps, size_t& rows, size_t& hidden) {
  const ffi::DataType dtype = x.element_type();
  if (dtype != ffi::DataType::F32 && dtype != ffi::DataType::BF16 &&
      dtype != ffi::DataType::F16) {
    return InvalidArgument(std::string(op) + ": x must be float32, bfloat16 or float16, got " +
                           DtypeName(dtype));
  }
  if (gamma.element_type() != dtype) {
    return InvalidArgument(std::string(op) + ": gamma is " + DtypeName(gamma.element_type()) +
                           " but x is " + DtypeName(dtype));
  }
  if (x.dimensions().size() == 0) return InvalidArgument(std::string(op) + ": x must have rank >= 1");
  hidden = static_cast<size_t>(x.dimensions().back());
  if (gamma.dimensions().size() != 1 || static_cast<size_t>(gamma.dimensions()[0]) != hidden) {
    return InvalidArgument(std::string(op) + ": gamma has shape " + ShapeText(gamma) +
                           ", expected [" + std::to_string(hidden) + "] for x of shape " +
                           ShapeText(x));
  }
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    return InvalidArgument(std::string(op) + ": eps must be positive and finite, got " +
                           std::to_string(eps));
  }
  rows = hidden == 0 ? 0 : x.element_count() / hidden;
  return ffi::Error::Success();
}

ffi::Error CheckNormResult(const char* op, const char* name, const ffi::AnyBuffer& x,
                           const ffi::AnyBuffer& result, ffi::DataType dtype) {
  if (!SameShape(x, result) || result.element_type() != dtype) {
    return InvalidArgument(std::string(op) + ": result " + name + " is " +
                           DtypeName(result.element_type()) + ShapeText(result) + ", expected " +
                           DtypeName(dtype) + ShapeText(x));
  }
  return ffi::Error::Success();
}

namespace {

// Normalizes rows of x (+ residual) into out (and residual_out).
template <typename Traits>
void NormRows(const ffi::AnyBuffer& x, const ffi::AnyBuffer* residual, const ffi::AnyBuffer& gamma,
              ffi::AnyBuffer& out, ffi::AnyBuffer* residual_out, size_t rows, size_t hidden,
              float eps) {
  using Storage = typename Traits::Storage;
  const auto* xs = static_cast<const Storage*>(x.untyped_data());
  const auto* gs = static_cast<const Storage*>(gamma.untyped_data());
  auto* os = static_cast<Storage*>(out.untyped_data());
  const Storage* rs = residual ? static_cast<const Storage*>(residual->untyped_data()) : nullptr;
  Storage* ros = residual_out ? static_cast<Storage*>(residual_out->untyped_data()) : nullptr;
  std::vector<float> v(hidden);
  for (size_t row = 0; row < rows; ++row) {
    const size_t base = row * hidden;
    for (size_t i = 0; i < hidden; ++i) {
      float value = Traits::Load(xs[base + i]);
      if (rs != nullptr) {
        // The residual stream is kept in x's type: round the sum, and
        // normalize what was stored, so out is the norm of residual_out.
        const Storage rounded = Traits::Store(value + Traits::Load(rs[base + i]));
        ros[base + i] = rounded;
        value = Traits::Load(rounded);
      }
      v[i] = value;
    }
    NormalizeRow<Traits>(v.data(), gs, hidden, eps,
                         [&](size_t i, float y) { os[base + i] = Traits::Store(y); });
  }
}

ffi::Error Run(const char* op, const ffi::AnyBuffer& x, const ffi::AnyBuffer* residual,
               const ffi::AnyBuffer& gamma, ffi::AnyBuffer& out, ffi::AnyBuffer* residual_out,
               float eps) {
  size_t rows = 0, hidden = 0;
  if (auto error = CheckNormOperands(op, x, gamma, eps, rows, hidden); error.failure()) {
    return error;
  }
  const ffi::DataType dtype = x.element_type();
  if (auto error = CheckNormResult(op, "out", x, out, dtype); error.failure()) return error;
  if (residual != nullptr) {
    if (auto error = CheckNormResult(op, "residual", x, *residual, dtype); error.failure()) {
      return error;
    }
    if (auto error = CheckNormResult(op, "residual_out", x, *residual_out, dtype);
        error.failure()) {
      return error;
    }
  }
  DispatchNormDtype(dtype, [&](auto traits) {
    NormRows<decltype(traits)>(x, residual, gamma, out, residual_out, rows, hidden, eps);
  });
  return ffi::Error::Success();
}

ffi::Error RmsNormHandler(ffi::AnyBuffer x,                 // [..., hidden]
                          ffi::AnyBuffer gamma,             // [hidden]
                          ffi::Result<ffi::AnyBuffer> out,  // like x
                          float eps) {
  return Run("rms_norm", x, nullptr, gamma, *out, nullptr, eps);
}

ffi::Error AddRmsNormHandler(ffi::AnyBuffer x,                          // [..., hidden]
                             ffi::AnyBuffer residual,                   // like x
                             ffi::AnyBuffer gamma,                      // [hidden]
                             ffi::Result<ffi::AnyBuffer> out,           // like x
                             ffi::Result<ffi::AnyBuffer> residual_out,  // round(x + residual)
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

}  // namespace jax_ar::host
