// The torchrun environment and kz launch's launcher (launch.h), with shell commands as ranks.
#include <gtest/gtest.h>

#include <chrono>

#include "kz/dist/launch.h"
#include "kz/dist/world.h"

namespace kz::dist {
namespace {

using Env = std::map<std::string, std::string>;

TEST(World, NoVariablesIsAWorldOfOne) {
  auto world = world_from_environment({});
  ASSERT_TRUE(world.ok()) << world.status().to_string();
  EXPECT_EQ(world->size, 1);
  EXPECT_EQ(world->rank, 0);
  EXPECT_FALSE(world->distributed());
}

TEST(World, ReadsTheTorchrunVariables) {
  auto world = world_from_environment({{"WORLD_SIZE", "8"}, {"RANK", "5"}, {"LOCAL_RANK", "1"},
                                       {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29400"}});
  ASSERT_TRUE(world.ok()) << world.status().to_string();
  EXPECT_EQ(world->size, 8);
  EXPECT_EQ(world->rank, 5);
  EXPECT_EQ(world->local_rank, 1);
  EXPECT_EQ(world->local_size, 4);
  EXPECT_EQ(world->master_addr, "node0");
  EXPECT_EQ(world->master_port, 29400);
  EXPECT_EQ(world_environment(*world).at("LOCAL_RANK"), "1");
}

TEST(World, ErrorsNameTheVariable) {
  auto missing = world_from_environment({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_PORT", "1234"}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("MASTER_ADDR"), std::string::npos) << missing.status().message();
  auto range = world_from_environment({{"WORLD_SIZE", "2"}, {"RANK", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  ASSERT_FALSE(range.ok());
  EXPECT_NE(range.status().message().find("RANK=\"2\""), std::string::npos) << range.status().message();
}

TEST(World, NvlinkMulticastIsOff) {
  ::setenv("NCCL_NVLS_ENABLE", "1", 1);
  disable_nvlink_multicast();
  EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
}

TEST(Launch, EveryRankGetsItsEnvironment) {
  LaunchOptions options;
  options.nproc = 3;
  // Each rank checks its own variables and exits non-zero if one is wrong.
  options.argv = {"sh", "-c",
                  "test \"$WORLD_SIZE\" = 3 && test \"$LOCAL_RANK\" = \"$RANK\" && test \"$NCCL_NVLS_ENABLE\" = 0 "
                  "&& test \"$MASTER_ADDR\" = 127.0.0.1 && test \"$MASTER_PORT\" -gt 0"};
  auto report = launch_local(options);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_EQ(report->failed_rank, -1) << report->failure;
  EXPECT_EQ(report->exit_codes, (std::vector<int>{0, 0, 0}));
}

TEST(Launch, AFailingRankStopsTheOthers) {
  LaunchOptions options;
  options.nproc = 2;
  options.grace = std::chrono::milliseconds(500);
  // Rank 1 fails at once; rank 0 would run for a minute, and ignores SIGTERM (SIGKILL ends it).
  options.argv = {"sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 3; fi; trap '' TERM; sleep 60 & wait; sleep 60"};
  auto started = std::chrono::steady_clock::now();
  auto report = launch_local(options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_EQ(report->failed_rank, 1);
  EXPECT_EQ(report->failure, "rank 1 exited with code 3");
  EXPECT_EQ(report->exit_codes[1], 3);
  EXPECT_NE(report->exit_codes[0], 0);  // stopped
  EXPECT_LT(seconds, 20.0);
}

TEST(Launch, ACommandThatCannotStartFails) {
  LaunchOptions options;
  options.nproc = 2;
  options.argv = {"/nonexistent/kz-no-such-program"};
  auto report = launch_local(options);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_NE(report->failure.find("exited with code 127"), std::string::npos) << report->failure;
  EXPECT_NE(report->failed_rank, -1);
}

}  // namespace
}  // namespace kz::dist
