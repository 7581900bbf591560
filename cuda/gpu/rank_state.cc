#include "gpu/rank_state.h"

#include <bitset>
#include <cstdio>
#include <map>

namespace jax_ar::gpu {

RankState::~RankState() {
  // Kernels never touch the record once the slot's token is gone (close()
  // clears it before the rank state can be dropped).
  if (record != nullptr) cudaFreeHost(record);
}

std::string RankState::Failure() const {
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (!host_failure_.empty()) return host_failure_;
  }
  if (record == nullptr) return "";
  const volatile FailureRecord* r = record;
  const uint32_t kind = r->kind;  // written last by the kernel
  if (kind == kHealthy) return "";
  const int me = r->rank, culprit = r->culprit, peer = r->peer;
  const auto launch = static_cast<unsigned long long>(r->launch);
  char what[320];
  switch (kind & ~kToldByPeer) {
    case kTimeout:
      std::snprintf(what, sizeof(what),
                    "rank %d timed out after %.1f s waiting for rank %d (rank %d never reached "
                    "this call: it may have crashed, skipped the call, or be stuck)",
                    culprit, timeout_s, peer, peer);
      break;
    case kMismatch:
      std::snprintf(what, sizeof(what),
                    "rank %d and rank %d made different calls (shapes, dtypes, op or algorithm "
                    "differ; every rank must make the same calls)",
                    culprit, peer);
      break;
    case kConcurrent:
      std::snprintf(what, sizeof(what),
                    "two jax_ar calls of this communicator ran at the same time on rank %d "
                    "(jax_ar needs its calls on one device to run one after another; was "
                    "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT set?)",
                    culprit);
      break;
    default:
      std::snprintf(what, sizeof(what), "rank %d failed with code %u", culprit, kind);
  }
  char text[640];
  if (kind & kToldByPeer) {
    std::snprintf(text, sizeof(text),
                  "rank %d of %s stopped in jax_ar launch %llu because %s. The communicator is "
                  "unusable until close() and a new setup().",
                  me, label.c_str(), launch, what);
  } else {
    std::snprintf(text, sizeof(text),
                  "rank %d of %s failed in jax_ar launch %llu: %s. The communicator is unusable "
                  "until close() and a new setup().",
                  me, label.c_str(), launch, what);
  }
  return text;
}

void RankState::SetHostFailure(const std::string& text) {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  if (host_failure_.empty()) host_failure_ = text;
}

namespace {
std::mutex slots_mutex;
std::map<int, std::bitset<kMaxLiveSlots>> used_slots;
}  // namespace

int AcquireSlot(int device) {
  std::lock_guard<std::mutex> lock(slots_mutex);
  auto& used = used_slots[device];
  for (int i = 0; i < kMaxLiveSlots; ++i) {
    if (!used[i]) {
      used[i] = true;
      return i;
    }
  }
  return -1;
}

void ReleaseSlot(int device, int slot) {
  std::lock_guard<std::mutex> lock(slots_mutex);
  if (slot >= 0) used_slots[device][slot] = false;
}

}  // namespace jax_ar::gpu
