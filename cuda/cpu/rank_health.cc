#include "cpu/rank_health.h"

#include <sched.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "cpu/process_liveness.h"

namespace jax_ar::cpu {
namespace {

using Clock = std::chrono::steady_clock;

// Spins briefly, then yields, then sleeps: CI runs eight ranks on two cores,
// where a rank that keeps its core would starve the peer it waits for.
class Backoff {
 public:
  void Pause() {
    ++count_;
    if (count_ < 64) return;
    if (count_ < 256) {
      sched_yield();
      return;
    }
    timespec nap{0, 50'000};
    nanosleep(&nap, nullptr);
  }

 private:
  int count_ = 0;
};

// How often a waiting rank looks at its peers' health (and whether the
// process it waits for still exists): cheap, and fast next to any deadline.
constexpr auto kPeerCheckInterval = std::chrono::milliseconds(10);

RankStatus& StatusOf(const RankState& state, int rank) { return state.control(rank).status; }

ProcessIdentity OwnerOf(const RankState& state, int rank) {
  const RankStatus& status = StatusOf(state, rank);
  return {status.owner_pid, status.owner_pid_namespace, status.owner_start_ticks};
}

// A peer whose process ended without closing: killed (by a signal, or a
// crash), not a program that ended normally.
bool DiedActive(const RankState& state, int peer) {
  return HealthOf(state, peer) == RankHealth::kActive && HasExited(OwnerOf(state, peer));
}

// Why `sender`, whose data this rank still waits for, will never send it
// (a failure's core): any rank has failed, or the sender has closed or its
// process is gone; "" while it may still come.
std::string WhySenderWontCome(const RankState& state, const CallSite& site, int sender) {
  if (PeerFailure failed = FailedPeer(state); failed.peer >= 0) {
    return PeerFailedText(site, failed.peer, failed.core);
  }
  if (HealthOf(state, sender) == RankHealth::kClosed) return PeerClosedText(site, sender);
  const ProcessIdentity owner = OwnerOf(state, sender);
  if (HasExited(owner)) return PeerExitedText(site, sender, owner.pid);
  return "";
}

}  // namespace

RankHealth HealthOf(const RankState& state, int rank) {
  return static_cast<RankHealth>(LoadAcquire(StatusOf(state, rank).health));
}

// The text goes before the health word, which is stored with release order.
void RecordFailure(RankState& state, uint64_t epoch, const std::string& core) {
  std::lock_guard<std::mutex> lock(state.failure_mutex);
  if (!state.failure.empty()) return;
  state.failure = core;
  RankStatus& status = StatusOf(state, state.rank);
  std::snprintf(status.failure, sizeof(status.failure), "%s", core.c_str());
  status.failed_epoch = epoch;
  StoreRelease(status.health, static_cast<uint32_t>(RankHealth::kFailed));
}

ffi::Error FailCall(RankState& state, uint64_t epoch, ffi::ErrorCode code,
                    const std::string& core) {
  RecordFailure(state, epoch, core);
  return ffi::Error(code, "jax_ar: " + Unusable(core));
}

PeerFailure FailedPeer(const RankState& state, uint64_t up_to_epoch) {
  for (int peer = 0; peer < state.world; ++peer) {
    if (peer == state.rank || HealthOf(state, peer) != RankHealth::kFailed) continue;
    const RankStatus& status = StatusOf(state, peer);
    if (status.failed_epoch > up_to_epoch) continue;
    return {peer, std::string(status.failure, strnlen(status.failure, sizeof(status.failure)))};
  }
  return {};
}

ffi::Error WaitForFlag(RankState& state, const uint64_t& flag, uint64_t epoch, int sender,
                       const std::string& call) {
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(state.timeout_s));
  auto next_check = start + kPeerCheckInterval;
  Backoff backoff;
  auto site = [&] { return CallSite{call, state.label, state.rank, epoch}; };
  // A sender may deliver and then close, fail or exit between this rank's
  // look at the flag and its look at the sender: what ends the wait is read
  // first, the flag again after it (the sender's health is stored after its
  // flag, with release order), so data that came is never taken for data
  // that never will.
  auto arrived = [&] { return LoadAcquire(flag) >= epoch; };
  while (!arrived()) {
    const auto now = Clock::now();
    if (now >= next_check) {
      next_check = now + kPeerCheckInterval;
      if (std::string why = WhySenderWontCome(state, site(), sender); !why.empty()) {
        if (arrived()) break;
        return FailCall(state, epoch, ffi::ErrorCode::kAborted, why);
      }
    }
    if (now > deadline) {
      if (arrived()) break;
      return FailCall(state, epoch, ffi::ErrorCode::kDeadlineExceeded,
                      TimeoutText(site(), state.timeout_s, sender));
    }
    backoff.Pause();
  }
  return ffi::Error::Success();
}

void InitControlBlock(std::byte* workspace) {
  RankStatus& status = reinterpret_cast<ControlBlock*>(workspace)->status;
  const ProcessIdentity self = SelfIdentity();
  status.owner_pid = self.pid;
  status.owner_pid_namespace = self.pid_namespace;
  status.owner_start_ticks = self.start_ticks;
}

std::string CommunicatorFailure(RankState& state) {
  if (std::string own = state.Failure(); !own.empty()) return own;
  const PeerFailure failed = FailedPeer(state);
  return failed.peer < 0 ? ""
                         : PeerFailedEarlierText(state.rank, state.label, failed.peer, failed.core);
}

void MarkClosed(RankState& state) {
  std::lock_guard<std::mutex> lock(state.call_mutex);
  uint32_t& health = StatusOf(state, state.rank).health;
  if (LoadAcquire(health) == static_cast<uint32_t>(RankHealth::kActive)) {
    StoreRelease(health, static_cast<uint32_t>(RankHealth::kClosed));
  }
}

std::vector<std::string> CallsNeverMade(RankState& state, double linger_s) {
  std::vector<std::string> diverged;
  if (!state.Failure().empty()) return diverged;  // the failure says what went wrong
  // A peer still active may yet start a call this rank will never make
  // (its call then fails at once: this rank is closed); wait a while to see.
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(linger_s));
  auto all_peers_done = [&] {
    for (int peer = 0; peer < state.world; ++peer) {
      if (peer != state.rank && HealthOf(state, peer) == RankHealth::kActive &&
          !HasExited(OwnerOf(state, peer))) {
        return false;
      }
    }
    return true;
  };
  while (linger_s > 0 && !all_peers_done() && Clock::now() < until) {
    timespec nap{0, 1'000'000};
    nanosleep(&nap, nullptr);
  }
  const uint64_t mine = state.control(state.rank).epoch;
  for (int peer = 0; peer < state.world; ++peer) {
    if (peer == state.rank || DiedActive(state, peer)) continue;
    const uint64_t theirs = LoadAcquire(state.control(peer).epoch);
    if (theirs <= mine) continue;
    diverged.push_back(ClosedBeforePeerText(state.rank, state.label, mine, peer, theirs));
  }
  return diverged;
}

}  // namespace jax_ar::cpu
