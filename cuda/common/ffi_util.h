// Small helpers shared by the CPU and CUDA handlers.
#pragma once

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace jax_ar {

namespace ffi = ::xla::ffi;

inline const char* DtypeName(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::S32: return "int32";
    case ffi::DataType::F8E4M3FN: return "float8_e4m3fn";
    default: return "unsupported";
  }
}

inline size_t DtypeBytes(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32:
    case ffi::DataType::S32: return 4;
    case ffi::DataType::BF16:
    case ffi::DataType::F16: return 2;
    case ffi::DataType::F8E4M3FN: return 1;
    default: return 0;
  }
}

inline ffi::Error InvalidArgument(std::string msg) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "jax_ar: " + msg);
}
inline ffi::Error Internal(std::string msg) {
  return ffi::Error(ffi::ErrorCode::kInternal, "jax_ar: " + msg);
}

}  // namespace jax_ar
