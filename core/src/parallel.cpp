// A minimal thread pool for independent items (evaluations, validations).
#include "kz/core/parallel.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace kz {

int cpu_cores() { return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN))); }

Status parallel_for(size_t count, int jobs, const std::function<Status(size_t)>& work) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  Status first_error;
  std::mutex error_mutex;
  auto loop = [&] {
    for (size_t i; !failed && (i = next++) < count;) {
      Status status = work(i);
      if (!status.is_ok()) {
        std::lock_guard lock(error_mutex);
        if (!failed.exchange(true)) first_error = status;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < std::max(1, jobs); ++t) threads.emplace_back(loop);
  loop();
  for (auto& thread : threads) thread.join();
  return first_error;
}

}  // namespace kz
