// Continuous batching in generate(): requests that wait for rows, join a running batch (with the
// cache compacted to make room), and a batch that shrinks as rows finish give every request what
// it gives alone, greedy and sampled; the stats show the joins, compactions and shrinks happened.
// Requests handed in by GenerateOptions::admit while a batch runs join it the same way.
// A tiny random model on the CPU, no fixtures needed.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kz/model/config.h"
#include "kz/model/generate.h"
#include "kz/model/transformer.h"

namespace kz::model {
namespace {

constexpr double kTol = 1e-4;  // fp32 log-probs

constexpr const char* kTinyConfig = R"({
  "model_type": "qwen2", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "max_position_embeddings": 256, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
  "tie_word_embeddings": false, "torch_dtype": "float32"
})";

GenerateRequest request(std::vector<int64_t> prompt, int64_t max_new, double temperature = 0, uint64_t seed = 0,
                        std::vector<int64_t> stops = {}) {
  GenerateRequest r;
  r.prompt_ids = std::move(prompt);
  r.sampling.max_new_tokens = max_new;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.sampling.stop_token_ids = std::move(stops);
  return r;
}

class ContinuousBatchingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);  // a tiny model: threads would only add contention
    model_ = tiny_model(at::kCPU);
  }

  static std::shared_ptr<CausalLM> tiny_model(at::Device device) {
    auto config = parse_model_config(kTinyConfig, "the tiny test config");
    EXPECT_TRUE(config.ok()) << config.status().to_string();
    LoadOptions options;
    options.device = device;
    auto model = CausalLM::random(*config, 11, options);
    EXPECT_TRUE(model.ok()) << model.status().to_string();
    return model.ok() ? *model : nullptr;
  }

  std::vector<GenerateResult> run(const std::vector<GenerateRequest>& requests, GenerateOptions options = {},
                                  GenerateStats* stats = nullptr) {
    options.stats = stats;
    auto out = generate(*model_, requests, options);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    return out.ok() ? *out : std::vector<GenerateResult>{};
  }

  // Every request's result in `got` is what it gives alone: tokens, finish reason, log-probs.
  void expect_each_as_alone(const std::vector<GenerateRequest>& requests, const std::vector<GenerateResult>& got,
                            const std::string& where) {
    ASSERT_EQ(got.size(), requests.size()) << where;
    for (size_t i = 0; i < requests.size(); ++i) {
      auto alone = run({requests[i]});
      ASSERT_EQ(alone.size(), 1u);
      EXPECT_EQ(got[i].token_ids, alone[0].token_ids) << where << " request " << i;
      EXPECT_EQ(got[i].finish_reason, alone[0].finish_reason) << where << " request " << i;
      ASSERT_EQ(got[i].logprobs.size(), alone[0].logprobs.size()) << where << " request " << i;
      for (size_t t = 0; t < alone[0].logprobs.size(); ++t)
        EXPECT_NEAR(got[i].logprobs[t], alone[0].logprobs[t], kTol) << where << " request " << i << " token " << t;
    }
  }

  // `own` runs with options.admit handing in `arriving`, `per_call` of them at each call (before the
  // first step and at every host copy); every request, own and admitted, gets what it gets alone.
  GenerateStats run_admitting(const GenerateRequest& own, std::vector<GenerateRequest> arriving, size_t per_call,
                              GenerateOptions options, const std::string& where) {
    std::vector<GenerateResult> results(arriving.size());
    for (size_t i = 0; i < arriving.size(); ++i)
      arriving[i].on_progress = [&results, i](const GenerateResult& so_far, bool finished) {
        if (finished) results[i] = so_far;
      };
    size_t handed = 0;
    options.admit = [&](int64_t) {
      std::vector<GenerateRequest> lot;
      for (size_t end = std::min(handed + per_call, arriving.size()); handed < end; ++handed)
        lot.push_back(arriving[handed]);
      return lot;
    };
    GenerateStats stats;
    auto got = run({own}, options, &stats);
    for (auto& r : arriving) r.on_progress = nullptr;  // the runs alone below must not record
    expect_each_as_alone({own}, got, where + ", the call's own");
    expect_each_as_alone(arriving, results, where + ", the admitted ones");
    return stats;
  }

  // Seven requests of different prompt lengths, limits and stop tokens; sampled ones mix plain,
  // top-k and top-p rows.
  static std::vector<GenerateRequest> mixed_requests(double temperature) {
    std::vector<GenerateRequest> out{
        request({5, 6, 7}, 20, temperature, 1),
        request({9, 8, 7, 6, 5, 4, 3, 2, 1}, 4, temperature, 2),
        request({42}, 9, temperature, 3, {17, 23, 99}),
        request({10, 11, 12, 13, 14}, 15, temperature, 4, {64}),
        request({3, 3, 3, 3, 3, 3, 3}, 2, temperature, 5),
        request({100, 101}, 12, temperature, 6),
        request({7, 7, 1, 2, 90, 91, 92, 93, 94, 95, 96}, 7, temperature, 7, {5, 6, 7, 8, 9, 10, 11, 12})};
    if (temperature > 0) {
      out[3].sampling.top_k = 5;
      out[5].sampling.top_p = 0.8;
    }
    return out;
  }

  // A long request keeps its row while short ones cycle through the other, one chunk of 5 each.
  // The cache has 6 + 40 - 1 slots, rounded up to 48. The last request joins at cursor 31 and
  // needs 19 more slots: it fits only once the long row's 28 slots move to the left end.
  static std::vector<GenerateRequest> compaction_requests() {
    return {request({1, 2, 3}, 40),     request({4, 5, 6, 7, 8, 9}, 6), request({10, 11}, 6),
            request({12, 13, 14, 15}, 6), request({16, 17, 18}, 6),     request({19, 20, 21, 22, 23}, 6),
            request({24, 25, 26, 27, 28}, 20, 1.0, 9)};
  }

  std::shared_ptr<CausalLM> model_;
};

