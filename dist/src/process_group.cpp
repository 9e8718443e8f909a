// The c10d backends behind ProcessGroup (process_group.h). The only file of dist/ that includes
// ProcessGroupGloo.hpp (which needs gloo's headers: libgloo-dev) or ProcessGroupNCCL.hpp
// (nccl.h and the CUDA headers).
#include "kz/dist/process_group.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef KZ_DIST_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef KZ_DIST_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>
#include <cstring>

namespace kz::dist {

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;  // null for a world of one
  const char* name = "none";
};

namespace {

template <typename F>
auto collective(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    return internal_error(fmt::format("{}: {}", what, e.what()));
  }
}

class Pending : public PendingCollective {
 public:
  Pending(c10::intrusive_ptr<c10d::Work> work, std::string what) : work_(std::move(work)), what_(std::move(what)) {}
  Status wait() override {
    if (!work_) return Status::ok();
    return collective(what_, [&]() -> Status {
      work_->wait();
      work_.reset();
      return Status::ok();
    });
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
};

bool is_loopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1"; }

#ifdef KZ_DIST_GLOO
c10::intrusive_ptr<c10d::Backend> gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, const World& world,
                                               std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = timeout;
  const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
  if (interface && *interface)
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
  else if (is_loopback(world.master_addr))
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  else
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, world.rank, world.size, options);
}
#endif

#ifdef KZ_DIST_NCCL
c10::intrusive_ptr<c10d::Backend> nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, const World& world,
                                               const at::Device& device, std::chrono::milliseconds timeout) {
  c10::cuda::set_device(device.index());  // NCCL's communicator binds to the current device
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, world.rank, world.size, options);
}
#endif

Result<c10::intrusive_ptr<c10d::Backend>> make_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                       const World& world, const at::Device& device,
                                                       std::chrono::milliseconds timeout, const char*& name) {
  if (device.is_cuda()) {
#ifdef KZ_DIST_NCCL
    name = "nccl";
    return nccl_backend(store, world, device, timeout);
#else
    return invalid_argument(fmt::format("device {}: this build has no NCCL backend (libtorch without CUDA, or "
                                        "nccl.h not found: dist/CMakeLists.txt)",
                                        device.str()));
#endif
  }
  if (device.is_cpu()) {
#ifdef KZ_DIST_GLOO
    name = "gloo";
    return gloo_backend(store, world, timeout);
#else
    return invalid_argument("CPU ranks need the Gloo backend, which this build lacks (gloo's headers, libgloo-dev, "
                            "were not found: dist/CMakeLists.txt)");
#endif
  }
  return invalid_argument(fmt::format("device {}: data parallelism runs on CPU (Gloo) or CUDA (NCCL)", device.str()));
}

}  // namespace

std::vector<std::string> available_backends() {
  std::vector<std::string> names;
#ifdef KZ_DIST_GLOO
  names.push_back("gloo");
#endif
#ifdef KZ_DIST_NCCL
  names.push_back("nccl");
#endif
  return names;
}

ProcessGroup::ProcessGroup(World world, at::Device device, std::unique_ptr<Impl> impl)
    : world_(std::move(world)), device_(device), impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

const char* ProcessGroup::backend_name() const { return impl_->name; }

Result<std::shared_ptr<ProcessGroup>> ProcessGroup::connect(const World& world, const at::Device& device,
                                                            const Options& options) {
  auto impl = std::make_unique<Impl>();
  if (world.distributed()) {
    auto status = collective(
        fmt::format("rank {} of {} joining the process group at {}:{}", world.rank, world.size, world.master_addr,
                    world.master_port),
        [&]() -> Status {
          c10d::TCPStoreOptions store;
          store.port = static_cast<uint16_t>(world.master_port);
          store.isServer = world.is_main();
          store.numWorkers = world.size;
          store.waitWorkers = true;
          store.timeout = options.timeout;
          impl->store = c10::make_intrusive<c10d::TCPStore>(world.master_addr, store);
          auto backend = make_backend(impl->store, world, device, options.timeout, impl->name);
          if (!backend.ok()) return backend.status();
          impl->backend = *backend;
          return Status::ok();
        });
    if (!status.is_ok()) return status;
  }
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(world, device, std::move(impl)));
}

std::unique_ptr<PendingCollective> ProcessGroup::all_reduce_sum_async(at::Tensor tensor) {
  if (!impl_->backend) return std::make_unique<Pending>(nullptr, "");
  std::vector<at::Tensor> tensors = {std::move(tensor)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  return std::make_unique<Pending>(impl_->backend->allreduce(tensors, options),
                                   fmt::format("all-reduce on rank {} ({})", rank(), backend_name()));
}

Status ProcessGroup::all_reduce_sum(at::Tensor tensor) {
  return collective("all-reduce", [&]() -> Status { return all_reduce_sum_async(std::move(tensor))->wait(); });
}

Result<std::vector<double>> ProcessGroup::all_reduce_sum(const std::vector<double>& values) {
  if (!impl_->backend || values.empty()) return values;
  return collective("all-reduce of scalars", [&]() -> Result<std::vector<double>> {
    at::Tensor t = at::tensor(values, at::kDouble).to(device_);
    KZ_RETURN_IF_ERROR(all_reduce_sum_async(t)->wait());
    t = t.cpu();
    return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  });
}

Result<std::vector<std::string>> ProcessGroup::all_gather(const std::string& bytes) {
  if (!impl_->backend) return std::vector<std::string>{bytes};
  std::vector<double> sizes(static_cast<size_t>(size()), 0.0);
  sizes[static_cast<size_t>(rank())] = static_cast<double>(bytes.size());
  auto all_sizes = all_reduce_sum(sizes);
  if (!all_sizes.ok()) return all_sizes.status().with_context("all-gather: the sizes");
  std::vector<int64_t> offsets(sizes.size() + 1, 0);
  for (size_t r = 0; r < sizes.size(); ++r) offsets[r + 1] = offsets[r] + static_cast<int64_t>((*all_sizes)[r]);
  if (offsets.back() == 0) return std::vector<std::string>(sizes.size());
  return collective("all-gather", [&]() -> Result<std::vector<std::string>> {
    at::Tensor flat = at::zeros({offsets.back()}, at::kByte);
    const auto mine = static_cast<size_t>(rank());
    std::memcpy(flat.data_ptr<uint8_t>() + offsets[mine], bytes.data(), bytes.size());
    at::Tensor on_device = flat.to(device_);
    KZ_RETURN_IF_ERROR(all_reduce_sum_async(on_device)->wait());
    flat = on_device.cpu();
    const char* data = reinterpret_cast<const char*>(flat.data_ptr<uint8_t>());
    std::vector<std::string> out;
    for (size_t r = 0; r < sizes.size(); ++r) out.emplace_back(data + offsets[r], data + offsets[r + 1]);
    return out;
  });
}

Status ProcessGroup::broadcast(std::vector<at::Tensor> tensors, int root) {
  if (!impl_->backend || tensors.empty()) return Status::ok();
  return collective(fmt::format("broadcast from rank {}", root), [&]() -> Status {
    c10d::BroadcastOptions options;
    options.rootRank = root;
    // One tensor per call: Gloo takes several only for several devices.
    for (auto& t : tensors) {
      std::vector<at::Tensor> one = {t};
      impl_->backend->broadcast(one, options)->wait();
    }
    return Status::ok();
  });
}

Status ProcessGroup::barrier() {
  if (!impl_->backend) return Status::ok();
  return collective("barrier", [&]() -> Status {
    impl_->backend->barrier()->wait();
    return Status::ok();
  });
}

}  // namespace kz::dist
