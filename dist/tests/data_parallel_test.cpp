// Data parallelism against one process (data_parallel.h): 2 Gloo ranks x B sequences must give
// the weights of 1 process x 2B after two optimiser steps of the trainer's real step (a tiny
// Qwen2, AdamW, clipping, two micro-batches per rank), within float tolerance, also with
// activation checkpointing and with bf16 parameters; without the gradient averaging they must
// not. The ranks are this binary again (the DataParallelRank test, which skips unless
// KZ_DP_TEST_OUT is set), started by kz launch's launcher. With KZ_DP_TEST_DEVICE=cuda
// (data_parallel_nccl_test, label gpu) the same runs over NCCL, one GPU per rank; it skips below
// 2 GPUs.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/cuda.h>

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
#include "tiny_qwen2.h"

namespace kz::dist {
namespace {

constexpr int kGlobalRows = 8;  // 2B: 4 per rank at world size 2
constexpr int kSteps = 2;

bool on_cuda() {
  const char* device = std::getenv("KZ_DP_TEST_DEVICE");
  return device && std::string(device) == "cuda";
}

// The rank's device: the CPU (Gloo), or its own GPU (NCCL).
at::Device rank_device(const World& world) {
  return on_cuda() ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank)) : at::Device(at::kCPU);
}

double tolerance() { return on_cuda() ? 1e-4 : 2e-5; }  // CUDA's backward sums with atomics

using model::test::tiny_qwen2;

// Row r of step s: deterministic token ids, lengths 6..13 right-padded to 13, loss on the second half.
model::MicroBatch rows(int step, const std::vector<int>& which) {
  const int64_t width = 13;
  std::vector<int64_t> ids, attention;
  std::vector<float> loss;
  for (int r : which) {
    const int64_t length = 6 + (r * 5 + step * 3) % 8;
    for (int64_t t = 0; t < width; ++t) {
      ids.push_back(t < length ? (r * 31 + t * 7 + step * 11) % 96 : 0);
      attention.push_back(t < length ? 1 : 0);
      if (t + 1 < width) loss.push_back(t + 1 < length && t + 1 >= length / 2 ? 1.0f : 0.0f);
    }
  }
  const auto n = static_cast<int64_t>(which.size());
  model::MicroBatch batch;
  batch.input_ids = at::tensor(ids).view({n, width});
  batch.attention_mask = at::tensor(attention).view({n, width});
  batch.loss_mask = at::tensor(loss).view({n, width - 1});
  return batch;
}

// This rank's rows of the global batch (every size-th), in two micro-batches.
std::vector<model::MicroBatch> shard(int step, int rank, int size) {
  std::vector<int> mine;
  for (int r = rank; r < kGlobalRows; r += size) mine.push_back(r);
  const auto half = static_cast<std::ptrdiff_t>(mine.size() / 2);
  return {rows(step, std::vector<int>(mine.begin(), mine.begin() + half)),
          rows(step, std::vector<int>(mine.begin() + half, mine.end()))};
}

std::vector<float> flat_weights(model::CausalLM& m) {
  std::vector<at::Tensor> parts;
  for (const auto& item : m.named_parameters(true))
    parts.push_back(item.value().detach().reshape({-1}).to(at::kCPU, at::kFloat));
  at::Tensor all = at::cat(parts).contiguous();
  return std::vector<float>(all.data_ptr<float>(), all.data_ptr<float>() + all.numel());
}

// The float32 weights AdamW updates (for bf16 parameters, their masters).
std::vector<float> flat_masters(const model::Trainer& trainer) {
  std::vector<at::Tensor> parts;
  for (const auto& name : trainer.parameter_names()) parts.push_back(trainer.master(name).reshape({-1}).cpu());
  at::Tensor all = at::cat(parts).contiguous();
  return std::vector<float>(all.data_ptr<float>(), all.data_ptr<float>() + all.numel());
}

struct Variant {
  bool sync = true;            // false: the gradients are not averaged
  bool checkpointing = false;  // activation checkpointing
  bool bf16 = false;           // bf16 parameters, float32 masters and gradient accumulators
};

Variant variant_of(const std::string& mode) {
  return {mode.find("no-sync") == std::string::npos, mode == "checkpointing", mode.starts_with("bf16")};
}

