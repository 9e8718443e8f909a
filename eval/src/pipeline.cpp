// Evaluating while building: a ready queue between the build threads and the evaluating ones.
#include "kz/eval/pipeline.h"

#include <thread>

#include "kz/core/parallel.h"

namespace kz {

void ReadyQueue::push(size_t item) {
  std::lock_guard lock(mutex_);
  items_.push_back(item);
  changed_.notify_one();
}

void ReadyQueue::close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
  changed_.notify_all();
}

void ReadyQueue::fail(Status status) {
  std::lock_guard lock(mutex_);
  if (error_.is_ok()) error_ = std::move(status);  // the first error is the cause; later ones follow from it
  changed_.notify_all();
}

Result<std::optional<size_t>> ReadyQueue::pop() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !error_.is_ok() || !items_.empty() || closed_; });
  if (!error_.is_ok()) return error_;
  if (items_.empty()) return std::optional<size_t>();
  size_t item = items_.front();
  items_.pop_front();
  return std::optional<size_t>(item);
}

Status ReadyQueue::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

namespace {

std::vector<size_t> items_not_built(size_t count, const std::vector<size_t>& to_build) {
  std::vector<bool> built(count, false);
  for (size_t item : to_build) built[item] = true;
  std::vector<size_t> items;
  for (size_t i = 0; i < count; ++i)
    if (!built[i]) items.push_back(i);
  return items;
}

}  // namespace

Status run_pipeline(size_t count, const std::vector<size_t>& to_build, PipelineJobs jobs,
                    const std::function<Result<Built>(size_t)>& build, const std::function<Status(size_t)>& evaluate) {
  // The queue's error is the one stop signal: a failed build releases the evaluating threads that
  // wait for it, and a failed evaluation keeps the builds that have not started from starting.
  ReadyQueue ready;
  std::thread builder([&] {
    Status built = parallel_for(to_build.size(), jobs.build, [&](size_t k) -> Status {
      if (!ready.error().is_ok()) return Status::ok();  // stopped: the error is the queue's already
      auto outcome = build(to_build[k]);
      if (!outcome.ok()) return outcome.status();
      if (*outcome == Built::evaluate) ready.push(to_build[k]);
      return Status::ok();
    });
    if (built.is_ok()) ready.close();
    else ready.fail(built);
  });
  auto evaluate_or_stop = [&](size_t item) {
    Status status = evaluate(item);
    if (!status.is_ok()) ready.fail(status);
    return status;
  };
  std::vector<size_t> now = items_not_built(count, to_build);
  // The first now.size() slots evaluate the items that need no build; each of the others takes
  // the next finished build (one slot per build, so none is left behind). Every error it returns
  // is the queue's already.
  (void)parallel_for(now.size() + to_build.size(), jobs.evaluate, [&](size_t k) -> Status {
    if (k < now.size()) {
      KZ_RETURN_IF_ERROR(ready.error());
      return evaluate_or_stop(now[k]);
    }
    auto next = ready.pop();
    if (!next.ok()) return next.status();
    return *next ? evaluate_or_stop(**next) : Status::ok();
  });
  builder.join();
  return ready.error();
}

}  // namespace kz
