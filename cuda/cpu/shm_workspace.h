// Workspaces of the CPU backend: POSIX shared-memory segments that every
// process of a group maps. The creator unlinks the name once all peers have
// mapped it (Communicator setup does this after a barrier), so nothing is
// left in /dev/shm even when a process dies without cleaning up. A process
// killed inside that short window leaves its name behind; names carry the
// creator's identity, and every Create() removes those of exited creators.
#pragma once

#include <cstddef>
#include <string>

namespace jax_ar::cpu {

class SharedMemory {
 public:
  // Creates and maps a new zero-filled segment under a fresh unique name.
  static SharedMemory Create(size_t bytes);
  // Maps an existing segment created by another process.
  static SharedMemory Open(const std::string& name, size_t bytes);

  SharedMemory() = default;
  SharedMemory(SharedMemory&& other) noexcept { *this = std::move(other); }
  SharedMemory& operator=(SharedMemory&& other) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory();

  // Removes the name (the mapping stays valid); a no-op after the first call
  // and for segments this process did not create.
  void Unlink();

  void* address() const { return address_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  void* address_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  bool owns_name_ = false;
};

}  // namespace jax_ar::cpu
