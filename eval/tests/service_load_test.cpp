// Load test of the evaluation service on loopback: 1,000 evaluations, 32 in flight, one worker
// process killed with SIGKILL mid-batch; every submission must be answered exactly once.
//
// What really runs: the verdict cache is ON (a private file). The 1,000 items cycle through
// kVariants distinct correct torch-format candidates (the same code with a different comment), so
// each variant really runs a worker at least once (cached=false; more than once when copies are in
// flight together) and every other item is a cache hit (cached=true). The test checks that each
// verdict is one or the other: a real run went through a worker's stages, a hit did not.
// One item is a "sleeper" whose forward sleeps for minutes; the killer thread waits until a worker
// of this process holds the sleeper's source and has lived a few seconds, kills it with kill -9,
// and its verdict must be runtime_error/worker_crashed while the rest go on.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "service_fixture.h"
#include "test_support.h"

namespace kz::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kItems = 1000;
constexpr int kInFlight = 32;
constexpr int kVariants = 40;
constexpr int kSleeperIndex = 5;
// The sleeper's worker is killed once it has lived this long (a fork server's child counts from its
// fork as a spare: it may still be in an earlier stage; a kill in any stage is the same crash).
constexpr double kSleeperAgeS = 3;

double uptime_s() {
  std::ifstream uptime("/proc/uptime");
  double seconds = 0;
  uptime >> seconds;
  return seconds;
}

bool is_descendant_of_us(pid_t pid) {
  for (int depth = 0; depth < 8 && pid > 1; ++depth) {
    auto process = process_entry(pid);
    if (!process) return false;
    if (process->ppid == getpid()) return true;
    pid = process->ppid;
  }
  return false;
}

// The pid of a kz_worker process started by this test that is evaluating the sleeper (its scratch
// dir's candidate.py sleeps as kSleeperCandidate does: a fork server waiting for work holds none) and has lived
// longer than `age_s`. By content, not by age alone: on a loaded machine an ordinary child (forked as
// a spare before its request) can live long too.
std::optional<pid_t> sleeper_worker(double age_s) {
  for (const auto& process : live_processes()) {
    if (process.cmdline.find("kz_worker") == std::string::npos || !is_descendant_of_us(process.pid)) continue;
    std::ifstream candidate(process.dir() / "cwd" / "candidate.py");
    std::string source((std::istreambuf_iterator<char>(candidate)), std::istreambuf_iterator<char>());
    if (source.find("time.sleep(600)") == std::string::npos) continue;
    if (uptime_s() - process.started_s > age_s) return process.pid;
  }
  return std::nullopt;
}

struct Answer {
  std::string job;
  Verdict verdict;
};

TEST_F(ServiceTest, ThousandEvaluationsWithAKilledWorker) {
  start(/*workers=*/0);  // default: one per core
  std::mutex mutex;
  std::map<std::string, std::vector<Answer>> answers;  // client id -> every answer received
  std::vector<std::string> errors;
  std::atomic<int> next{0}, finished{0};
  auto started = Clock::now();

  // 32 clients, each with one item in flight at a time: submit, wait, repeat.
  auto client_loop = [&] {
    ServiceClient c = client();
    for (int i; (i = next++) < kItems;) {
      std::string id = "item-" + std::to_string(i);
      std::string source = i == kSleeperIndex ? kSleeperCandidate : correct_candidate(i % kVariants);
      auto submission = c.submit({item(id, source)});
      auto results = submission.ok() ? c.wait(submission->batch, std::chrono::minutes(4))
                                     : Result<std::vector<JobResult>>(submission.status());
      std::lock_guard lock(mutex);
      if (!results.ok()) {
        errors.push_back(id + ": " + results.status().to_string());
        continue;
      }
      for (const auto& r : *results) answers[id].push_back({r.job, *r.verdict});
      ++finished;
    }
  };
  pid_t killed = 0;
  std::thread killer([&] {
    auto deadline = Clock::now() + std::chrono::minutes(3);
    while (Clock::now() < deadline && finished < kItems) {
      if (auto pid = sleeper_worker(kSleeperAgeS)) {
        killed = *pid;
        ::kill(*pid, SIGKILL);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::vector<std::thread> clients;
  for (int t = 0; t < kInFlight; ++t) clients.emplace_back(client_loop);
  for (auto& thread : clients) thread.join();
  killer.join();
  double wall_s = std::chrono::duration<double>(Clock::now() - started).count();

  EXPECT_TRUE(errors.empty()) << errors.size() << " client errors, first: " << errors.front();
  ASSERT_GT(killed, 0) << "the sleeper's worker was never found";

  // Every submission answered exactly once, under its own job id.
  std::set<std::string> jobs;
  int real = 0, hits = 0;
  for (int i = 0; i < kItems; ++i) {
    std::string id = "item-" + std::to_string(i);
    ASSERT_EQ(answers[id].size(), 1u) << id << " answered " << answers[id].size() << " times";
    const Answer& a = answers[id].front();
    EXPECT_TRUE(jobs.insert(a.job).second) << "job id " << a.job << " answered twice";
    const Verdict& v = a.verdict;
    if (i == kSleeperIndex) {
      EXPECT_EQ(v.status, EvalStatus::runtime_error) << to_json(v).dump(2);
      EXPECT_TRUE(v.has_check(Check::worker_crashed)) << to_json(v).dump(2);
      EXPECT_NE(v.message.find("signal 9"), std::string::npos) << v.message;
      continue;
    }
    EXPECT_EQ(v.status, EvalStatus::ok) << id << "\n" << to_json(v).dump(2);
    if (v.cached) {
      ++hits;
      // A lookup and the shared syntax check: a loose bound, with room for a loaded machine (the
      // cached flag and the hit count below are the checks that it was a hit).
      EXPECT_LT(v.profile.wall_s, 2.0) << id;
    } else {
      ++real;
      // Not a wall-time floor: a child of a fork server ([tuning] fork_server) starts with Python loaded.
      EXPECT_FALSE(v.profile.stage_s.empty()) << id << ": a real run goes through a worker's stages";
    }
  }
  EXPECT_GE(real, kVariants) << "every variant runs at least once";
  EXPECT_EQ(real + hits, kItems - 1);

  auto counts = service_->counts();
  EXPECT_EQ(counts.submitted, size_t(kItems));
  EXPECT_EQ(counts.done, size_t(kItems));
  EXPECT_EQ(counts.queued + counts.running, 0u);
  std::cout << "[ measured ] " << kItems << " evaluations, " << kInFlight << " in flight, "
            << service_->workers() << " workers: " << real << " real runs, " << hits << " cache hits, 1 killed; "
            << wall_s << " s (" << kItems / wall_s << " verdicts/s)\n";
}

}  // namespace
}  // namespace kz::test