// Trains kSteps steps on this rank's shards; returns the float32 weights AdamW updated.
std::vector<float> train(const World& world, const Variant& variant) {
  const at::Device device = rank_device(world);
  // Each rank starts from its own random weights: rank 0's must win.
  const at::ScalarType dtype = variant.bf16 ? at::kBFloat16 : at::kFloat;
  auto m = tiny_qwen2(/*seed=*/7 + static_cast<uint64_t>(world.rank), device, dtype);
  model::TrainOptions options;
  options.lr = 3e-3;
  options.weight_decay = 0.01;
  options.max_grad_norm = 0.5;  // clipping happens: it must see the averaged gradient
  options.activation_checkpointing = variant.checkpointing;
  auto trainer = model::Trainer::create(m, options);
  EXPECT_TRUE(trainer.ok()) << trainer.status().to_string();
  auto group = ProcessGroup::connect(world, device);
  EXPECT_TRUE(group.ok()) << group.status().to_string();
  DataParallelOptions dp;
  dp.bucket_bytes = 4096;  // many buckets, so several are in flight during the backward pass
  auto wired = make_data_parallel(**trainer, *group, dp);
  EXPECT_TRUE(wired.is_ok()) << wired.to_string();
  if (!variant.sync) (*trainer)->set_gradient_sync(nullptr);
  model::LossOptions loss;
  for (int step = 0; step < kSteps; ++step) {
    auto batches = shard(step, world.rank, world.size);
    auto global = (*group)->all_reduce_sum({model::step_denominator(batches, loss)});
    EXPECT_TRUE(global.ok()) << global.status().to_string();
    auto stats = (*trainer)->step(batches, loss, (*global)[0] / world.size);
    EXPECT_TRUE(stats.ok()) << stats.status().to_string();
  }
  return flat_masters(**trainer);
}

fs::path self_executable() { return fs::read_symlink("/proc/self/exe"); }

// Runs the ranks of this binary's DataParallelRank test; returns each rank's weights.
std::vector<std::vector<float>> train_two_ranks(const std::string& mode) {
  fs::path out = fs::temp_directory_path() / ("kz-dp-test-" + std::to_string(::getpid()) + "-" + mode);
  fs::create_directories(out);
  ::setenv("KZ_DP_TEST_OUT", out.c_str(), 1);
  ::setenv("KZ_DP_TEST_MODE", mode.c_str(), 1);
  LaunchOptions options;
  options.nproc = 2;
  options.argv = {self_executable().string(), "--gtest_filter=DataParallelRank.Train"};
  auto report = launch_local(options);
  ::unsetenv("KZ_DP_TEST_OUT");
  EXPECT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_EQ(report->failed_rank, -1) << report->failure;
  std::vector<std::vector<float>> weights;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(out / ("rank-" + std::to_string(rank) + ".bin"), std::ios::binary | std::ios::ate);
    const auto bytes = static_cast<size_t>(std::max<std::streamoff>(in.tellg(), 0));
    in.seekg(0);
    weights.emplace_back(bytes / sizeof(float));
    in.read(reinterpret_cast<char*>(weights.back().data()), static_cast<std::streamsize>(bytes));
  }
  fs::remove_all(out);
  return weights;
}

// ||a - b|| / ||b - initial||: how far a lands from b, relative to how far b moved.
double relative_update_difference(const std::vector<float>& a, const std::vector<float>& b,
                                  const std::vector<float>& initial) {
  double apart = 0, moved = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    apart += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    moved += (double(b[i]) - initial[i]) * (double(b[i]) - initial[i]);
  }
  return std::sqrt(apart / std::max(moved, 1e-30));
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst;
}

// A rank, started by the tests below: trains and writes its weights.
TEST(DataParallelRank, Train) {
  const char* out = std::getenv("KZ_DP_TEST_OUT");
  if (!out) GTEST_SKIP() << "a rank of the tests below";
  auto world = current_world();
  ASSERT_TRUE(world.ok()) << world.status().to_string();
  auto weights = train(*world, variant_of(std::getenv("KZ_DP_TEST_MODE")));
  std::ofstream file(fs::path(out) / ("rank-" + std::to_string(world->rank) + ".bin"), std::ios::binary);
  file.write(reinterpret_cast<const char*>(weights.data()),
             static_cast<std::streamsize>(weights.size() * sizeof(float)));
}

class DataParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (on_cuda() && torch::cuda::device_count() < 2) GTEST_SKIP() << "NCCL needs 2 GPUs";
  }
};

TEST_F(DataParallel, TwoRanksMatchOneProcessWithTwiceTheBatch) {
  auto initial = flat_weights(*tiny_qwen2(7));
  auto reference = train(World{}, Variant{});
  ASSERT_GT(max_abs_difference(initial, reference), 1e-3) << "the steps must move the weights";
  auto ranks = train_two_ranks("sync");
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(max_abs_difference(ranks[0], ranks[1]), 0.0) << "every rank takes the same update";
  const double difference = max_abs_difference(ranks[0], reference);
  std::cout << "2 ranks x 4 against 1 x 8: max |weight difference| " << difference << "\n";
  EXPECT_LT(difference, tolerance());
}

TEST_F(DataParallel, HoldsWithActivationCheckpointing) {
  auto reference = train(World{}, Variant{});
  auto ranks = train_two_ranks("checkpointing");
  ASSERT_EQ(ranks.size(), 2u);
  const double difference = max_abs_difference(ranks[0], reference);
  std::cout << "with activation checkpointing: max |weight difference| " << difference << "\n";
  EXPECT_LT(difference, tolerance());
}

// bf16 parameters: the hook adds each gradient into its float32 accumulator before handing it over.
TEST_F(DataParallel, HoldsWithBf16ParametersAndFloat32Masters) {
  Variant bf16;
  bf16.bf16 = true;
  auto initial = flat_weights(*tiny_qwen2(7, at::kCPU, at::kBFloat16));
  auto reference = train(World{}, bf16);
  auto ranks = train_two_ranks("bf16");
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(max_abs_difference(ranks[0], ranks[1]), 0.0);
  auto apart = train_two_ranks("bf16-no-sync");
  ASSERT_EQ(apart.size(), 2u);
  // bf16 rounds each micro-batch's gradient (4 rows here, 2 per rank there) to 3 digits, and
  // AdamW turns a near-zero gradient's sign into a whole step: the masters are compared by how far
  // the whole update lands from the single process's, against the ranks without the averaging.
  const double synced = relative_update_difference(ranks[0], reference, initial);
  const double unsynced = relative_update_difference(apart[0], reference, initial);
  std::cout << "bf16 parameters: update off by " << synced << " (" << unsynced << " without the averaging)\n";
  EXPECT_LT(synced, 0.05);
  EXPECT_GT(unsynced, 4 * synced);
}

// The test above can fail: without the averaging each rank follows its own half of the batch.
TEST_F(DataParallel, WithoutTheAllReduceTheWeightsDiffer) {
  auto reference = train(World{}, Variant{});
  auto ranks = train_two_ranks("no-sync");
  ASSERT_EQ(ranks.size(), 2u);
  std::cout << "without the averaging: max |weight difference| " << max_abs_difference(ranks[0], reference) << "\n";
  EXPECT_GT(max_abs_difference(ranks[0], reference), 1e-3);
  EXPECT_GT(max_abs_difference(ranks[0], ranks[1]), 1e-3);
}

TEST(DataParallelBuckets, FollowTheBackwardOrderAndTheCap) {
  std::vector<at::Tensor> grads = {at::zeros({100}), at::zeros({100}), at::zeros({10}, at::kDouble), at::zeros({300})};
  auto plan = plan_buckets(grads, 800);  // 400-byte float tensors: two per bucket at most
  EXPECT_EQ(plan, (std::vector<std::vector<size_t>>{{3}, {2}, {1, 0}}));
}

TEST(DataParallelGroup, AWorldOfOneNeedsNoGroup) {
  auto group = ProcessGroup::connect(World{}, at::kCPU);
  ASSERT_TRUE(group.ok()) << group.status().to_string();
  EXPECT_STREQ((*group)->backend_name(), "none");
  auto sums = (*group)->all_reduce_sum({1.5, 2.0});
  ASSERT_TRUE(sums.ok());
  EXPECT_EQ(*sums, (std::vector<double>{1.5, 2.0}));
}

}  // namespace
}  // namespace kz::dist
