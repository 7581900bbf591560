// Who a registered rank is: what both backends' rank states start from,
// filled once by register_rank and never changed while the rank lives.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/protocol.h"

namespace jax_ar {

struct RankIdentity {
  uint64_t comm_id = 0;
  int device_ordinal = 0;
  int rank = 0;
  int world = 0;
  size_t workspace_bytes = 0;
  double timeout_s = 0;
  std::string label;  // "axis 'tp'", for messages
  std::array<std::byte*, kMaxRanks> workspaces{};  // indexed by rank, as this device addresses them
};

// register_rank's arguments as an identity. Throws std::invalid_argument
// (nanobind raises ValueError): this runs at setup from Python, never in a
// handler.
inline RankIdentity RegisteredIdentity(uint64_t comm_id, int device_ordinal, int rank, int world,
                                       const std::vector<uintptr_t>& workspaces,
                                       size_t workspace_bytes, double timeout_s,
                                       const std::string& label) {
  if (world < 1 || world > kMaxRanks || rank < 0 || rank >= world ||
      static_cast<int>(workspaces.size()) != world) {
    throw std::invalid_argument("jax_ar: bad rank layout for register_rank");
  }
  if (workspace_bytes <= kControlBytes) {
    throw std::invalid_argument("jax_ar: workspace smaller than its control block");
  }
  RankIdentity identity;
  identity.comm_id = comm_id;
  identity.device_ordinal = device_ordinal;
  identity.rank = rank;
  identity.world = world;
  identity.workspace_bytes = workspace_bytes;
  identity.timeout_s = timeout_s;
  identity.label = label;
  for (int r = 0; r < world; ++r) identity.workspaces[r] = reinterpret_cast<std::byte*>(workspaces[r]);
  return identity;
}

}  // namespace jax_ar
