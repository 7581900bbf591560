// Python module of the CPU backend: FFI registrations, the codes and limits
// Python reads, plus the calls that jax_ar/comm/cpu_backend.py makes at setup
// and close.
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "common/comm_resources.h"
#include "common/failure_text.h"
#include "common/fused_row_fit.h"
#include "common/module_util.h"
#include "common/rank_identity.h"
#include "common/registry.h"
#include "cpu/all_reduce.h"
#include "cpu/call_order.h"
#include "cpu/exchange.h"
#include "cpu/process_liveness.h"
#include "cpu/rank_state.h"
#include "cpu/rms_norm.h"
#include "cpu/reduce_scatter_all_gather.h"

namespace nb = nanobind;

namespace jax_ar::cpu {
namespace {

std::shared_ptr<CommResources> ResourcesOf(uint64_t comm_id) {
  return CommResourceTable<CommResources>::Instance().Of(comm_id);
}

uintptr_t Keep(uint64_t comm_id, SharedMemory shm) {
  auto resources = ResourcesOf(comm_id);
  std::lock_guard<std::mutex> lock(resources->mutex);
  const auto address = reinterpret_cast<uintptr_t>(shm.address());
  resources->segments.push_back(std::move(shm));
  return address;
}

}  // namespace

NB_MODULE(_jax_ar_cpu, m) {
  m.doc() = "jax_ar CPU backend";

  m.def("registrations", []() {
    nb::dict targets = Registrations({kAllReduce, kReduceScatter, kAllGather, kRmsNorm,
                                      kAddRmsNorm, kAllReduceRmsNorm});
    // XLA:CPU only: keeps jax_ar's calls in program order (call_order.cc).
    targets["jax_ar_order"] = EncapsulateHandler(kCallOrder);
    return targets;
  });

  m.def("create_workspace",
        [](uint64_t comm_id, size_t bytes) {
          SharedMemory shm = SharedMemory::Create(bytes);
          InitControlBlock(static_cast<std::byte*>(shm.address()));
          std::string name = shm.name();
          return std::make_tuple(name, Keep(comm_id, std::move(shm)));
        },
        nb::arg("comm_id"), nb::arg("bytes"),
        "Creates a zero-filled shared-memory workspace; returns (name, address).");

  m.def("open_workspace",
        [](uint64_t comm_id, const std::string& name, size_t bytes) {
          return Keep(comm_id, SharedMemory::Open(name, bytes));
        },
        nb::arg("comm_id"), nb::arg("name"), nb::arg("bytes"),
        "Maps a peer's workspace; returns its address in this process.");

  m.def("unlink_workspaces",
        [](uint64_t comm_id) {
          auto resources = ResourcesOf(comm_id);
          std::lock_guard<std::mutex> lock(resources->mutex);
          for (SharedMemory& shm : resources->segments) shm.Unlink();
        },
        nb::arg("comm_id"),
        "Removes the names of the segments this process created (mappings stay).");

  m.def("register_rank",
        [](uint64_t comm_id, int device_ordinal, int rank, int world,
           const std::vector<uintptr_t>& workspaces, size_t workspace_bytes, double timeout_s,
           const std::string& label) {
          auto state = std::make_shared<RankState>();
          static_cast<RankIdentity&>(*state) =
              RegisteredIdentity(comm_id, device_ordinal, rank, world, workspaces,
                                 workspace_bytes, timeout_s, label);
          state->resources = ResourcesOf(comm_id);
          Registry<RankState>::Instance().Add(comm_id, device_ordinal, std::move(state));
        },
        nb::arg("comm_id"), nb::arg("device_ordinal"), nb::arg("rank"), nb::arg("world"),
        nb::arg("workspaces"), nb::arg("workspace_bytes"), nb::arg("timeout_s"),
        nb::arg("label"));

  m.def("close_comm",
        [](uint64_t comm_id, double linger_s) {
          auto states = Registry<RankState>::Instance().Remove(comm_id);
          std::vector<std::string> diverged;
          {
            // Waits for calls running on these ranks (at most their deadline)
            // before telling the peers that the ranks are gone.
            nb::gil_scoped_release release;
            for (auto& state : states) MarkClosed(*state);
            for (auto& state : states) {
              for (std::string& text : CallsNeverMade(*state, linger_s)) {
                diverged.push_back(std::move(text));
              }
            }
            // Mappings go with the last reference to the rank states.
            states.clear();
          }
          CommResourceTable<CommResources>::Instance().Take(comm_id);
          return diverged;
        },
        nb::arg("comm_id"), nb::arg("linger_s") = 0.0,
        "Closes this process's ranks of the communicator; returns a message for each peer "
        "that started a call these ranks never made (waiting up to linger_s for peers to "
        "close or fail, to be sure).");

  m.def("failure",
        [](uint64_t comm_id, int device_ordinal) -> std::string {
          auto state = Registry<RankState>::Instance().Find(comm_id, device_ordinal);
          const std::string core = state ? CommunicatorFailure(*state) : std::string();
          return core.empty() ? core : Unusable(core);
        },
        nb::arg("comm_id"), nb::arg("device_ordinal"),
        "Why this rank or a peer failed, or '' while the communicator is healthy.");

  m.def("capacities",
        [](size_t workspace_bytes, int world) {
          CheckCapacityArgs(workspace_bytes, world);
          // What the protocol of a rank with this workspace carries per round,
          // from the same functions the handlers use.
          RankState state;
          state.world = world;
          state.workspace_bytes = workspace_bytes;
          const size_t sender_share = SlotBytes(state, Algorithm::kOneShot);
          nb::dict out;
          out["oneshot"] = RoundCapacity(state, Algorithm::kOneShot);
          out["twoshot"] = RoundCapacity(state, Algorithm::kTwoShot);
          out["sender_share"] = sender_share;
          // The CPU handler runs any row (its all-reduce cuts anywhere); it
          // reports the CUDA handler's rule over its own share, which is what
          // Python decided the fused path by on CPU, so that CI takes the
          // paths a GPU would.
          const auto longest = [&](uint64_t residual_factor) {
            return LongestFittingRow(sender_share, [&](uint64_t row_bytes) {
              return FusedGroupRows(sender_share, row_bytes, residual_factor * row_bytes,
                                    row_bytes) > 0;
            });
          };
          out["max_fused_row_bytes"] = longest(1);
          out["max_fused_row_bytes_f32_residual"] = longest(kWideResidualFactor);
          return out;
        },
        nb::arg("workspace_bytes"), nb::arg("world"),
        "Bytes one round carries per algorithm (oneshot, twoshot), a sender's share of a data "
        "half (sender_share), and the longest row of x all_reduce_rms_norm fuses with a "
        "residual of x's type (max_fused_row_bytes) and with a float32 residual beside 16-bit "
        "x (max_fused_row_bytes_f32_residual).");

  m.def("limits", &CommonLimits,
        "max_ranks, control_bytes, and the rows the norm kernels take (vector_bytes, "
        "fused_min_hidden, fused_max_hidden).");

  m.def("codes", &Codes,
        "The numbering of ops and algorithms the FFI attributes carry (common/protocol.h).");

  m.def("live_ranks", []() { return Registry<RankState>::Instance().Size(); },
        "Rank states registered in this process (for leak checks).");

  m.def("process_identity",
        []() {
          const ProcessIdentity self = SelfIdentity();
          return std::make_tuple(self.pid, self.pid_namespace, self.start_ticks);
        },
        "(pid, pid namespace, start ticks) of this process, for peers' liveness checks.");

  m.def("has_exited",
        [](uint32_t pid, uint64_t pid_namespace, uint64_t start_ticks) {
          return HasExited(ProcessIdentity{pid, pid_namespace, start_ticks});
        },
        nb::arg("pid"), nb::arg("pid_namespace"), nb::arg("start_ticks"),
        "True only if that process (from process_identity()) has certainly ended.");
}

}  // namespace jax_ar::cpu