TEST_F(ContinuousBatchingTest, GreedyRequestsJoiningTwoRowsMatchEachAlone) {
  auto requests = mixed_requests(0.0);
  GenerateOptions options;
  options.max_batch_rows = 2;
  options.stop_check_steps = 3;
  GenerateStats stats;
  auto got = run(requests, options, &stats);
  expect_each_as_alone(requests, got, "greedy");
  EXPECT_EQ(stats.peak_rows, 2);
  EXPECT_GE(stats.joins, 5);  // every request but the first two (or ones that stop on their first token)
  EXPECT_EQ(stats.prefilled_prompts, 7);
  EXPECT_GT(stats.decode_row_steps, 0);
}

TEST_F(ContinuousBatchingTest, SampledRequestsJoiningTwoRowsMatchEachAlone) {
  auto requests = mixed_requests(1.0);
  GenerateOptions options;
  options.max_batch_rows = 2;
  options.stop_check_steps = 4;
  GenerateStats stats;
  auto got = run(requests, options, &stats);
  expect_each_as_alone(requests, got, "sampled");
  EXPECT_GE(stats.joins, 5);
}

// One batch of every request (the default) shrinks as rows finish, with results unchanged and
// fewer row-steps than seven rows for the longest request's steps.
TEST_F(ContinuousBatchingTest, BatchShrinksAsRowsFinish) {
  for (double temperature : {0.0, 1.0}) {
    auto requests = mixed_requests(temperature);
    GenerateOptions options;
    options.stop_check_steps = 2;
    GenerateStats stats;
    auto got = run(requests, options, &stats);
    std::string where = "temperature " + std::to_string(temperature);
    expect_each_as_alone(requests, got, where);
    EXPECT_EQ(stats.peak_rows, 7) << where;
    EXPECT_EQ(stats.joins, 0) << where;
    EXPECT_GE(stats.shrinks, 1) << where;
    EXPECT_LT(stats.decode_row_steps, 7 * 20) << where;
  }
}

// The cache fills up with short requests passing through one row; the last joiner needs the long
// row's slots moved left (compaction_requests).
TEST_F(ContinuousBatchingTest, JoinsCompactTheCacheWhenItRunsOutOfRoom) {
  auto requests = compaction_requests();
  GenerateOptions options;
  options.max_batch_rows = 2;
  options.stop_check_steps = 5;
  GenerateStats stats;
  auto got = run(requests, options, &stats);
  expect_each_as_alone(requests, got, "compaction");
  EXPECT_EQ(stats.compactions, 1);
  EXPECT_EQ(stats.joins, 5);
  EXPECT_EQ(stats.shrinks, 1);  // the long row, alone once the last joiner is done
}

