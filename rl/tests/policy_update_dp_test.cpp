// The policy update data parallel (policy_update.h, set_process_group): 2 Gloo ranks, each
// running the update over the same rollouts and training on its share of every mini-batch, must
// end with identical weights, within float tolerance of 1 process training on all of them, with
// the same per-step loss and statistics. The update is the loop's: two epochs, uneven
// mini-batches (3 + 3 + 1 rows: rank 1 has no share of the last and still takes part), one row
// per micro-batch, a zero-advantage row skipped, AdamW with clipping. Without the gradient
// averaging the weights differ (the test can fail). The ranks are this binary again (the
// PolicyUpdateDpRank test, which skips unless KZ_DP_TEST_OUT is set), started by kz launch's code.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "kz/core/files.h"
#include "kz/dist/data_parallel.h"
#include "kz/dist/launch.h"
#include "kz/dist/process_group.h"
#include "kz/dist/world.h"
#include "kz/model/config.h"
#include "kz/model/train.h"
#include "kz/model/transformer.h"
#include "kz/rl/policy_update.h"
#include "tiny_qwen2.h"

namespace kz::rl {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<model::CausalLM> tiny_model() { return model::test::tiny_qwen2(/*seed=*/5); }

// Seven rollouts: prompts of 3-6 tokens, completions of 2-7, recorded log-probs near the random
// model's (about log 1/96), advantages of both signs and one zero.
std::vector<Rollout> rollouts() {
  const std::vector<double> advantages = {1.2, -0.8, 0.5, -0.9, 0.0, 1.1, -1.3};
  std::vector<Rollout> out;
  for (int r = 0; r < 7; ++r) {
    Rollout rollout;
    for (int t = 0; t < 3 + r % 4; ++t) rollout.prompt_ids.push_back((r * 13 + t * 5) % 96);
    for (int t = 0; t < 2 + (r * 3) % 6; ++t) {
      rollout.completion_ids.push_back((r * 7 + t * 11 + 1) % 96);
      rollout.old_logprobs.push_back(-4.4f - 0.05f * static_cast<float>((r + t) % 5));
    }
    rollout.advantage = advantages[static_cast<size_t>(r)];
    out.push_back(std::move(rollout));
  }
  return out;
}

std::vector<float> flat_weights(model::CausalLM& m) {
  std::vector<at::Tensor> parts;
  for (const auto& item : m.named_parameters(true)) parts.push_back(item.value().detach().reshape({-1}));
  at::Tensor all = at::cat(parts).contiguous();
  return std::vector<float>(all.data_ptr<float>(), all.data_ptr<float>() + all.numel());
}

struct Outcome {
  std::vector<float> weights;
  std::vector<double> losses, clip_fractions;  // per optimiser step
};

// One update over rollouts() on `world`'s ranks (alone: a world of one). Mode "sync": mini-batches
// of 3; "no-sync": the gradients left unaveraged, mini-batches of 4 (so that every rank has a
// share of each: a rank without a share needs the sync).
Outcome update(const dist::World& world, const std::string& mode) {
  const bool sync = mode == "sync";
  auto m = tiny_model();
  model::TrainOptions train;
  train.lr = 3e-3;
  train.max_grad_norm = 0.5;  // clipping happens: it must see the averaged gradient
  auto trainer = model::Trainer::create(m, train);
  EXPECT_TRUE(trainer.ok()) << trainer.status().to_string();
  auto group = dist::ProcessGroup::connect(world, at::kCPU);
  EXPECT_TRUE(group.ok()) << group.status().to_string();
  EXPECT_TRUE(dist::make_data_parallel(**trainer, *group, {}).is_ok());
  if (!sync) (*trainer)->set_gradient_sync(nullptr);
  PolicyUpdateOptions options;
  options.mini_batch_size = sync ? 3 : 4;
  options.micro_batch_size = 1;
  options.epochs = 2;
  options.shuffle_seed = 17;
  PolicyUpdate policy_update(**trainer, options);
  policy_update.set_process_group(*group);
  auto stats = policy_update.run(rollouts());
  EXPECT_TRUE(stats.ok()) << stats.status().to_string();
  Outcome out;
  if (!stats.ok()) return out;
  for (const PolicyStepStats& step : stats->per_step) {
    out.losses.push_back(step.step.loss);
    out.clip_fractions.push_back(step.step.clip_fraction);
  }
  out.weights = flat_weights(*m);
  return out;
}

void write_doubles(std::ofstream& file, const std::vector<double>& values) {
  file << values.size();
  for (double v : values) file << " " << v;
  file << "\n";
}

std::vector<double> read_doubles(std::ifstream& file) {
  size_t n = 0;
  file >> n;
  std::vector<double> values(n);
  for (double& v : values) file >> v;
  return values;
}

// A rank, started by the tests below: updates and writes what it ended with.
TEST(PolicyUpdateDpRank, Update) {
  const char* out = std::getenv("KZ_DP_TEST_OUT");
  if (!out) GTEST_SKIP() << "a rank of the tests below";
  at::set_num_threads(1);
  auto world = dist::current_world();
  ASSERT_TRUE(world.ok()) << world.status().to_string();
  Outcome outcome = update(*world, std::getenv("KZ_DP_TEST_MODE"));
  std::ofstream file(fs::path(out) / ("rank-" + std::to_string(world->rank) + ".txt"));
  file.precision(17);
  write_doubles(file, outcome.losses);
  write_doubles(file, outcome.clip_fractions);
  write_doubles(file, std::vector<double>(outcome.weights.begin(), outcome.weights.end()));
}

std::vector<Outcome> two_ranks(const std::string& mode) {
  fs::path out = fs::temp_directory_path() / ("kz-policy-dp-test-" + std::to_string(::getpid()) + "-" + mode);
  fs::create_directories(out);
  ::setenv("KZ_DP_TEST_OUT", out.c_str(), 1);
  ::setenv("KZ_DP_TEST_MODE", mode.c_str(), 1);
  dist::LaunchOptions options;
  options.nproc = 2;
  options.argv = {fs::read_symlink("/proc/self/exe").string(), "--gtest_filter=PolicyUpdateDpRank.Update"};
  auto report = dist::launch_local(options);
  ::unsetenv("KZ_DP_TEST_OUT");
  EXPECT_TRUE(report.ok()) << report.status().to_string();
  if (report.ok()) EXPECT_EQ(report->failed_rank, -1) << report->failure;
  std::vector<Outcome> outcomes;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream file(out / ("rank-" + std::to_string(rank) + ".txt"));
    Outcome o;
    o.losses = read_doubles(file);
    o.clip_fractions = read_doubles(file);
    for (double w : read_doubles(file)) o.weights.push_back(static_cast<float>(w));
    outcomes.push_back(std::move(o));
  }
  fs::remove_all(out);
  return outcomes;
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst;
}

