// What a communicator holds in this process (mapped workspaces, ...) while
// setup creates it and before its ranks are registered; the rank states then
// share ownership, and close() takes the entry out.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace jax_ar {

template <typename Resources>
class CommResourceTable {
 public:
  static CommResourceTable& Instance() {
    static CommResourceTable* table = new CommResourceTable();  // never destroyed, like Registry
    return *table;
  }

  // The communicator's resources, created empty on first use.
  std::shared_ptr<Resources> Of(uint64_t comm_id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& entry = by_comm_[comm_id];
    if (!entry) entry = std::make_shared<Resources>();
    return entry;
  }

  // Removes the communicator's entry; returns it, or nullptr if it had none.
  std::shared_ptr<Resources> Take(uint64_t comm_id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = by_comm_.find(comm_id);
    if (it == by_comm_.end()) return nullptr;
    std::shared_ptr<Resources> taken = std::move(it->second);
    by_comm_.erase(it);
    return taken;
  }

 private:
  CommResourceTable() = default;
  std::mutex mutex_;
  std::map<uint64_t, std::shared_ptr<Resources>> by_comm_;
};

}  // namespace jax_ar
