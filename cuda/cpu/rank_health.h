// What a rank tells its peers about itself, and how a rank waiting for a
// peer judges it. Each rank publishes, in its own control block, the
// identity of its process and its health: active, failed (with the core of
// its failure, failure_text.h), or closed. A rank waiting for a peer's data
// stops at once when any rank has failed, when the peer has closed, or when
// the peer's process has exited, and otherwise at its deadline. Moving and
// reducing the data is exchange.h's.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/failure_text.h"
#include "common/ffi_util.h"
#include "cpu/rank_state.h"

namespace jax_ar::cpu {

// Words in a workspace are written by one process and read by others.
template <typename T>
T LoadAcquire(const T& word) {
  return std::atomic_ref<T>(const_cast<T&>(word)).load(std::memory_order_acquire);
}
template <typename T>
void StoreRelease(T& word, T value) {
  std::atomic_ref<T>(word).store(value, std::memory_order_release);
}

RankHealth HealthOf(const RankState& state, int rank);

// Records this rank's first failure (the core of its message) and publishes
// it to the peers.
void RecordFailure(RankState& state, uint64_t epoch, const std::string& core);

// RecordFailure, then the call's error ("jax_ar: " + the full text).
ffi::Error FailCall(RankState& state, uint64_t epoch, ffi::ErrorCode code,
                    const std::string& core);

// The first peer that has failed in a call up to `up_to_epoch`, with the
// core of its failure; peer -1 when none has.
struct PeerFailure {
  int peer = -1;
  std::string core;
};
PeerFailure FailedPeer(const RankState& state, uint64_t up_to_epoch = UINT64_MAX);

// Waits until `flag` (written by `sender`) reaches `epoch`, the call `call`
// describes. Fails the call when the sender will not come (any rank failed,
// the sender closed, its process exited) or at the deadline.
ffi::Error WaitForFlag(RankState& state, const uint64_t& flag, uint64_t epoch, int sender,
                       const std::string& call);

// Fills the status of a workspace this process has just created (zeroed):
// the identity of the owning process, which peers use to tell a dead rank.
void InitControlBlock(std::byte* workspace);

// The core of this rank's failure, else of the first failure a peer has
// published (failure_text.h); "" while every rank is healthy.
std::string CommunicatorFailure(RankState& state);

// Waits for a call running on this rank to end, then marks the rank closed
// so that peers waiting for it stop at once.
void MarkClosed(RankState& state);

// After MarkClosed (of every rank of this process): waits up to `linger_s`
// for every peer to close, fail or exit, then returns one message for each
// live peer that started a call this rank never made (the ranks made
// different calls; that call of the peer fails). A peer whose process ended
// without closing (killed, by a signal or a crash) is not counted: the call
// it had started is the one it died in, not one its program added.
// Lingering makes the report certain at process exit, where every rank ends
// up waiting for its peers anyway.
std::vector<std::string> CallsNeverMade(RankState& state, double linger_s);

}  // namespace jax_ar::cpu
