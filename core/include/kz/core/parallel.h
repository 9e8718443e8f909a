// Running independent work on a few threads, sized by the machine's cores.
#pragma once

#include <cstddef>
#include <functional>

#include "kz/core/status.h"

namespace kz {

// Online CPU cores (at least 1).
int cpu_cores();

// Runs `work(i)` for i in [0, count) on `jobs` threads (the caller's included); stops handing
// out work after a failure and returns the first failure.
Status parallel_for(size_t count, int jobs, const std::function<Status(size_t)>& work);

}  // namespace kz