class PolicyUpdateDp : public ::testing::Test {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

TEST_F(PolicyUpdateDp, TwoRanksTakeTheStepsOfOneProcess) {
  const std::vector<float> initial = flat_weights(*tiny_model());
  Outcome alone = update(dist::World{}, "sync");
  ASSERT_EQ(alone.losses.size(), 6u);  // two epochs of 3 + 3 + 1 rows
  ASSERT_GT(max_abs_difference(initial, alone.weights), 1e-3) << "the update must move the weights";
  auto ranks = two_ranks("sync");
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(max_abs_difference(ranks[0].weights, ranks[1].weights), 0.0) << "every rank takes the same steps";
  const double difference = max_abs_difference(ranks[0].weights, alone.weights);
  std::cout << "2 ranks against 1 process: max |weight difference| " << difference << "\n";
  EXPECT_LT(difference, 2e-5);
  ASSERT_EQ(ranks[0].losses.size(), alone.losses.size());
  for (size_t s = 0; s < alone.losses.size(); ++s) {
    EXPECT_NEAR(ranks[0].losses[s], alone.losses[s], 1e-5) << "step " << s;
    EXPECT_NEAR(ranks[1].losses[s], alone.losses[s], 1e-5) << "step " << s;
    EXPECT_NEAR(ranks[0].clip_fractions[s], alone.clip_fractions[s], 1e-6) << "step " << s;
  }
}

// The comparison above can fail: without the averaging each rank follows its own share.
TEST_F(PolicyUpdateDp, WithoutTheGradientAveragingTheRanksDrift) {
  Outcome alone = update(dist::World{}, "no-sync");
  auto ranks = two_ranks("no-sync");
  ASSERT_EQ(ranks.size(), 2u);
  std::cout << "without the averaging: max |weight difference| "
            << max_abs_difference(ranks[0].weights, alone.weights) << "\n";
  EXPECT_GT(max_abs_difference(ranks[0].weights, alone.weights), 1e-3);
  EXPECT_GT(max_abs_difference(ranks[0].weights, ranks[1].weights), 1e-3);
}

}  // namespace
}  // namespace kz::rl
