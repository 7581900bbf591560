// Loading kernels ahead of their first launch: with CUDA's lazy loading a
// kernel's code is loaded at its first launch, which for a custom call may
// fall inside XLA's graph capture. Each .cu file's Load*Kernels entry point
// (kernels.h, protocol_probe.h, reduce_scatter_all_gather.h) names its
// kernels once through LoadEach.
#pragma once

#include <cuda_runtime.h>

namespace jax_ar::gpu {

/// Loads each of `kernels` on the current device (cudaFuncGetAttributes
/// does) and returns the first error, or cudaSuccess.
template <typename... Kernels>
cudaError_t LoadEach(Kernels*... kernels) {
  cudaFuncAttributes attributes;
  for (const void* kernel : {reinterpret_cast<const void*>(kernels)...}) {
    if (const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel); err != cudaSuccess) {
      return err;
    }
  }
  return cudaSuccess;
}

}  // namespace jax_ar::gpu
