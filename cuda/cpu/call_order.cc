// jax_ar_order: the CPU custom call that keeps jax_ar's calls in program
// order (jax_ar/_call_order.py says why). Its results alias its leading
// operands; the trailing operand is the previous jax_ar call's result, read
// only so that XLA:CPU's dataflow executor runs this call after that one.
#include "cpu/call_order.h"

#include <cstring>

namespace jax_ar::cpu {
namespace {

ffi::Error CallOrderHandler(ffi::RemainingArgs args,   // operands..., previous call's result
                            ffi::RemainingRets rets) {  // the operands, aliased
  if (args.size() != rets.size() + 1) {
    return InvalidArgument("jax_ar_order expects one more operand than results");
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto in = args.get<ffi::AnyBuffer>(i);
    auto out = rets.get<ffi::AnyBuffer>(i);
    if (in.has_error()) return in.error();
    if (out.has_error()) return out.error();
    if ((*out)->size_bytes() != in->size_bytes()) {
      return InvalidArgument("jax_ar_order result does not match its operand");
    }
    // XLA honours the aliasing, so this copies nothing; it keeps the call
    // correct if a future XLA ever gives the result a buffer of its own.
    if ((*out)->untyped_data() != in->untyped_data()) {
      std::memcpy((*out)->untyped_data(), in->untyped_data(), in->size_bytes());
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kCallOrder, CallOrderHandler,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets());

}  // namespace jax_ar::cpu
