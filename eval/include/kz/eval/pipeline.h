// Evaluating while building: a suite's `cuda` candidates are built (compile-only, on the CPU) while
// the GPU evaluates the candidates that need no build, and each built one is evaluated as soon as
// its build is done. The scheduling only, over plain callables, so that it is tested on the CPU.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "kz/core/status.h"

namespace kz {

// Items whose builds are done, in the order they finished, for the threads that evaluate them.
// Thread-safe.
class ReadyQueue {
 public:
  void push(size_t item);
  void close();              // no more items will come
  void fail(Status status);  // the builds failed: every pop returns `status` from now on
  // The next item, waiting until there is one; nullopt once closed and empty.
  Result<std::optional<size_t>> pop();
  Status error() const;      // fail()'s status; ok before (does not wait)

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<size_t> items_;
  bool closed_ = false;
  Status error_;
};

// What a build says about its item: evaluate it now, or its build's outcome is final.
enum class Built { evaluate, settled };

struct PipelineJobs {
  int build = 1;     // builds at once
  int evaluate = 1;  // evaluations at once
};

// Evaluates items [0, count) while the items in `to_build` (distinct, each below count) are built,
// `jobs.build` at once on threads of their own. The evaluations take the items that need no build
// first, then each built item as its build finishes, in that order (an evaluating thread that gets
// there waits for the next one); an item is never evaluated before its build, nor at all when its
// build says Built::settled. The first error (a build's or an evaluation's) stops both sides: nothing new
// starts, waiting threads are released, what runs finishes, and that error is returned.
Status run_pipeline(size_t count, const std::vector<size_t>& to_build, PipelineJobs jobs,
                    const std::function<Result<Built>(size_t)>& build, const std::function<Status(size_t)>& evaluate);

}  // namespace kz
