// Whether another process on this host is still running, for the ranks that
// wait on it: a dead peer is reported at once instead of at the deadline.
#pragma once

#include <cstdint>

namespace jax_ar::cpu {

struct ProcessIdentity {
  uint32_t pid = 0;
  uint64_t pid_namespace = 0;  // 0: unknown (no /proc)
  uint64_t start_ticks = 0;    // 0: unknown
};

// This process.
ProcessIdentity SelfIdentity();

// True only when `process` has certainly ended (gone, a zombie, or its pid
// now names a process that started later). Processes of another pid
// namespace, or unknown identities, count as running.
bool HasExited(const ProcessIdentity& process);

}  // namespace jax_ar::cpu
