// The words of every failure a communicator reports, for both backends: the
// same failure gives the same sentence, with the same fields, on CPU and GPU.
//
// Fields: the call (its operation, the public function, first; then what
// the backend knows of it: the CPU has "all_reduce sum oneshot of
// float32[4]", the GPU the operation alone), the axis label ("axis 'tp'"),
// the rank, the peer, and the call number N ("call N"): this rank's count of
// protocol rounds on the communicator, from 1. One call is one round unless
// it is larger than one round of the workspace (then it counts once per
// round); both backends count alike, but their workspaces divide
// differently, so a large call can count differently on CPU and GPU.
//
// Each function returns the core of a message: no "jax_ar: " prefix and no
// advice, so that a peer's failure can be quoted inside another rank's.
// Unusable() adds what to do; ffi::Error and Python add the prefix.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "common/protocol.h"

namespace jax_ar {

// Where a failure happened.
struct CallSite {
  std::string call;   // starts with the operation's name
  std::string label;  // "axis 'tp'"
  int rank = 0;
  uint64_t number = 0;  // the call number; 0 where unknown
};

namespace failure_text_detail {

inline std::string Rank(int rank) { return "rank " + std::to_string(rank); }
inline std::string RankStartingSentence(int rank) { return "Rank " + std::to_string(rank); }

inline std::string Who(const CallSite& site) { return Rank(site.rank) + " of " + site.label; }

// "all_reduce sum oneshot of float32[4] (call 3)"
inline std::string Call(const CallSite& site) {
  return site.number == 0 ? site.call
                          : site.call + " (call " + std::to_string(site.number) + ")";
}

inline std::string Seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", s);
  return text;
}

}  // namespace failure_text_detail

/// A failure's full text: its core and what to do about it.
inline std::string Unusable(const std::string& core) {
  return core + ". The communicator is unusable until close() and a new setup().";
}

/// The rank waited for `peer` past its deadline.
inline std::string TimeoutText(const CallSite& site, double timeout_s, int peer) {
  using namespace failure_text_detail;
  return Who(site) + " timed out after " + Seconds(timeout_s) + " s waiting for " + Rank(peer) +
         " in " + Call(site) + ". " + RankStartingSentence(peer) +
         " never reached this call: it may have crashed, skipped the call, be stuck, or be "
         "slower than the deadline (JAX_AR_TIMEOUT_S, or timeout_s of jax_ar.setup)";
}

/// `peer`'s call differs from this rank's (`peer_call` says how, as far as
/// the backend knows).
inline std::string MismatchText(const CallSite& site, int peer, const std::string& peer_call) {
  using namespace failure_text_detail;
  const std::string which = site.number == 0 ? "a call" : "call " + std::to_string(site.number);
  return "ranks disagree on " + which + " of " + site.label + ": " + Rank(site.rank) + " made " +
         site.call + ", " + Rank(peer) + " made " + peer_call +
         ". Every rank must make the same calls with the same shapes, dtypes, op and algorithm";
}

/// What a backend that knows only operations says of a peer's differing
/// call: its operation, or "a different <operation>" when it is this rank's.
inline std::string OtherCallText(Operation mine, Operation theirs) {
  if (theirs == Operation::kUnknown) return "a different call";
  if (theirs == mine) return std::string("a different ") + OperationName(theirs);
  return OperationName(theirs);
}

/// `peer` failed (`peer_core`: its own failure) before this rank's call
/// could complete.
inline std::string PeerFailedText(const CallSite& site, int peer, const std::string& peer_core) {
  using namespace failure_text_detail;
  return Who(site) + " stopped in " + Call(site) + " because " + Rank(peer) +
         " failed: " + peer_core;
}

/// `peer` closed the communicator while this rank waited for its part.
inline std::string PeerClosedText(const CallSite& site, int peer) {
  using namespace failure_text_detail;
  return Who(site) + " stopped in " + Call(site) + " because " + Rank(peer) +
         " closed the communicator (close() or the end of its process) without making this call";
}

/// The process of `peer` ended while this rank waited for its part.
inline std::string PeerExitedText(const CallSite& site, int peer, uint32_t pid) {
  using namespace failure_text_detail;
  return Who(site) + " stopped in " + Call(site) + " because the process of " + Rank(peer) +
         " (pid " + std::to_string(pid) + ") has exited without making this call";
}

/// Two calls of the communicator ran at once on this rank's device.
inline std::string ConcurrentText(const CallSite& site) {
  using namespace failure_text_detail;
  return Who(site) + " ran two jax_ar calls of the communicator at the same time, in " +
         Call(site) +
         ": jax_ar needs its calls on one device to run one after another (was "
         "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT set?)";
}

/// A call on a communicator whose rank failed earlier (`earlier_core`).
inline std::string FailedEarlierText(Operation operation, int rank, const std::string& label,
                                     const std::string& earlier_core) {
  using namespace failure_text_detail;
  return Rank(rank) + " of " + label + " cannot run " + OperationName(operation) +
         ": this communicator failed earlier: " + earlier_core;
}

/// A rank that is healthy itself, but whose peer failed (comm.check()).
inline std::string PeerFailedEarlierText(int rank, const std::string& label, int peer,
                                         const std::string& peer_core) {
  using namespace failure_text_detail;
  return Rank(rank) + " of " + label + " is unusable because " + Rank(peer) +
         " failed: " + peer_core;
}

/// The rank could not start its kernel (a CUDA launch error).
inline std::string LaunchFailedText(Operation operation, int rank, const std::string& label,
                                    const std::string& error) {
  using namespace failure_text_detail;
  return Rank(rank) + " of " + label + " could not launch the " + OperationName(operation) +
         " kernel: " + error;
}

/// A call on a rank that was closed meanwhile (complete, with its advice).
inline std::string ClosedText(const CallSite& site) {
  using namespace failure_text_detail;
  return Who(site) + " cannot run " + site.call +
         ": the communicator was closed. Set it up again with jax_ar.setup() to use it";
}

/// No rank state for (communicator, device) (complete, with its advice).
inline std::string NotFoundText(Operation operation, uint64_t comm_id, const char* device_kind,
                                int device_ordinal) {
  return "no communicator " + std::to_string(comm_id) + " on " + device_kind + " device " +
         std::to_string(device_ordinal) + " for " + OperationName(operation) +
         ": it was closed, or this device is not in the mesh given to jax_ar.setup()";
}

/// At close: `peer` started a call this rank never made (or made only
/// after the peer had failed in it, at its deadline).
inline std::string ClosedBeforePeerText(int rank, const std::string& label, uint64_t calls,
                                        int peer, uint64_t peer_call) {
  using namespace failure_text_detail;
  return Rank(rank) + " of " + label + " closed after " + std::to_string(calls) + " calls, but " +
         Rank(peer) + " started call " + std::to_string(peer_call) +
         ": this rank skipped that call or came to it after " + Rank(peer) +
         " had given up on it, or " + Rank(peer) + " made an extra one; that call of " +
         Rank(peer) + " failed";
}

}  // namespace jax_ar