// A GRPO group (one prompt, several seeds) beside another prompt, through two rows: each prompt is
// prefilled once however the group's samples join, and samples of one prompt differ by seed.
TEST_F(ContinuousBatchingTest, SharedPromptsArePrefilledOnce) {
  std::vector<GenerateRequest> requests;
  for (uint64_t seed = 0; seed < 5; ++seed) requests.push_back(request({4, 5, 6, 7}, 6 + 2 * seed, 1.0, seed));
  requests.push_back(request({8, 9}, 5, 1.0, 77));
  requests.push_back(request({4, 5, 6, 7}, 3, 0.0));
  GenerateOptions options;
  options.max_batch_rows = 2;
  options.stop_check_steps = 2;
  GenerateStats stats;
  auto got = run(requests, options, &stats);
  expect_each_as_alone(requests, got, "group");
  EXPECT_EQ(stats.prefilled_prompts, 2);
  EXPECT_GE(stats.joins, 4);
  EXPECT_NE(got[0].token_ids, got[1].token_ids);
}

// On a CUDA device the decode step is a captured graph: joins and compactions write into the
// tensors it was captured against and a shrink captures a new one, with the same results.
TEST_F(ContinuousBatchingTest, CudaGraphKeepsResultsThroughJoinsAndShrinks) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  model_ = tiny_model(at::Device(at::kCUDA, 0));
  ASSERT_TRUE(model_);
  GenerateOptions options;
  options.max_batch_rows = 2;
  options.stop_check_steps = 3;
  for (double temperature : {0.0, 1.0}) {
    auto requests = mixed_requests(temperature);
    GenerateStats stats;
    auto got = run(requests, options, &stats);
    std::string where = "cuda, temperature " + std::to_string(temperature);
    expect_each_as_alone(requests, got, where);
    EXPECT_GE(stats.joins, 5) << where;
    EXPECT_GE(stats.compactions, 1) << where;
    EXPECT_GE(stats.shrinks, 1) << where;
  }
  options.stop_check_steps = 5;
  GenerateStats stats;
  auto requests = compaction_requests();
  auto got = run(requests, options, &stats);
  expect_each_as_alone(requests, got, "cuda, compaction");
  EXPECT_EQ(stats.compactions, 1);
  EXPECT_GE(stats.shrinks, 1);
}

// A long greedy request runs alone; the hook hands in the mixed requests in two lots while it
// decodes (the sampled ones need paths the first batch did not compute, top-k/top-p included), and
// one that the cache cannot hold stays with the caller. The batch grows to seat them, each gets what it gets alone through
// on_progress, and the first admitted one finishes while the long one still decodes.
TEST_F(ContinuousBatchingTest, AdmittedRequestsJoinTheRunningBatchAndMatchEachAlone) {
  for (double temperature : {0.0, 1.0}) {
    std::string where = "admitted, temperature " + std::to_string(temperature);
    GenerateRequest long_request = request({1, 2, 3}, 40);  // a cache of 42 slots, rounded up to 48
    std::vector<GenerateRequest> arriving = mixed_requests(temperature);
    arriving.push_back(request({1, 2, 3, 4, 5}, 60));  // needs 64 slots
    std::vector<GenerateResult> results(arriving.size());
    std::vector<std::string> finish_order;
    for (size_t i = 0; i < arriving.size(); ++i)
      arriving[i].on_progress = [&, i](const GenerateResult& so_far, bool finished) {
        if (!finished) return;
        results[i] = so_far;
        finish_order.push_back("admitted " + std::to_string(i));
      };
    long_request.on_progress = [&](const GenerateResult&, bool finished) {
      if (finished) finish_order.push_back("long");
    };
    int calls = 0;
    size_t handed = 0;
    GenerateOptions options;
    options.max_batch_rows = 4;
    options.stop_check_steps = 3;
    options.admit = [&](int64_t cache_capacity) {
      EXPECT_EQ(cache_capacity, 48);
      ++calls;
      std::vector<GenerateRequest> lot;
      const size_t lot_end = calls == 2 ? 3 : calls == 4 ? 7 : handed;  // the 8th never fits
      for (; handed < lot_end; ++handed) lot.push_back(arriving[handed]);
      return lot;
    };
    GenerateStats stats;
    auto got = run({long_request}, options, &stats);
    ASSERT_EQ(got.size(), 1u) << where;
    long_request.on_progress = nullptr;  // the runs alone below must not record
    for (auto& r : arriving) r.on_progress = nullptr;
    expect_each_as_alone({long_request}, got, where);
    arriving.pop_back();
    results.pop_back();
    expect_each_as_alone(arriving, results, where);
    EXPECT_EQ(stats.admitted, 7) << where;
    EXPECT_GE(stats.joins, 6) << where;  // a request that stops on its first token takes no row
    EXPECT_GE(stats.grows, 1) << where;
    EXPECT_EQ(stats.peak_rows, 4) << where;
    ASSERT_FALSE(finish_order.empty()) << where;
    EXPECT_NE(finish_order.front(), "long") << where << ": the admitted requests waited for the long one";
  }
}

