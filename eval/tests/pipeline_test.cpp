// The suite's scheduling (kz/eval/pipeline.h) over plain callables: what needs no build goes first,
// built items go in the order their builds finish and never before, settled ones not at all, and
// an error stops both sides without leaving a thread waiting. Ordering comes from gates the
// callables open for each other, never from sleeps; a deadlock aborts through the watchdog.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kz/eval/pipeline.h"

namespace kz {
namespace {

// Aborts the test program when a scope does not end within a minute: a pipeline that deadlocks
// fails the test instead of hanging it.
class Watchdog {
 public:
  explicit Watchdog(std::string what)
      : what_(std::move(what)), thread_([this] {
          std::unique_lock lock(mutex_);
          if (!ended_.wait_for(lock, std::chrono::seconds(60), [this] { return done_; })) {
            std::fprintf(stderr, "%s: still waiting after 60 s, deadlocked\n", what_.c_str());
            std::abort();
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    ended_.notify_one();
    thread_.join();
  }

 private:
  std::string what_;
  std::mutex mutex_;
  std::condition_variable ended_;
  bool done_ = false;
  std::thread thread_;  // last: starts once the rest is constructed
};

// Opened once; wait() blocks until then.
class Gate {
 public:
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    opened_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    opened_.wait(lock, [this] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

// What the callables did, in order: "built 3", "eval 3".
class Events {
 public:
  void add(const std::string& event) {
    std::lock_guard lock(mutex_);
    events_.push_back(event);
  }
  std::vector<std::string> all() {
    std::lock_guard lock(mutex_);
    return events_;
  }
  // The evaluated items, in order.
  std::vector<size_t> evaluated() {
    std::vector<size_t> items;
    for (const auto& event : all())
      if (event.rfind("eval ", 0) == 0) items.push_back(std::stoul(event.substr(5)));
    return items;
  }
  // Position of `event`; -1 when it did not happen.
  long position(const std::string& event) {
    auto events = all();
    auto it = std::find(events.begin(), events.end(), event);
    return it == events.end() ? -1 : it - events.begin();
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> events_;
};

std::string built(size_t i) { return "built " + std::to_string(i); }
std::string eval(size_t i) { return "eval " + std::to_string(i); }

TEST(ReadyQueue, GivesItemsInTheOrderPushedThenNothingOnceClosed) {
  ReadyQueue queue;
  for (size_t item : {2u, 0u, 1u}) queue.push(item);
  queue.close();
  for (size_t expected : {2u, 0u, 1u}) {
    auto next = queue.pop();
    ASSERT_TRUE(next.ok() && next->has_value());
    EXPECT_EQ(**next, expected);
  }
  auto end = queue.pop();
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());
}

TEST(ReadyQueue, FailReleasesAWaitingPop) {
  Watchdog watchdog("ReadyQueue.FailReleasesAWaitingPop");
  ReadyQueue queue;
  Result<std::optional<size_t>> popped = std::optional<size_t>();
  std::thread waiter([&] { popped = queue.pop(); });
  queue.fail(io_error("the build worker could not start"));
  waiter.join();
  ASSERT_FALSE(popped.ok());
  EXPECT_EQ(popped.status().message(), "the build worker could not start");
  queue.fail(internal_error("a later one"));
  EXPECT_EQ(queue.error().message(), "the build worker could not start") << "the first error is kept";
}

// Items 0 and 1 are built, 2 is not. The builds finish only once 2 was evaluated: a pipeline that
// builds everything first deadlocks, one that evaluates in item order evaluates 0 unbuilt.
TEST(Pipeline, ItemsThatNeedNoBuildGoFirstAndNoneBeforeItsBuild) {
  Watchdog watchdog("Pipeline.ItemsThatNeedNoBuildGoFirstAndNoneBeforeItsBuild");
  Events events;
  Gate plain_done;
  auto build = [&](size_t i) -> Result<Built> {
    plain_done.wait();
    events.add(built(i));
    return Built::evaluate;
  };
  auto evaluate = [&](size_t i) {
    events.add(eval(i));
    if (i == 2) plain_done.open();
    return Status::ok();
  };
  Status status = run_pipeline(3, {0, 1}, {.build = 2, .evaluate = 1}, build, evaluate);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(events.position(eval(2)), 0);
  for (size_t i : {0u, 1u}) {
    EXPECT_GE(events.position(eval(i)), 0) << i;
    EXPECT_LT(events.position(built(i)), events.position(eval(i))) << i;
  }
}

// Build 2 finishes first, build 0 once 2 is being evaluated, build 1 once 0 is: one evaluating
// thread must take them as they come (2, 0, 1); taking them in item order deadlocks.
TEST(Pipeline, BuiltItemsGoInTheOrderTheirBuildsFinish) {
  Watchdog watchdog("Pipeline.BuiltItemsGoInTheOrderTheirBuildsFinish");
  Events events;
  std::vector<Gate> may_finish(3);
  may_finish[2].open();
  auto build = [&](size_t i) -> Result<Built> {
    may_finish[i].wait();
    events.add(built(i));
    return Built::evaluate;
  };
  auto evaluate = [&](size_t i) {
    events.add(eval(i));
    if (i == 2) may_finish[0].open();
    if (i == 0) may_finish[1].open();
    return Status::ok();
  };
  Status status = run_pipeline(3, {0, 1, 2}, {.build = 3, .evaluate = 1}, build, evaluate);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(events.evaluated(), (std::vector<size_t>{2, 0, 1}));
}

TEST(Pipeline, SettledBuildsAreNotEvaluated) {
  Watchdog watchdog("Pipeline.SettledBuildsAreNotEvaluated");
  Events events;
  auto build = [&](size_t i) -> Result<Built> { return i == 0 ? Built::settled : Built::evaluate; };
  auto evaluate = [&](size_t i) {
    events.add(eval(i));
    return Status::ok();
  };
  Status status = run_pipeline(4, {0, 1}, {.build = 2, .evaluate = 3}, build, evaluate);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  auto evaluated = events.evaluated();
  std::sort(evaluated.begin(), evaluated.end());
  EXPECT_EQ(evaluated, (std::vector<size_t>{1, 2, 3}));
}

TEST(Pipeline, WithoutBuildsEverythingIsEvaluated) {
  Watchdog watchdog("Pipeline.WithoutBuildsEverythingIsEvaluated");
  Events events;
  auto build = [&](size_t) -> Result<Built> { return internal_error("nothing is built"); };
  auto evaluate = [&](size_t i) {
    events.add(eval(i));
    return Status::ok();
  };
  ASSERT_TRUE(run_pipeline(3, {}, {.build = 4, .evaluate = 2}, build, evaluate).is_ok());
  EXPECT_EQ(events.evaluated().size(), 3u);
}

// Three evaluating threads: one evaluates item 3, the others wait for builds. The first build
// fails (no worker could start) once 3 was evaluated: the waiting threads are released, no other
// build starts, and the build's error comes back.
TEST(Pipeline, ABuildErrorReleasesTheWaitingThreadsAndIsReturned) {
  Watchdog watchdog("Pipeline.ABuildErrorReleasesTheWaitingThreadsAndIsReturned");
  Events events;
  Gate evaluated_3;
  auto build = [&](size_t i) -> Result<Built> {
    events.add(built(i));
    evaluated_3.wait();
    return io_error("starting the worker: fork failed");
  };
  auto evaluate = [&](size_t i) {
    events.add(eval(i));
    if (i == 3) evaluated_3.open();
    return Status::ok();
  };
  Status status = run_pipeline(4, {0, 1, 2}, {.build = 1, .evaluate = 3}, build, evaluate);
  EXPECT_EQ(status.code(), StatusCode::io_error);
  EXPECT_EQ(status.message(), "starting the worker: fork failed");
  EXPECT_EQ(events.evaluated(), (std::vector<size_t>{3}));
  EXPECT_GE(events.position(built(0)), 0);
  EXPECT_EQ(events.position(built(1)), -1);
  EXPECT_EQ(events.position(built(2)), -1);
}

// One evaluating thread: item 2's evaluation fails, so the built items are not evaluated and the
// evaluation's error comes back (the builds still running finish; none waits forever).
TEST(Pipeline, AnEvaluationErrorStopsTheRun) {
  Watchdog watchdog("Pipeline.AnEvaluationErrorStopsTheRun");
  Events events;
  auto build = [&](size_t i) -> Result<Built> {
    events.add(built(i));
    return Built::evaluate;
  };
  auto evaluate = [&](size_t i) {
    events.add(eval(i));
    return i == 2 ? io_error("the GPU worker could not start") : Status::ok();
  };
  Status status = run_pipeline(3, {0, 1}, {.build = 1, .evaluate = 1}, build, evaluate);
  EXPECT_EQ(status.message(), "the GPU worker could not start");
  EXPECT_EQ(events.evaluated(), (std::vector<size_t>{2}));
}

}  // namespace
}  // namespace kz
