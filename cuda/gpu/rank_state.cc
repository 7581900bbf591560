#include "gpu/rank_state.h"

#include <bitset>
#include <map>
#include <string>

#include "common/failure_text.h"

namespace jax_ar::gpu {

RankState::~RankState() {
  // Kernels never touch the record once the slot's token is gone (close()
  // clears it before the rank state can be dropped).
  if (record != nullptr) cudaFreeHost(record);
}

namespace {

// The core of the failure `kind` (without kToldByPeer) that `site`'s rank
// found, blaming `peer` (whose operation `peer_operation` a mismatch knows).
std::string KindText(uint32_t kind, const CallSite& site, Operation operation, int peer,
                     Operation peer_operation, double timeout_s) {
  switch (kind) {
    case kTimeout: return TimeoutText(site, timeout_s, peer);
    case kMismatch: return MismatchText(site, peer, OtherCallText(operation, peer_operation));
    case kConcurrent: return ConcurrentText(site);
  }
  return "rank " + std::to_string(site.rank) + " of " + site.label + " failed in " + site.call +
         " with code " + std::to_string(kind);
}

}  // namespace

std::string RankState::Failure() const {
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (!host_failure_.empty()) return host_failure_;
  }
  if (record == nullptr) return "";
  const volatile FailureRecord* r = record;
  const uint32_t kind = r->kind;  // written last by the kernel
  if (kind == kHealthy) return "";
  const auto operation = static_cast<Operation>(r->operation);
  const auto culprit_operation = static_cast<Operation>(r->culprit_operation);
  const auto peer_operation = static_cast<Operation>(r->peer_operation);
  const int culprit = r->culprit, peer = r->peer;
  const CallSite site{OperationName(operation), label, r->rank, r->launch};
  if ((kind & kToldByPeer) == 0) {
    return KindText(kind, site, operation, peer, peer_operation, timeout_s);
  }
  // The culprit's launch number is not in the abort code; its operation is.
  const CallSite culprit_site{OperationName(culprit_operation), label, culprit, 0};
  return PeerFailedText(site, culprit,
                        KindText(kind & ~kToldByPeer, culprit_site, culprit_operation, peer,
                                 peer_operation, timeout_s));
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
