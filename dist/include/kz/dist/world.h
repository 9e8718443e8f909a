// Where this process stands among the ranks of a data-parallel run, read from the torchrun
// environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), which
// `kz launch` and torchrun set, and a Slurm script exports from SLURM_PROCID and friends
// (docs/scale.md, "Launching").
// Torch-free: the launcher (kz) and the training side (kz-engine) share it.
#pragma once

#include <map>
#include <string>

#include "kz/core/status.h"

namespace kz::dist {

struct World {
  int rank = 0;              // 0 .. size-1; rank 0 logs, evaluates and writes checkpoints
  int size = 1;              // 1: no process group at all
  int local_rank = 0;        // this host's rank: which GPU (cuda:<local_rank>)
  int local_size = 1;
  std::string master_addr = "127.0.0.1";  // rank 0's host, where the TCP rendezvous store listens
  int master_port = 29500;
  bool is_main() const { return rank == 0; }
  bool distributed() const { return size > 1; }
};

// The world of `env` (a process's environment): none of the variables set is a world of one;
// WORLD_SIZE > 1 needs RANK, MASTER_ADDR and MASTER_PORT, and every number must be in range
// (the error names the variable).
Result<World> world_from_environment(const std::map<std::string, std::string>& env);
// The same from this process's environment.
Result<World> current_world();

// A configured device ("cpu", "cuda", "cuda:N") as this rank uses it: with several ranks a CUDA
// device becomes this host's rank's own GPU, cuda:<local_rank>; anything else is unchanged.
std::string rank_device(const std::string& device, const World& world);

// The torchrun variables describing `world`, for a rank's environment.
std::map<std::string, std::string> world_environment(const World& world);

// NVLink multicast (NVLS) stays off in every process kz starts: NCCL_NVLS_ENABLE=0 in this
// process's environment, inherited by everything it starts. kz and kz-engine call it first thing.
void disable_nvlink_multicast();

}  // namespace kz::dist
