// A c10d process group over the ranks of a World (world.h): libtorch's own collectives, Gloo for
// CPU tensors and NCCL for CUDA ones, rendezvous through a TCPStore that rank 0 serves on
// MASTER_ADDR:MASTER_PORT. A world of one has no backend: every collective returns at once with
// its input unchanged, so callers need no second code path.
//
// Gloo's device is the interface named by GLOO_SOCKET_IFNAME, else the loopback when the master
// is this host (127.0.0.1, localhost), else the one this host's name resolves to. NCCL is built
// in where libtorch has CUDA and nccl.h is found (KZ_DIST_NCCL, dist/CMakeLists.txt); its rank
// uses the CUDA device it is given (cuda:<LOCAL_RANK>). Every rank must issue the same
// collectives in the same order.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kz/core/status.h"
#include "kz/dist/world.h"

namespace kz::dist {

// An asynchronous collective; wait() returns once its result is in the tensor(s).
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual Status wait() = 0;
};

// Which backends this build has ("gloo", "nccl").
std::vector<std::string> available_backends();

class ProcessGroup {
 public:
  struct Options {
    // The rendezvous and each collective (torch's default): long enough for rank 0's evaluations
    // and checkpoints, which the other ranks wait out in their next collective.
    std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  };
  // Joins the group (blocks until every rank has): Gloo for a CPU device, NCCL for a CUDA one.
  static Result<std::shared_ptr<ProcessGroup>> connect(const World& world, const at::Device& device,
                                                       const Options& options);
  static Result<std::shared_ptr<ProcessGroup>> connect(const World& world, const at::Device& device) {
    return connect(world, device, Options{});
  }
  ~ProcessGroup();

  const World& world() const { return world_; }
  int rank() const { return world_.rank; }
  int size() const { return world_.size; }
  const at::Device& device() const { return device_; }
  const char* backend_name() const;  // "gloo", "nccl", or "none" for a world of one

  // Sums `tensor` (dense, contiguous, on device()) over the ranks, in place, asynchronously.
  std::unique_ptr<PendingCollective> all_reduce_sum_async(at::Tensor tensor);
  Status all_reduce_sum(at::Tensor tensor);
  // Sums of a few numbers over the ranks (token counts, losses), in float64.
  Result<std::vector<double>> all_reduce_sum(const std::vector<double>& values);
  // Every rank's `bytes`, in rank order (a world of one: its own). Small messages (the RL loop's
  // samples and verdicts): the strings travel as one byte tensor summed over the ranks, each rank
  // filling its own stretch.
  Result<std::vector<std::string>> all_gather(const std::string& bytes);
  // Rank `root`'s values of `tensors` (each on device()) copied into every rank's, in place.
  Status broadcast(std::vector<at::Tensor> tensors, int root = 0);
  Status barrier();

  struct Impl;  // the c10d backend (process_group.cpp, the only file that names Gloo or NCCL)

 private:
  ProcessGroup(World world, at::Device device, std::unique_ptr<Impl> impl);
  World world_;
  at::Device device_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kz::dist
