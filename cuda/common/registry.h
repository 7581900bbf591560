// The table that FFI handlers consult: (communicator id, device ordinal) ->
// the state of that device's rank. Python fills it at setup and empties it at
// close; a handler holds a shared_ptr for the length of its call, so close()
// never frees memory under a running call.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace jax_ar {

template <typename State>
class Registry {
 public:
  static Registry& Instance() {
    static Registry* registry = new Registry();  // never destroyed: handlers may run at exit
    return *registry;
  }

  void Add(uint64_t comm_id, int device_ordinal, std::shared_ptr<State> state) {
    std::lock_guard<std::mutex> lock(mutex_);
    states_[{comm_id, device_ordinal}] = std::move(state);
  }

  std::shared_ptr<State> Find(uint64_t comm_id, int device_ordinal) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = states_.find({comm_id, device_ordinal});
    return it == states_.end() ? nullptr : it->second;
  }

  // Removes every rank of the communicator held in this process.
  std::vector<std::shared_ptr<State>> Remove(uint64_t comm_id) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::shared_ptr<State>> removed;
    for (auto it = states_.begin(); it != states_.end();) {
      if (it->first.first == comm_id) {
        removed.push_back(std::move(it->second));
        it = states_.erase(it);
      } else {
        ++it;
      }
    }
    return removed;
  }

  size_t Size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return states_.size();
  }

 private:
  Registry() = default;
  mutable std::mutex mutex_;
  std::map<std::pair<uint64_t, int>, std::shared_ptr<State>> states_;
};

}  // namespace jax_ar
