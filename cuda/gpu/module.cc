// Python module of the CUDA backend: FFI registrations, the codes and limits
// Python reads, plus the calls that jax_ar/comm/gpu_backend.py makes at setup
// and close.
//
// Failures that mean "these GPUs cannot reach each other" (an IPC handle
// that does not open, peer access refused) are recorded, not raised:
// verify() reports them and every rank falls back to psum. Failures that
// mean "this GPU cannot serve at all" (out of memory) raise.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "common/comm_resources.h"
#include "common/failure_text.h"
#include "common/module_util.h"
#include "common/rank_identity.h"
#include "common/registry.h"
#include "gpu/handlers.h"
#include "gpu/kernels.h"
#include "common/fused_row_fit.h"
#include "gpu/capacity.h"
#include "gpu/protocol_probe.h"
#include "gpu/rank_state.h"
#include "gpu/row_plan.h"
#include "gpu/rms_norm.h"
#include "gpu/reduce_scatter_all_gather.h"
#include "gpu/reduce_scatter_all_gather_handlers.h"

namespace nb = nanobind;

namespace jax_ar::gpu {
namespace {

std::atomic<uint64_t> next_token{1};

std::shared_ptr<CommResources> ResourcesOf(uint64_t comm_id) {
  return CommResourceTable<CommResources>::Instance().Of(comm_id);
}

std::string CudaText(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

void Check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) throw std::runtime_error("jax_ar: " + what + " failed (" + CudaText(err) + ")");
}

// A non-blocking stream of our own: setup work never waits for XLA's streams.
class PrivateStream {
 public:
  PrivateStream() { Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~PrivateStream() { cudaStreamDestroy(stream_); }
  PrivateStream(const PrivateStream&) = delete;
  PrivateStream& operator=(const PrivateStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

std::string ToHex(const void* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(data)[i];
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

bool FromHex(const std::string& s, void* data, size_t n) {
  if (s.size() != 2 * n) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    static_cast<unsigned char*>(data)[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

std::tuple<std::string, uintptr_t> CreateWorkspace(uint64_t comm_id, int device, size_t bytes) {
  DeviceGuard guard(device);
  void* address = nullptr;
  Check(cudaMalloc(&address, bytes),
        "cudaMalloc of a " + std::to_string(bytes) + "-byte workspace on GPU " + std::to_string(device));
  auto resources = ResourcesOf(comm_id);
  {
    std::lock_guard<std::mutex> lock(resources->mutex);
    resources->mappings.push_back({device, address, /*owned=*/true});
  }
  {
    PrivateStream stream;
    Check(cudaMemsetAsync(address, 0, bytes, stream.get()), "clearing the workspace");
    Check(cudaStreamSynchronize(stream.get()), "clearing the workspace");
  }
  cudaIpcMemHandle_t handle;
  std::string text;
  if (const cudaError_t err = cudaIpcGetMemHandle(&handle, address); err == cudaSuccess) {
    text = ToHex(&handle, sizeof(handle));
  } else {
    cudaGetLastError();
    resources->AddProblem("GPU " + std::to_string(device) + " cannot export its workspace (" +
                          CudaText(err) + ")");
  }
  return {text, reinterpret_cast<uintptr_t>(address)};
}

uintptr_t OpenWorkspace(uint64_t comm_id, int device, const std::string& handle_hex) {
  auto resources = ResourcesOf(comm_id);
  cudaIpcMemHandle_t handle;
  if (!FromHex(handle_hex, &handle, sizeof(handle))) {
    resources->AddProblem("a peer's workspace handle is unusable (it could not export it)");
    return 0;
  }
  DeviceGuard guard(device);
  void* address = nullptr;
  if (const cudaError_t err = cudaIpcOpenMemHandle(&address, handle, cudaIpcMemLazyEnablePeerAccess);
      err != cudaSuccess) {
    cudaGetLastError();
    resources->AddProblem("GPU " + std::to_string(device) +
                          " cannot map a peer process's workspace (cudaIpcOpenMemHandle: " +
                          CudaText(err) + ")");
    return 0;
  }
  std::lock_guard<std::mutex> lock(resources->mutex);
  resources->mappings.push_back({device, address, /*owned=*/false});
  return reinterpret_cast<uintptr_t>(address);
}

void ConnectLocal(uint64_t comm_id, int device, int peer_device) {
  if (device == peer_device) return;
  auto resources = ResourcesOf(comm_id);
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, device, peer_device) != cudaSuccess || !can) {
    cudaGetLastError();
    resources->AddProblem("GPU " + std::to_string(device) + " has no peer access to GPU " +
                          std::to_string(peer_device));
    return;
  }
  DeviceGuard guard(device);
  const cudaError_t err = cudaDeviceEnablePeerAccess(peer_device, 0);
  if (err != cudaSuccess && err != cudaErrorPeerAccessAlreadyEnabled) {
    resources->AddProblem("GPU " + std::to_string(device) + " could not enable peer access to GPU " +
                          std::to_string(peer_device) + " (" + CudaText(err) + ")");
  }
  cudaGetLastError();  // clears cudaErrorPeerAccessAlreadyEnabled
}

void RegisterRank(uint64_t comm_id, int device, int rank, int world,
                  const std::vector<uintptr_t>& workspaces, size_t workspace_bytes,
                  double timeout_s, const std::string& label) {
  const RankIdentity identity = RegisteredIdentity(comm_id, device, rank, world, workspaces,
                                                   workspace_bytes, timeout_s, label);
  DeviceGuard guard(device);
  for (cudaError_t err :
       {LoadKernels(), LoadRmsNormKernels(), LoadReduceScatterAllGatherKernels(),
        LoadProtocolProbeKernels()}) {
    Check(err, "loading jax_ar's kernels on GPU " + std::to_string(device) +
                   " (was the package built for this GPU's architecture?)");
  }
  auto state = std::make_shared<RankState>();
  static_cast<RankIdentity&>(*state) = identity;
  state->resources = ResourcesOf(comm_id);

  void* record = nullptr;
  Check(cudaHostAlloc(&record, sizeof(FailureRecord), cudaHostAllocMapped | cudaHostAllocPortable),
        "allocating the failure record");
  state->record = static_cast<FailureRecord*>(record);
  *state->record = FailureRecord{};
  void* record_device = nullptr;
  Check(cudaHostGetDevicePointer(&record_device, record, 0), "mapping the failure record");
  state->record_device = static_cast<FailureRecord*>(record_device);

  state->slot = AcquireSlot(device);
  if (state->slot < 0) {
    throw std::runtime_error("jax_ar: more than " + std::to_string(kMaxLiveSlots) +
                             " communicators on GPU " + std::to_string(device) +
                             "; close() some first");
  }
  state->token = next_token.fetch_add(1);
  Check(LocalControlAddress(state->slot, &state->local), "finding the control table");
  LocalControl fresh{};
  fresh.token = state->token;
  {
    PrivateStream stream;
    Check(WriteLocalControl(state->slot, fresh, stream.get()), "initializing the control slot");
    Check(cudaStreamSynchronize(stream.get()), "initializing the control slot");
  }
  Registry<RankState>::Instance().Add(comm_id, device, std::move(state));
}

std::string ProbeMessage(const RankState& s, const ProbeResult& r) {
  char text[400];
  switch (r.status) {
    case kProbeReadBack:
      std::snprintf(text, sizeof(text),
                    "rank %d (GPU %d) wrote %#llx into rank %d's workspace through its mapping "
                    "and read back %#llx",
                    s.rank, s.device_ordinal, static_cast<unsigned long long>(r.wrote), r.peer,
                    static_cast<unsigned long long>(r.read));
      break;
    case kProbeMissing:
      std::snprintf(text, sizeof(text),
                    "rank %d (GPU %d) never saw rank %d's probe write within %.1f s (peer "
                    "writes do not arrive, or kernels of different processes do not run at "
                    "the same time: ranks sharing a GPU need CUDA MPS)",
                    s.rank, s.device_ordinal, r.peer, s.timeout_s);
      break;
    default:
      std::snprintf(text, sizeof(text), "rank %d (GPU %d): P2P probe did not finish", s.rank,
                    s.device_ordinal);
  }
  return text;
}

// The P2P probe of every local rank, run concurrently (ranks of one process
// wait for each other); bounded by the ranks' deadlines. Returns "" or why not.
std::string Verify(uint64_t comm_id, const std::vector<int>& devices) {
  auto resources = ResourcesOf(comm_id);
  std::vector<std::string> problems;
  {
    std::lock_guard<std::mutex> lock(resources->mutex);
    problems = resources->problems;
  }
  struct Probe {
    std::shared_ptr<RankState> state;
    cudaStream_t stream = nullptr;
    ProbeResult* result = nullptr;
  };
  std::vector<Probe> probes;
  double timeout_s = 0;
  for (int device : devices) {
    auto state = Registry<RankState>::Instance().Find(comm_id, device);
    if (state == nullptr) continue;
    bool mapped = true;
    for (int r = 0; r < state->world; ++r) mapped &= state->workspaces[r] != nullptr;
    if (!mapped) continue;  // the reason is among the recorded problems
    DeviceGuard guard(device);
    Probe p;
    p.state = state;
    void* result = nullptr;
    if (cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaHostAlloc(&result, sizeof(ProbeResult), cudaHostAllocMapped) != cudaSuccess) {
      problems.push_back("GPU " + std::to_string(device) + ": cannot set up the P2P probe (" +
                         CudaText(cudaGetLastError()) + ")");
      if (p.stream) cudaStreamDestroy(p.stream);
      continue;
    }
    p.result = static_cast<ProbeResult*>(result);
    *p.result = ProbeResult{};
    ProbeArgs args{};
    for (int r = 0; r < state->world; ++r) args.workspaces[r] = state->workspaces[r];
    args.rank = state->rank;
    args.world = state->world;
    args.nonce = comm_id;
    args.timeout_ns = static_cast<uint64_t>(state->timeout_s * 1e9);
    void* device_result = nullptr;
    cudaHostGetDevicePointer(&device_result, result, 0);
    args.result = static_cast<ProbeResult*>(device_result);
    if (const cudaError_t err = LaunchProbe(args, p.stream); err != cudaSuccess) {
      problems.push_back("GPU " + std::to_string(device) + ": P2P probe kernel failed to launch (" +
                         CudaText(err) + ")");
    }
    timeout_s = std::max(timeout_s, state->timeout_s);
    probes.push_back(p);
  }
  // The kernels end by their own deadline; the host gives them a margin.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000) + 10000);
  for (Probe& p : probes) {
    DeviceGuard guard(p.state->device_ordinal);
    cudaError_t err;
    while ((err = cudaStreamQuery(p.stream)) == cudaErrorNotReady &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const volatile ProbeResult* written = p.result;
    const ProbeResult result{written->status, written->peer, written->wrote, written->read};
    if (err == cudaErrorNotReady) {
      problems.push_back(ProbeMessage(*p.state, ProbeResult{}));
      continue;  // the stream and result stay allocated: the kernel may still run
    }
    if (err != cudaSuccess) {
      problems.push_back("rank " + std::to_string(p.state->rank) + " (GPU " +
                         std::to_string(p.state->device_ordinal) + "): P2P probe failed (" +
                         CudaText(err) + ")");
    } else if (result.status != kProbeOk) {
      problems.push_back(ProbeMessage(*p.state, result));
    }
    cudaStreamDestroy(p.stream);
    cudaFreeHost(p.result);
  }
  std::string joined;
  for (const std::string& problem : problems) joined += (joined.empty() ? "" : "; ") + problem;
  return joined;
}

// Stops every launch of the communicator from touching its memory, waits
// for launches in flight, then unmaps and frees.
void CloseComm(uint64_t comm_id) {
  auto states = Registry<RankState>::Instance().Remove(comm_id);
  std::shared_ptr<CommResources> resources =
      CommResourceTable<CommResources>::Instance().Take(comm_id);
  std::vector<int> devices;
  for (auto& state : states) {
    DeviceGuard guard(state->device_ordinal);
    if (state->slot >= 0) {
      PrivateStream stream;
      WriteLocalControl(state->slot, LocalControl{}, stream.get());  // token 0: stale from now on
      cudaStreamSynchronize(stream.get());
      ReleaseSlot(state->device_ordinal, state->slot);
      state->slot = -1;
    }
    devices.push_back(state->device_ordinal);
  }
  if (resources == nullptr) return;
  std::lock_guard<std::mutex> lock(resources->mutex);
  for (const auto& m : resources->mappings) devices.push_back(m.device);
  for (int device : devices) {
    DeviceGuard guard(device);
    cudaDeviceSynchronize();  // launches in flight end at the latest by their deadline
  }
  for (const auto& m : resources->mappings) {
    DeviceGuard guard(m.device);
    if (m.owned) cudaFree(m.address); else cudaIpcCloseMemHandle(m.address);
  }
  resources->mappings.clear();
  cudaGetLastError();
}

}  // namespace

NB_MODULE(_jax_ar_cuda, m) {
  m.doc() = "jax_ar CUDA backend";

  m.def("device_uuid",
        [](int device) {
          // Which physical GPU an ordinal is, whatever CUDA_VISIBLE_DEVICES
          // made of the numbering: ranks on one GPU cannot use NCCL (psum).
          cudaDeviceProp prop;
          Check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
          static const char* kHex = "0123456789abcdef";
          std::string text;
          for (unsigned char byte : prop.uuid.bytes) {
            text += kHex[byte >> 4];
            text += kHex[byte & 15];
          }
          return text;
        },
        nb::arg("device"), "The UUID of CUDA device `device`, as hex.");

  m.def("capacities",
        [](uint64_t workspace_bytes, int world) {
          CheckCapacityArgs(workspace_bytes, world);
          const DataLayout layout = LayoutOf(workspace_bytes);
          nb::dict out;
          out["oneshot"] = RoundCapacity(layout, world, Algorithm::kOneShot);
          out["twoshot"] = RoundCapacity(layout, world, Algorithm::kTwoShot);
          out["twoshot_ll"] = PlanKernel(layout, world, AllReduceKernel::kTwoShotLL).capacity;
          out["sender_share"] = SenderShare(layout, world);
          out["max_fused_row_bytes"] = MaxFusedRowBytes(layout, world, 1);
          out["max_fused_row_bytes_f32_residual"] =
              MaxFusedRowBytes(layout, world, kWideResidualFactor);
          return out;
        },
        nb::arg("workspace_bytes"), nb::arg("world"),
        "Bytes one launch carries per kernel (oneshot, twoshot, twoshot_ll), a sender's "
        "share of a plain half (sender_share), and the longest row of x all_reduce_rms_norm "
        "fuses with a residual of x's type (max_fused_row_bytes) and with a float32 residual "
        "beside 16-bit x (max_fused_row_bytes_f32_residual), from the functions the handlers "
        "use (capacity.h).");

  m.def("limits",
        []() {
          nb::dict limits = CommonLimits();
          limits["rms_norm_max_row_vectors"] = kMaxRowVectors;
          return limits;
        },
        "max_ranks, control_bytes, the rows the norm kernels take (vector_bytes, "
        "fused_min_hidden, fused_max_hidden) and the longest row of rms_norm's kernel in "
        "16-byte vectors (rms_norm_max_row_vectors).");

  m.def("codes", &Codes,
        "The numbering of ops and algorithms the FFI attributes carry (common/protocol.h).");

  m.def("registrations", []() {
    nb::dict targets = Registrations({kAllReduce, kReduceScatter, kAllGather, kRmsNorm,
                                      kAddRmsNorm, kAllReduceRmsNorm});
    targets["jax_ar_protocol_probe"] = EncapsulateHandler(kProtocolProbe);  // the CUDA backend's only
    return targets;
  });

  m.def("create_workspace", &CreateWorkspace, nb::arg("comm_id"), nb::arg("device"), nb::arg("bytes"),
        "Allocates and zeroes a workspace on GPU `device`; returns (IPC handle as hex, address).");
  m.def("open_workspace", &OpenWorkspace, nb::arg("comm_id"), nb::arg("device"), nb::arg("handle"),
        "Maps a peer process's workspace for GPU `device`; returns its address, or 0 when it "
        "cannot (the reason goes to verify()).");
  m.def("connect_local", &ConnectLocal, nb::arg("comm_id"), nb::arg("device"), nb::arg("peer_device"),
        "Enables peer access from `device` to `peer_device` (problems go to verify()).");
  m.def("register_rank", &RegisterRank, nb::arg("comm_id"), nb::arg("device_ordinal"), nb::arg("rank"),
        nb::arg("world"), nb::arg("workspaces"), nb::arg("workspace_bytes"), nb::arg("timeout_s"),
        nb::arg("label"));
  m.def("verify", &Verify, nb::arg("comm_id"), nb::arg("devices"),
        "Probes P2P between the registered ranks of these devices; '' or the reasons it fails.");
  m.def("close_comm", &CloseComm, nb::arg("comm_id"));
  m.def("failure",
        [](uint64_t comm_id, int device_ordinal) -> std::string {
          auto state = Registry<RankState>::Instance().Find(comm_id, device_ordinal);
          const std::string core = state ? state->Failure() : std::string();
          return core.empty() ? core : Unusable(core);
        },
        nb::arg("comm_id"), nb::arg("device_ordinal"),
        "The message of the call that broke this rank, or '' while it is healthy.");
  m.def("handler_calls", &AllReduceHandlerCalls,
        "How often the all-reduce FFI handler ran in this process (host work; CUDA graph "
        "replays do not run it).");
  m.def("live_ranks", []() { return Registry<RankState>::Instance().Size(); },
        "Rank states registered in this process (for leak checks).");
}

}  // namespace jax_ar::gpu
