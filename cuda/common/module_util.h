// What both nanobind modules (_jax_ar_cpu, _jax_ar_cuda) build their Python
// bindings from.
#pragma once

#include <nanobind/nanobind.h>

namespace jax_ar {

// An XLA FFI handler as the capsule jax.ffi.register_ffi_target takes.
template <typename T>
nanobind::capsule EncapsulateHandler(T* fn) {
  return nanobind::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace jax_ar
