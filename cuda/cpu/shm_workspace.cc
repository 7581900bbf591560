#include "cpu/shm_workspace.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <stdexcept>
#include <utility>

#include "cpu/process_liveness.h"

namespace jax_ar::cpu {
namespace {

constexpr char kPrefix[] = "jax_ar_";

// jax_ar_<pid namespace>_<pid>_<start ticks>_<salt>_<n>: the creator's
// identity is in the name, so a later process can tell a segment left by a
// creator that died during setup (before it unlinked the name).
std::string UniqueName() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  const ProcessIdentity self = SelfIdentity();
  return "/" + std::string(kPrefix) + std::to_string(self.pid_namespace) + "_" +
         std::to_string(self.pid) + "_" + std::to_string(self.start_ticks) + "_" +
         std::to_string(salt % 1000000007u) + "_" + std::to_string(counter.fetch_add(1));
}

// Unlinks segments whose creator has exited (killed between creating a
// segment and unlinking it once its peers had mapped it). Only names of this
// pid namespace are judged; anything unreadable is left alone.
void RemoveSegmentsOfExitedCreators() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  while (const dirent* entry = readdir(dir)) {
    unsigned long long ns = 0, pid = 0, ticks = 0;
    const char* fields = entry->d_name + sizeof(kPrefix) - 1;
    if (std::strncmp(entry->d_name, kPrefix, sizeof(kPrefix) - 1) != 0 ||
        std::sscanf(fields, "%llu_%llu_%llu_", &ns, &pid, &ticks) != 3) {
      continue;
    }
    if (HasExited(ProcessIdentity{static_cast<uint32_t>(pid), ns, ticks})) {
      shm_unlink(("/" + std::string(entry->d_name)).c_str());
    }
  }
  closedir(dir);
}

std::runtime_error SystemError(const std::string& what, const std::string& name) {
  return std::runtime_error("jax_ar: " + what + " of shared-memory segment " + name +
                            " failed: " + std::strerror(errno));
}

void* MapSegment(int fd, size_t bytes, const std::string& name) {
  void* address = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (address == MAP_FAILED) {
    auto error = SystemError("mmap", name);
    close(fd);
    throw error;
  }
  close(fd);
  return address;
}

}  // namespace

SharedMemory SharedMemory::Create(size_t bytes) {
  RemoveSegmentsOfExitedCreators();
  SharedMemory shm;
  shm.name_ = UniqueName();
  shm.bytes_ = bytes;
  int fd = shm_open(shm.name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw SystemError("shm_open", shm.name_);
  shm.owns_name_ = true;
  // Reserve the pages now: a sparse segment on a full /dev/shm would fail
  // later with SIGBUS inside a call instead of here with a clear error.
  if (int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    close(fd);
    shm_unlink(shm.name_.c_str());
    shm.owns_name_ = false;
    errno = err;
    throw SystemError("allocating " + std::to_string(bytes) + " bytes (is /dev/shm full?)",
                      shm.name_);
  }
  shm.address_ = MapSegment(fd, bytes, shm.name_);
  return shm;
}

SharedMemory SharedMemory::Open(const std::string& name, size_t bytes) {
  SharedMemory shm;
  shm.name_ = name;
  shm.bytes_ = bytes;
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw SystemError("shm_open", name);
  struct stat info;
  if (fstat(fd, &info) != 0 || static_cast<size_t>(info.st_size) < bytes) {
    close(fd);
    throw std::runtime_error("jax_ar: shared-memory segment " + name + " is smaller than the " +
                             std::to_string(bytes) + "-byte workspace its creator announced");
  }
  shm.address_ = MapSegment(fd, bytes, name);
  return shm;
}

SharedMemory& SharedMemory::operator=(SharedMemory&& other) noexcept {
  if (this != &other) {
    this->~SharedMemory();
    address_ = std::exchange(other.address_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    name_ = std::move(other.name_);
    owns_name_ = std::exchange(other.owns_name_, false);
  }
  return *this;
}

SharedMemory::~SharedMemory() {
  Unlink();
  if (address_ != nullptr) munmap(address_, bytes_);
  address_ = nullptr;
}

void SharedMemory::Unlink() {
  if (owns_name_) shm_unlink(name_.c_str());
  owns_name_ = false;
}

}  // namespace jax_ar::cpu