// A serving batch grows by row buckets: one request handed in at each host copy while a long one
// decodes takes the batch through 2, 4 and 8 rows (three grows, not seven), and every request still
// gets what it gets alone; as they finish it shrinks by buckets too.
TEST_F(ContinuousBatchingTest, AServingBatchGrowsAndShrinksByPowersOfTwo) {
  std::vector<GenerateRequest> arriving;
  for (int64_t i = 0; i < 7; ++i) arriving.push_back(request({4, 5, 6 + i}, 40));
  GenerateOptions options;
  options.max_batch_rows = 8;
  options.stop_check_steps = 2;
  GenerateStats stats = run_admitting(request({1, 2, 3}, 60), arriving, 1, options, "bucketed");
  EXPECT_EQ(stats.admitted, 7);
  EXPECT_EQ(stats.grows, 3) << "1 -> 2 -> 4 -> 8 rows";
  EXPECT_EQ(stats.peak_rows, 8);
  EXPECT_EQ(stats.shrinks, 2) << "8 -> 4 once two rows are live, 4 -> 2 once one is";
}

// Requests queued behind one that waits for cache room cannot join before it, so the batch does not
// widen for them: its rows follow what can run. Here the head request (prompt 40, 23 new tokens)
// fits beside the long own row only once that row has about 22 tokens left.
TEST_F(ContinuousBatchingTest, ABatchDoesNotWidenForRequestsThatCannotJoinYet) {
  std::vector<GenerateRequest> arriving{request(std::vector<int64_t>(40, 9), 23)};
  for (int64_t i = 0; i < 10; ++i) arriving.push_back(request({20 + i, 21}, 3));
  GenerateOptions options;
  options.max_batch_rows = 16;
  options.stop_check_steps = 2;
  GenerateStats stats = run_admitting(request({1, 2, 3}, 60), arriving, arriving.size(), options, "head waits");
  EXPECT_EQ(stats.admitted, 11);
  // Widened at the first arrival, 16 rows decode from the start: 692 row-steps; one row until the
  // head fits, then 16: 152.
  EXPECT_LT(stats.decode_row_steps, 300) << "rows decoded garbage while the head waited for room";
}

// A greedy batch computes the plain sampled path too, so requests sampled without top-k/top-p join
// it and get what they get alone.
TEST_F(ContinuousBatchingTest, PlainSampledRequestsJoinAGreedyBatch) {
  std::vector<GenerateRequest> arriving{request({4, 5}, 10, 1.0, 21), request({6, 7, 8}, 12, 0.7, 22)};
  GenerateOptions options;
  options.stop_check_steps = 2;
  GenerateStats stats = run_admitting(request({1, 2, 3}, 30), arriving, arriving.size(), options, "greedy batch");
  EXPECT_EQ(stats.admitted, 2);
}

// A batch that arrivals keep alive (a server's) drops each admitted request once it has finished
// and every request before it has: what it holds follows the live requests, not all it has served.
TEST_F(ContinuousBatchingTest, FinishedAdmittedRequestsAreReleasedWhileTheBatchRuns) {
  std::vector<std::weak_ptr<int>> held;  // one per admitted request, alive while the batch keeps it
  size_t most_held = 0, handed = 0;
  GenerateOptions options;
  options.max_batch_rows = 4;
  options.stop_check_steps = 2;
  options.admit = [&](int64_t) {
    most_held = std::max<size_t>(most_held, std::count_if(held.begin(), held.end(), [](const auto& w) {
                                   return !w.expired();
                                 }));
    std::vector<GenerateRequest> lot;
    if (handed < 40) {
      GenerateRequest r = request({static_cast<int64_t>(10 + handed % 5), 11}, 3);
      auto token = std::make_shared<int>(static_cast<int>(handed++));
      r.on_progress = [token](const GenerateResult&, bool) {};
      held.push_back(token);
      lot.push_back(std::move(r));
    }
    return lot;
  };
  auto got = run({request({1, 2, 3}, 4)}, options);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].token_ids.size(), 4u);
  EXPECT_EQ(handed, 40u) << "the batch lived until the last arrival";
  EXPECT_LT(most_held, 8u) << "finished requests were kept";
}

TEST_F(ContinuousBatchingTest, NegativeBatchRowsIsAnError) {
  GenerateOptions options;
  options.max_batch_rows = -1;
  auto out = generate(*model_, {request({1, 2}, 3)}, options);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("max_batch_rows"), std::string::npos) << out.status().message();
}

}  // namespace
}  // namespace kz::model
