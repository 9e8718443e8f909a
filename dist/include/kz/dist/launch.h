// `kz launch`: N local ranks of one kz command, as torchrun starts them. Each rank is a child
// process with the torchrun environment (world.h) and NCCL_NVLS_ENABLE=0, sharing the
// launcher's stdout and stderr. The launcher waits for all of them; the first rank that fails
// (a non-zero exit or a signal) has the others stopped (SIGTERM, then SIGKILL after a grace
// period), and the error names it. A killed launcher takes its ranks with it (PR_SET_PDEATHSIG).
// Torch-free.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "kz/core/status.h"

namespace kz::dist {

struct LaunchOptions {
  std::vector<std::string> argv;  // the command each rank runs (argv[0] a path, or looked up on PATH)
  int nproc = 1;                  // local ranks, one per GPU
  int nnodes = 1;                 // hosts; this one is node_rank (ranks node_rank*nproc ...)
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;            // 0: a free port of this host (single host only)
  std::chrono::milliseconds grace{5000};  // after SIGTERM, before SIGKILL
};

struct LaunchReport {
  std::vector<int> exit_codes;  // per local rank: its exit code, or 128 + signal
  int failed_rank = -1;         // the global rank that failed first; -1 when all succeeded
  std::string failure;          // "rank 1 exited with code 3", "rank 0 was killed by signal 9 ..."
};

// Starts the ranks and waits for them. An error only when a rank could not be started (the
// others are stopped then); a failed rank is in the report (kz launch exits with its code).
Result<LaunchReport> launch_local(const LaunchOptions& options);

// A TCP port free on this host now (bound to port 0 and released).
Result<int> free_port();

}  // namespace kz::dist
