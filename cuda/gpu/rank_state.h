// One rank of a communicator on a GPU, as its FFI handlers see it, and the
// device memory a communicator holds in this process.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/protocol.h"
#include "common/rank_identity.h"
#include "gpu/layout.h"

namespace jax_ar::gpu {

// Makes `device` current for the scope and restores the previous device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&saved_) != cudaSuccess) saved_ = -1;
    if (saved_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (saved_ >= 0) cudaSetDevice(saved_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int saved_ = -1;
};

// Device memory of one communicator in this process: workspaces it
// allocated and peer workspaces it mapped, plus whatever went wrong while
// mapping (reported by verify(), which then selects the psum fallback).
struct CommResources {
  struct Mapping {
    int device;
    void* address;
    bool owned;  // cudaMalloc'd here (cudaFree) rather than IPC-opened (close the handle)
  };
  std::mutex mutex;
  std::vector<Mapping> mappings;
  std::vector<std::string> problems;

  void AddProblem(std::string text) {
    std::lock_guard<std::mutex> lock(mutex);
    problems.push_back(std::move(text));
  }
};

struct RankState : RankIdentity {
  static constexpr const char* kDeviceKind = "GPU";

  RankState() = default;
  RankState(const RankState&) = delete;
  RankState& operator=(const RankState&) = delete;
  ~RankState();

  int slot = -1;                      // in the device's LocalControl table
  uint64_t token = 0;                 // this registration's value of that slot
  LocalControl* local = nullptr;      // device address of the slot
  FailureRecord* record = nullptr;    // host-mapped; the kernels' failure report
  FailureRecord* record_device = nullptr;

  std::shared_ptr<CommResources> resources;

  DataLayout layout() const { return LayoutOf(workspace_bytes); }

  // The core of this rank's failure (failure_text.h), or "" while it is
  // healthy.
  std::string Failure() const;
  // Records a failure found on the host (a launch that did not start), as
  // the core of its message.
  void SetHostFailure(const std::string& core);

 private:
  mutable std::mutex failure_mutex_;
  std::string host_failure_;
};

// Owns the LocalControl slots of every device in this process.
int AcquireSlot(int device);
void ReleaseSlot(int device, int slot);

}  // namespace jax_ar::gpu
