// One rank of a communicator on a CPU device: where its peers' workspaces are
// mapped in this process, and what the workspace control block holds.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/protocol.h"
#include "common/rank_identity.h"
#include "cpu/shm_workspace.h"

namespace jax_ar::cpu {

// What a sender says about the call its data belongs to; receivers compare it
// with their own call so that ranks that disagree get an error, not a result.
struct CallHeader {
  uint64_t epoch;
  uint64_t signature;     // hash of algorithm, op, world size, dtypes and sizes
  uint64_t packed_bytes;  // the whole message, all rounds
  uint32_t round;
  uint32_t rounds;
  char description[104];  // human-readable form of the signature, for errors
};

// In the receiver's workspace, one per sender. flags[phase] holds the last
// epoch whose data for that phase has fully landed (stored with release
// order after the data); headers are kept per epoch parity because a fast
// sender may already be one call ahead while the receiver reads this one.
struct alignas(64) Mailbox {
  uint64_t flags[2];
  CallHeader headers[2];
};

// What a rank tells its peers about itself, in its own control block: which
// process owns the workspace (so a waiting peer can tell a dead process from
// a slow one) and whether the rank has failed or closed (so peers waiting for
// it stop at once instead of at their deadline).
enum class RankHealth : uint32_t { kActive = 0, kFailed = 1, kClosed = 2 };

struct RankStatus {
  uint32_t health;               // RankHealth; stored with release order after the rest
  uint32_t owner_pid;
  uint64_t owner_pid_namespace;  // pids compare only within one pid namespace
  uint64_t owner_start_ticks;    // start time of the owner, tells a reused pid apart
  uint64_t failed_epoch;         // the call in which the rank failed
  char failure[1024];            // the rank's own failure message
};

struct ControlBlock {
  uint64_t epoch;  // calls this rank has started; written only by the owner
  RankStatus status;
  Mailbox mailboxes[kMaxRanks];
};
static_assert(sizeof(ControlBlock) <= kControlBytes, "control block outgrew its region");

// Everything a communicator mapped or created in this process, released when
// the last rank state referring to it goes away.
struct CommResources {
  std::vector<SharedMemory> segments;
  std::mutex mutex;
};

struct RankState : RankIdentity {
  static constexpr const char* kDeviceKind = "CPU";

  std::shared_ptr<CommResources> resources;

  // A device runs one call of a communicator at a time.
  std::mutex call_mutex;

  // Set by the first failed call (the core of its message, failure_text.h);
  // every later call fails at once with it.
  std::mutex failure_mutex;
  std::string failure;

  ControlBlock& control(int r) const { return *reinterpret_cast<ControlBlock*>(workspaces[r]); }
  size_t half_bytes() const { return AlignDown((workspace_bytes - kControlBytes) / 2); }
  std::byte* data_half(int r, uint64_t epoch) const {
    return workspaces[r] + kControlBytes + (epoch & 1) * half_bytes();
  }

  std::string Failure() {
    std::lock_guard<std::mutex> lock(failure_mutex);
    return failure;
  }
  void SetFailure(const std::string& message) {
    std::lock_guard<std::mutex> lock(failure_mutex);
    if (failure.empty()) failure = message;
  }
};

}  // namespace jax_ar::cpu
