// run_worker_request's prestarted spares, through a real Python process: a stand-in kz_worker that
// reports its pid, its scratch dir and how long it had been running when its request arrived.
#include "kz/eval/worker_client.h"

#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "kz/core/files.h"

namespace kz {
namespace {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr const char* kStandInWorker = R"(import json, os, sys, time
started = time.monotonic()
open("pid", "w").write(str(os.getpid()))  # in its scratch dir: the test may kill a waiting spare
text = sys.stdin.read()
if not text:
    sys.exit(0)
request = json.loads(text)
reply = {"type": "result", "pid": os.getpid(), "cwd": os.getcwd(), "scratch": request["scratch"],
         "waited_s": time.monotonic() - started, "preload": os.environ.get("KZ_WORKER_PRELOAD", "")}
os.write(3, (json.dumps(reply) + "\n").encode())
)";

class WorkerClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz-worker-client-test-");
    ASSERT_TRUE(dir.ok()) << dir.status().to_string();
    root_ = *dir;
    fs::create_directories(root_ / "worker" / "kz_worker");
    fs::create_directories(root_ / "scratch");
    ASSERT_TRUE(write_file_atomic(root_ / "worker" / "kz_worker" / "__main__.py", kStandInWorker).is_ok());
    ASSERT_TRUE(write_file_atomic(root_ / "worker" / "kz_worker" / "__init__.py", "").is_ok());
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }

  WorkerSetup setup(bool prestart) const {
    return WorkerSetup{"python3", root_ / "worker", root_ / "cache", root_ / "scratch", false, prestart};
  }

  nlohmann::json run(const WorkerSetup& s, const std::string& prefix = "kz-test-") const {
    auto outcome = run_worker_request(
        s, prefix, [](const fs::path& scratch) { return nlohmann::json{{"scratch", scratch.string()}}; },
        [](const std::string&) { return 30.0; });
    EXPECT_TRUE(outcome.ok()) << outcome.status().to_string();
    if (!outcome.ok()) return {};
    EXPECT_EQ(outcome->kind, WorkerOutcome::Kind::result) << outcome->message;
    return outcome->result;
  }

  fs::path root_;
};

TEST_F(WorkerClientTest, PrestartedSpareTakesTheNextRequestInAFreshProcess) {
  auto first = run(setup(true));
  ASSERT_TRUE(first.contains("pid")) << first.dump();
  EXPECT_EQ(first["preload"], "1") << "a prestarted worker is told to import before its request";
  EXPECT_EQ(first["cwd"], first["scratch"]) << "the request names the worker's own scratch dir";
  EXPECT_FALSE(fs::exists(first["scratch"].get<std::string>())) << "removed after the evaluation";

  std::this_thread::sleep_for(600ms);  // the spare left by the first run waits for a request
  auto second = run(setup(true));
  ASSERT_TRUE(second.contains("pid")) << second.dump();
  EXPECT_NE(second["pid"], first["pid"]) << "every evaluation gets its own process";
  EXPECT_GE(second["waited_s"].get<double>(), 0.5) << "the second request went to the spare started before it";
  EXPECT_EQ(second["cwd"], second["scratch"]);

  std::this_thread::sleep_for(600ms);
  auto other_kind = run(setup(true), "kz-other-");
  EXPECT_LT(other_kind["waited_s"].get<double>(), 0.5) << "a spare of another kind (scratch prefix) is not taken";
}

TEST_F(WorkerClientTest, SpareThatDiedWhileWaitingIsNotUsed) {
  run(setup(true));
  std::this_thread::sleep_for(600ms);
  int killed = 0;
  for (const auto& dir : fs::directory_iterator(root_ / "scratch")) {  // only the spare's is left
    auto pid = read_file(dir.path() / "pid");
    if (pid.ok() && ::kill(std::stoi(*pid), SIGKILL) == 0) ++killed;
  }
  ASSERT_EQ(killed, 1) << "one spare waited";
  std::this_thread::sleep_for(200ms);
  auto next = run(setup(true));
  ASSERT_TRUE(next.contains("waited_s")) << "a fresh worker took the request, not the dead spare: " << next.dump();
  EXPECT_LT(next["waited_s"].get<double>(), 0.5);
}

TEST_F(WorkerClientTest, WithoutPrestartEachRequestStartsItsWorker) {
  run(setup(false));
  std::this_thread::sleep_for(600ms);
  auto second = run(setup(false));
  EXPECT_LT(second["waited_s"].get<double>(), 0.5) << second.dump();
  EXPECT_EQ(second["preload"], "");
}

}  // namespace
}  // namespace kz
