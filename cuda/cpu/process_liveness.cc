#include "cpu/process_liveness.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace jax_ar::cpu {
namespace {

uint64_t PidNamespace() {
  struct stat info;
  if (stat("/proc/self/ns/pid", &info) != 0) return 0;
  return static_cast<uint64_t>(info.st_ino);
}

// State letter and start time (field 22) from /proc/<pid>/stat; false if the
// file cannot be read (no such process, or no /proc).
bool ReadStat(uint32_t pid, char& state, uint64_t& start_ticks) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%u/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char text[1024];
  const size_t n = std::fread(text, 1, sizeof(text) - 1, f);
  std::fclose(f);
  text[n] = '\0';
  // The command name (field 2) may hold spaces and parentheses: fields
  // after it start at the last ')'.
  const char* p = std::strrchr(text, ')');
  if (p == nullptr) return false;
  unsigned long long ticks = 0;
  // After ") ": state, then fields 4..21 to skip, then starttime (field 22).
  if (std::sscanf(p + 2, "%c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s "
                         "%*s %*s %llu",
                  &state, &ticks) != 2) {
    return false;
  }
  start_ticks = ticks;
  return true;
}

}  // namespace

ProcessIdentity SelfIdentity() {
  ProcessIdentity self;
  self.pid = static_cast<uint32_t>(getpid());
  self.pid_namespace = PidNamespace();
  char state = 0;
  uint64_t ticks = 0;
  if (self.pid_namespace != 0 && ReadStat(self.pid, state, ticks)) self.start_ticks = ticks;
  return self;
}

bool HasExited(const ProcessIdentity& process) {
  if (process.pid == 0 || process.pid_namespace == 0 || process.start_ticks == 0) return false;
  static const uint64_t own_namespace = PidNamespace();
  if (process.pid_namespace != own_namespace) return false;
  char state = 0;
  uint64_t ticks = 0;
  if (!ReadStat(process.pid, state, ticks)) {
    // No stat file: gone, unless /proc cannot tell (then ask the kernel).
    return kill(static_cast<pid_t>(process.pid), 0) != 0 && errno == ESRCH;
  }
  return state == 'Z' || state == 'X' || ticks != process.start_ticks;
}

}  // namespace jax_ar::cpu
