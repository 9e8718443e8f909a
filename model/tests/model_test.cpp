// The libtorch decoder against transformers, on the tiny random checkpoints that
// make_fixtures.py writes (CTest runs it first, into $KZ_MODEL_FIXTURES): logits, batched greedy
// continuations and their log-probs, teacher-forced log-probs and their gradient, save/load round
// trips through transformers, and clear errors for broken checkpoints.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kz/core/files.h"
#include "kz/model/decode_loop.h"
#include "kz/model/generate.h"
#include "kz/model/safetensors.h"
#include "kz/model/transformer.h"
#include "test_util.h"

namespace kz::model {
namespace {

using namespace test;

using nlohmann::json;

constexpr double kTol = 1e-4;  // fp32 logits and log-probs (issue #5)

json reference(const std::string& name) { return read_json(fixtures() / name / "reference.json"); }


class ModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (fixtures().empty()) GTEST_SKIP() << "KZ_MODEL_FIXTURES is not set (run through ctest)";
    at::set_num_threads(2);
    ref_ = reference(GetParam());
    model_ = load(fixtures() / GetParam());
    ASSERT_TRUE(model_);
  }
  std::vector<std::vector<int64_t>> prompts() const { return ref_["prompts"].get<std::vector<std::vector<int64_t>>>(); }
  json ref_;
  std::shared_ptr<CausalLM> model_;
};

TEST_P(ModelTest, LogitsMatchTransformers) {
  c10::NoGradGuard no_grad;
  auto ps = prompts();
  for (size_t i = 0; i < ps.size(); ++i) {
    auto logits = model_->logits(at::tensor(ps[i], at::kLong).unsqueeze(0));
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    double diff = max_abs_diff(logits->squeeze(0), to_tensor(ref_["logits"][i]));
    EXPECT_LT(diff, kTol) << "prompt " << i;
    RecordProperty("max_abs_diff_prompt_" + std::to_string(i), std::to_string(diff));  // margin, in the XML
  }
}

TEST_P(ModelTest, LeftPaddedBatchMatchesSinglePrompts) {
  c10::NoGradGuard no_grad;
  auto ps = prompts();
  auto [ids, mask] = left_pad(ps, 0);
  auto logits = model_->logits(ids, mask);
  ASSERT_TRUE(logits.ok()) << logits.status().to_string();
  for (size_t i = 0; i < ps.size(); ++i) {
    int64_t n = static_cast<int64_t>(ps[i].size()), pad = ids.size(1) - n;
    at::Tensor got = logits->select(0, static_cast<int64_t>(i)).narrow(0, pad, n);
    EXPECT_LT(max_abs_diff(got, to_tensor(ref_["logits"][i])), kTol) << "prompt " << i;
  }
}

TEST_P(ModelTest, GreedyBatchMatchesTransformers) {
  std::vector<GenerateRequest> requests;
  for (const auto& p : prompts()) {
    GenerateRequest r;
    r.prompt_ids = p;
    r.sampling.temperature = 0;
    r.sampling.max_new_tokens = 20;
    requests.push_back(r);
  }
  auto out = generate(*model_, requests);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& res = (*out)[i];
    EXPECT_EQ(res.token_ids, ref_["greedy_tokens"][i].get<std::vector<int64_t>>()) << "row " << i;
    EXPECT_EQ(res.finish_reason, FinishReason::length);
    auto lp = ref_["greedy_logprobs"][i].get<std::vector<double>>();
    ASSERT_EQ(res.logprobs.size(), lp.size());
    for (size_t t = 0; t < lp.size(); ++t) EXPECT_NEAR(res.logprobs[t], lp[t], kTol) << "row " << i << " token " << t;
  }
}

// The device decode loop, greedy (eager on the CPU; the same step a CUDA graph captures) after a
// left-padded prefill: transformers' tokens and log-probs, and again after KVCache::reset (how a
// captured loop is reused).
TEST_P(ModelTest, GreedyDecodeLoopMatchesTransformers) {
  c10::NoGradGuard no_grad;
  auto [ids, mask] = left_pad(prompts(), 0);
  const int64_t new_tokens = 20;
  KVCache cache = model_->new_cache(ids.size(0), ids.size(1) + new_tokens);
  EXPECT_EQ(cache.capacity() % 16, 0);
  std::unique_ptr<DecodeLoop> loop;
  for (int round = 0; round < 2; ++round) {
    cache.reset();
    auto logits = model_->prefill(ids, mask, cache);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    if (!loop) {
      auto created = DecodeLoop::create(*model_, cache, Sampler::greedy(ids.size(0), model_->device()));
      ASSERT_TRUE(created.ok()) << created.status().to_string();
      loop = std::move(*created);
      EXPECT_FALSE(loop->uses_graph());
    }
    auto out = loop->run(logits->argmax(-1), new_tokens - 1);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    for (int64_t i = 0; i < ids.size(0); ++i) {
      auto want = ref_["greedy_tokens"][i].get<std::vector<int64_t>>();
      auto want_lp = ref_["greedy_logprobs"][i].get<std::vector<double>>();
      EXPECT_EQ(logits->select(0, i).argmax().item<int64_t>(), want[0]) << "round " << round << " row " << i;
      for (int64_t t = 1; t < new_tokens; ++t) {
        EXPECT_EQ(out->tokens[i][t - 1].item<int64_t>(), want[t]) << "round " << round << " row " << i << " t " << t;
        EXPECT_NEAR(out->logprobs[i][t - 1].item<double>(), want_lp[t], kTol) << "row " << i << " t " << t;
      }
    }
    EXPECT_EQ(cache.length, ids.size(1) + new_tokens - 1);
  }
  EXPECT_FALSE(loop->run(at::zeros({ids.size(0)}, at::kLong), 100).ok());  // no room left
}

// Right-padded batch (the trainer's layout) against per-sequence references, then the gradient
// of the summed log-probs against transformers' (the RL loss backpropagates through this).
TEST_P(ModelTest, TeacherForcedLogprobsAndGradient) {
  auto seqs = ref_["sequences"].get<std::vector<std::vector<int64_t>>>();
  size_t width = std::max(seqs[0].size(), seqs[1].size());
  at::Tensor ids = at::zeros({2, static_cast<int64_t>(width)}, at::kLong), mask = at::zeros_like(ids);
  for (size_t i = 0; i < 2; ++i)
    for (size_t t = 0; t < seqs[i].size(); ++t) {
      ids[i][t] = seqs[i][t];
      mask[i][t] = 1;
    }
  auto lp = token_logprobs(*model_, ids, mask, /*keep_graph=*/true);
  ASSERT_TRUE(lp.ok()) << lp.status().to_string();
  for (size_t i = 0; i < 2; ++i) {
    auto want = ref_["teacher_logprobs"][i].get<std::vector<float>>();
    at::Tensor got = lp->select(0, static_cast<int64_t>(i)).narrow(0, 0, static_cast<int64_t>(want.size()));
    EXPECT_LT(max_abs_diff(got, at::tensor(want)), kTol) << "sequence " << i;
    int64_t pads = static_cast<int64_t>(width - 1 - want.size());
    if (pads > 0) {  // positions whose target is padding score 0
      EXPECT_EQ(lp->select(0, static_cast<int64_t>(i)).narrow(0, static_cast<int64_t>(want.size()), pads).abs().sum().item<float>(), 0);
    }
  }
  at::Tensor total = lp->sum();
  EXPECT_NEAR(total.item<double>(), ref_["logprob_sum"].get<double>(), 1e-4 * std::abs(ref_["logprob_sum"].get<double>()));
  model_->zero_grad();
  total.backward();
  double sq = 0;
  for (const auto& p : model_->parameters()) sq += p.grad().defined() ? p.grad().pow(2).sum().item<double>() : 0;
  double want = ref_["grad_norm"].get<double>();
  EXPECT_NEAR(std::sqrt(sq), want, 1e-4 * want);

  auto no_graph = token_logprobs(*model_, ids, mask, /*keep_graph=*/false);
  ASSERT_TRUE(no_graph.ok());
  EXPECT_FALSE(no_graph->requires_grad());
  EXPECT_TRUE(lp->requires_grad());
}

TEST_P(ModelTest, ParametersHaveHuggingFaceNames) {
  auto params = model_->named_parameters();
  auto specs = expected_weights(model_->config());
  ASSERT_EQ(params.size(), specs.size());
  for (const auto& spec : specs) {
    const at::Tensor* p = params.find(spec.name);
    ASSERT_TRUE(p) << spec.name;
    EXPECT_EQ(p->sizes().vec(), spec.shape) << spec.name;
  }
}

TEST_P(ModelTest, SaveAndReloadKeepsWeights) {
  fs::path dir = scratch_dir("reload_" + GetParam());
  ASSERT_TRUE(model_->save(dir).is_ok());
  auto again = load(dir);
  ASSERT_TRUE(again);
  auto a = model_->named_parameters(), b = again->named_parameters();
  for (const auto& item : a) EXPECT_TRUE(at::equal(item.value(), b[item.key()])) << item.key();
}

INSTANTIATE_TEST_SUITE_P(Families, ModelTest, ::testing::Values("qwen2", "qwen3", "llama"));

// Save all three with our writer (llama sharded), load them in transformers (one Python run, it
// is the slow part): the same logits as the references.
TEST(RoundTrip, SavedCheckpointsLoadInTransformers) {
  if (fixtures().empty()) GTEST_SKIP() << "KZ_MODEL_FIXTURES is not set (run through ctest)";
  fs::path root = scratch_dir("roundtrip");
  std::string dirs;
  for (std::string name : {"qwen2", "qwen3", "llama"}) {
    auto m = load(fixtures() / name);
    ASSERT_TRUE(m);
    SaveOptions save;
    if (name == "llama") save.max_shard_bytes = 40000;
    ASSERT_TRUE(m->save(root / name, save).is_ok());
    EXPECT_EQ(fs::exists(root / name / "model.safetensors.index.json"), name == "llama");
    dirs.append(" ").append((root / name).string());
  }
  json prompts = reference("qwen2")["prompts"];
  std::ofstream(root / "prompts.json") << prompts.dump();
  std::string cmd = std::string(std::getenv("KZ_PYTHON")) + " " + std::getenv("KZ_SOURCE_DIR") +
                    "/model/tests/make_fixtures.py logits " + (root / "logits.json").string() + " " +
                    (root / "prompts.json").string() + dirs;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  json theirs = json::parse(*read_file(root / "logits.json"));
  for (std::string name : {"qwen2", "qwen3", "llama"}) {
    json ref = reference(name);
    const json& got = theirs[(root / name).string()];
    ASSERT_EQ(got.size(), ref["logits"].size()) << name;
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_LT(max_abs_diff(to_tensor(got[i]), to_tensor(ref["logits"][i])), kTol) << name << " prompt " << i;
  }
}

// ---- sampling ----

class SamplingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (fixtures().empty()) GTEST_SKIP() << "KZ_MODEL_FIXTURES is not set (run through ctest)";
    model_ = load(fixtures() / "qwen2");
    ASSERT_TRUE(model_);
  }
  GenerateRequest request(std::vector<int64_t> prompt, double temperature, uint64_t seed, int64_t n = 12) {
    GenerateRequest r;
    r.prompt_ids = std::move(prompt);
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.sampling.max_new_tokens = n;
    return r;
  }
  std::vector<GenerateResult> run(const std::vector<GenerateRequest>& requests) {
    auto out = generate(*model_, requests);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    return out.ok() ? *out : std::vector<GenerateResult>{};
  }
  std::shared_ptr<CausalLM> model_;
};

TEST_F(SamplingTest, SeedReproducibleAndIndependentOfBatch) {
  auto alone = run({request({1, 2, 3}, 1.0, 42)});
  auto batched = run({request({9, 9, 9, 9, 9, 9}, 0.7, 7), request({1, 2, 3}, 1.0, 42)});
  ASSERT_EQ(alone.size(), 1u);
  ASSERT_EQ(batched.size(), 2u);
  EXPECT_EQ(alone[0].token_ids, batched[1].token_ids);
  auto other_seed = run({request({1, 2, 3}, 1.0, 43)});
  EXPECT_NE(alone[0].token_ids, other_seed[0].token_ids);
}

// A prompt shared by several rows (a GRPO group) is prefilled once and forked: each row gives
// what it gives alone, samples of one prompt differ by seed, and the greedy row matches greedy.
TEST_F(SamplingTest, SharedPromptsAreForkedFromOnePrefill) {
  std::vector<GenerateRequest> requests{request({4, 5, 6, 7}, 1.0, 1), request({8, 9}, 1.0, 2),
                                        request({4, 5, 6, 7}, 1.0, 3), request({4, 5, 6, 7}, 0.0, 0, 5),
                                        request({4, 5, 6, 7}, 1.0, 4)};
  auto together = run(requests);
  ASSERT_EQ(together.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    auto alone = run({requests[i]});
    ASSERT_EQ(alone.size(), 1u);
    EXPECT_EQ(together[i].token_ids, alone[0].token_ids) << "row " << i;
    ASSERT_EQ(together[i].logprobs.size(), alone[0].logprobs.size()) << "row " << i;
    for (size_t t = 0; t < alone[0].logprobs.size(); ++t)
      EXPECT_NEAR(together[i].logprobs[t], alone[0].logprobs[t], kTol) << "row " << i << " token " << t;
  }
  EXPECT_NE(together[0].token_ids, together[2].token_ids);
}

TEST_F(SamplingTest, TopKOneIsGreedy) {
  auto r = request({4, 5, 6, 7}, 1.5, 3);
  r.sampling.top_k = 1;
  auto greedy = run({request({4, 5, 6, 7}, 0.0, 0)});
  EXPECT_EQ(run({r})[0].token_ids, greedy[0].token_ids);
  auto p = request({4, 5, 6, 7}, 1.0, 3);
  p.sampling.top_p = 1e-6;  // only the most likely token survives
  EXPECT_EQ(run({p})[0].token_ids, greedy[0].token_ids);
}

TEST_F(SamplingTest, StopTokensAndPerRequestLimits) {
  auto greedy = run({request({4, 5, 6, 7}, 0.0, 0)})[0].token_ids;
  auto stop = request({4, 5, 6, 7}, 0.0, 0);
  stop.sampling.stop_token_ids = {greedy[3]};
  auto short_one = request({8, 9}, 0.0, 0, 2);
  auto out = run({stop, short_one});
  auto first = std::find(greedy.begin(), greedy.end(), greedy[3]) - greedy.begin();
  EXPECT_EQ(out[0].finish_reason, FinishReason::stop);
  EXPECT_EQ(out[0].token_ids, std::vector<int64_t>(greedy.begin(), greedy.begin() + first + 1));
  EXPECT_EQ(out[1].finish_reason, FinishReason::length);
  EXPECT_EQ(out[1].token_ids.size(), 2u);
  EXPECT_EQ(out[0].logprobs.size(), out[0].token_ids.size());
}

// Tokens reach the host a chunk at a time: greedy and sampled rows (temperature, top-k, top-p)
// give the same results whatever the chunk, with stops and limits inside and across chunks.
TEST_F(SamplingTest, ChunkedDecodingMatchesStepByStep) {
  auto greedy = run({request({4, 5, 6, 7}, 0.0, 0)})[0].token_ids;
  auto stop = request({4, 5, 6, 7}, 0.0, 0);
  stop.sampling.stop_token_ids = {greedy[4]};
  auto nucleus = request({3, 1, 4, 1, 5}, 0.8, 5, 11);
  nucleus.sampling.top_p = 0.9;
  auto top_k = request({2, 7, 1, 8}, 1.3, 6, 9);
  top_k.sampling.top_k = 5;
  std::vector<GenerateRequest> requests{stop, request({8, 9}, 0.0, 0, 2), request({3, 1, 4, 1, 5}, 1.0, 4, 11),
                                        nucleus, top_k};
  GenerateOptions step_by_step;
  step_by_step.stop_check_steps = 1;
  auto want = generate(*model_, requests, step_by_step);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  EXPECT_EQ((*want)[0].finish_reason, FinishReason::stop);
  for (int64_t chunk : {3, 16}) {
    GenerateOptions options;
    options.stop_check_steps = chunk;
    auto got = generate(*model_, requests, options);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ((*got)[i].token_ids, (*want)[i].token_ids) << "chunk " << chunk << " row " << i;
      EXPECT_EQ((*got)[i].finish_reason, (*want)[i].finish_reason) << "chunk " << chunk << " row " << i;
      ASSERT_EQ((*got)[i].logprobs.size(), (*want)[i].logprobs.size());
      for (size_t t = 0; t < (*want)[i].logprobs.size(); ++t)
        EXPECT_NEAR((*got)[i].logprobs[t], (*want)[i].logprobs[t], kTol) << "chunk " << chunk << " row " << i;
    }
  }
}

// Streaming: on_progress sees each row as its tokens reach the host (after the prefill, then every
// stop_check_steps steps), the last time finished and with the result generate() returns.
TEST_F(SamplingTest, ProgressFollowsTheHostCopies) {
  std::vector<GenerateRequest> requests{request({4, 5, 6, 7}, 0.0, 0, 5), request({8, 9}, 1.0, 3, 12)};
  std::vector<std::vector<size_t>> sizes(requests.size());
  std::vector<int> finished(requests.size(), 0);
  std::vector<GenerateResult> last(requests.size());
  for (size_t i = 0; i < requests.size(); ++i)
    requests[i].on_progress = [&, i](const GenerateResult& so_far, bool done) {
      EXPECT_EQ(finished[i], 0) << "row " << i << " reported after it finished";
      sizes[i].push_back(so_far.token_ids.size());
      finished[i] += done;
      last[i] = so_far;
    };
  GenerateOptions options;
  options.stop_check_steps = 4;
  auto got = generate(*model_, requests, options);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(sizes[0], (std::vector<size_t>{1, 5}));
  EXPECT_EQ(sizes[1], (std::vector<size_t>{1, 5, 9, 12}));
  EXPECT_EQ(finished, (std::vector<int>{1, 1}));
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(last[i].token_ids, (*got)[i].token_ids) << "row " << i;
    EXPECT_EQ(last[i].finish_reason, (*got)[i].finish_reason) << "row " << i;
  }
}

// The sampler's draws against the distribution it samples: many rows of the same logits, one
// seed each, are a sample of size N; every token's frequency lies within 4 standard errors of its
// filtered probability, and filtered-out tokens never come up.
TEST(SamplerTest, DrawsFollowTheFilteredDistribution) {
  const int64_t n = 20000;
  at::Tensor logits = at::tensor({2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f}).unsqueeze(0).expand({n, 8});
  struct Case {
    double temperature;
    int64_t top_k;
    double top_p;
  };
  for (Case c : {Case{1.0, 0, 1.0}, Case{0.5, 0, 1.0}, Case{1.0, 3, 1.0}, Case{1.0, 0, 0.7}}) {
    std::vector<SamplingOptions> rows(static_cast<size_t>(n));
    for (size_t i = 0; i < rows.size(); ++i) {
      rows[i].temperature = c.temperature;
      rows[i].top_k = c.top_k;
      rows[i].top_p = c.top_p;
      rows[i].seed = 1000003 * i + 17;
    }
    Sampler sampler(rows, at::kCPU);
    // What the filters keep: the first top_k, or the smallest prefix of mass >= top_p.
    at::Tensor p = (logits.select(0, 0) / c.temperature).softmax(0);
    int64_t keep = 8;
    if (c.top_k > 0) keep = c.top_k;
    if (c.top_p < 1) keep = (p.cumsum(0) - p < c.top_p).sum().item<int64_t>();
    p = p.narrow(0, 0, keep) / p.narrow(0, 0, keep).sum();
    auto [tokens, logprobs] = sampler.choose(logits);
    at::Tensor counts = at::bincount(tokens, {}, 8).to(at::kDouble) / n;
    std::string where = "T=" + std::to_string(c.temperature) + " top_k=" + std::to_string(c.top_k) +
                        " top_p=" + std::to_string(c.top_p);
    for (int64_t v = 0; v < 8; ++v) {
      double want = v < keep ? p[v].item<double>() : 0.0;
      double se = std::sqrt(want * (1 - want) / n);
      EXPECT_NEAR(counts[v].item<double>(), want, 4 * se + 1e-9) << where << " token " << v;
    }
    // Log-probs are under the raw logits whatever the filters.
    at::Tensor raw = logits.log_softmax(-1).gather(1, tokens.unsqueeze(1)).squeeze(1);
    EXPECT_LT((logprobs - raw).abs().max().item<double>(), 1e-5) << where;
  }
}

// Each call is the next step of every row's stream: steps differ from each other, and the same
// seeds give the same draws again; greedy rows take the argmax beside sampled ones.
TEST(SamplerTest, StepsAdvanceAndSeedsReproduce) {
  const int64_t n = 256;
  at::Tensor logits = at::zeros({n, 64});
  logits.select(1, 9).fill_(0.5);
  std::vector<SamplingOptions> rows(static_cast<size_t>(n));
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].temperature = i == 0 ? 0.0 : 1.0;
    rows[i].seed = i;
  }
  Sampler a(rows, at::kCPU), b(rows, at::kCPU);
  at::Tensor first = a.choose(logits).first, second = a.choose(logits).first;
  EXPECT_EQ(first[0].item<int64_t>(), 9);
  EXPECT_EQ(second[0].item<int64_t>(), 9);
  EXPECT_LT(first.eq(second).to(at::kDouble).mean().item<double>(), 0.2);  // 64 near-equal choices
  EXPECT_TRUE(b.choose(logits).first.equal(first));
  EXPECT_TRUE(b.choose(logits).first.equal(second));
  EXPECT_TRUE(a.step().eq(2).all().item<bool>());
}

// Rows moved to another sampler keep their streams (seed and token index), and a sampler refuses
// rows that need a path it does not compute.
TEST(SamplerTest, MovedRowsKeepTheirStreams) {
  at::Tensor logits = at::randn({4, 32}, at::TensorOptions().dtype(at::kFloat));
  std::vector<SamplingOptions> rows(4);
  for (size_t i = 0; i < rows.size(); ++i) rows[i].seed = 100 + i;
  rows[1].top_k = 3;
  Sampler all(rows, at::kCPU);
  all.choose(logits);
  Sampler picked = all.select_rows(at::tensor({2, 1}, at::kLong));
  at::Tensor want = all.choose(logits).first;
  at::Tensor got = picked.choose(logits.index_select(0, at::tensor({2, 1}, at::kLong))).first;
  EXPECT_EQ(got[0].item<int64_t>(), want[2].item<int64_t>());
  EXPECT_EQ(got[1].item<int64_t>(), want[1].item<int64_t>());

  Sampler target = Sampler(rows, at::kCPU).select_rows(at::tensor({0, 0, 0, 0}, at::kLong));
  ASSERT_TRUE(target.replace_rows(at::tensor({3, 0}, at::kLong), picked).is_ok());
  EXPECT_TRUE(target.step().equal(at::tensor({2, 0, 0, 2}, at::kLong)));
  at::Tensor next = target.choose(logits.index_select(0, at::tensor({1, 0, 0, 2}, at::kLong))).first;
  at::Tensor next_want = picked.choose(logits.index_select(0, at::tensor({2, 1}, at::kLong))).first;
  EXPECT_EQ(next[3].item<int64_t>(), next_want[0].item<int64_t>());
  EXPECT_EQ(next[0].item<int64_t>(), next_want[1].item<int64_t>());

  Sampler greedy = Sampler::greedy(2, at::kCPU);
  EXPECT_FALSE(greedy.replace_rows(at::tensor({0, 1}, at::kLong), picked).is_ok());
}

// A row samples over the whole vocabulary or its filtered, sorted one by its own settings, not
// by whether another row of the batch filters.
TEST(SamplerTest, EachRowTakesItsOwnPath) {
  at::Tensor logits = at::randn({2, 64}, at::TensorOptions().dtype(at::kFloat));
  std::vector<SamplingOptions> rows(2);
  rows[0].seed = 5;
  rows[1].seed = 6;
  rows[1].top_p = 0.5;
  Sampler plain({rows[0]}, at::kCPU), mixed(rows, at::kCPU);
  for (int step = 0; step < 20; ++step) {
    int64_t alone = plain.choose(logits.narrow(0, 0, 1)).first[0].item<int64_t>();
    EXPECT_EQ(mixed.choose(logits).first[0].item<int64_t>(), alone) << "step " << step;
  }
}

TEST_F(SamplingTest, BadRequestsAreErrors) {
  auto empty = generate(*model_, {request({}, 0, 0)});
  EXPECT_FALSE(empty.ok());
  auto oov = generate(*model_, {request({1, 100000}, 0, 0)});
  ASSERT_FALSE(oov.ok());
  EXPECT_NE(oov.status().message().find("100000"), std::string::npos);
  auto bad_p = request({1}, 1, 0);
  bad_p.sampling.top_p = 0;
  EXPECT_FALSE(generate(*model_, {bad_p}).ok());
}

TEST_F(SamplingTest, Bfloat16LoadRuns) {
  LoadOptions options;
  options.dtype = at::kBFloat16;
  auto bf16 = load(fixtures() / "qwen2", options);
  ASSERT_TRUE(bf16);
  EXPECT_EQ(bf16->dtype(), at::kBFloat16);
  auto out = generate(*bf16, {request({1, 2, 3}, 0.0, 0, 5)});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->at(0).token_ids.size(), 5u);
}

// ---- broken checkpoints ----

// Copies the qwen2 fixture and rewrites its weights through `edit`.
fs::path edited_checkpoint(const std::string& name, const std::function<void(std::vector<StTensorView>&)>& edit) {
  fs::path dir = scratch_dir(name);
  fs::copy_file(fixtures() / "qwen2" / "config.json", dir / "config.json");
  auto src = SafetensorsFile::open(fixtures() / "qwen2" / "model.safetensors");
  EXPECT_TRUE(src.ok());
  std::vector<StTensorView> views;
  for (const auto& t : src->tensors()) views.push_back({t.name, t.dtype, t.shape, src->data(t), t.nbytes()});
  edit(views);
  EXPECT_TRUE(write_checkpoint(dir, views, 0).is_ok());
  return dir;
}

TEST(ModelErrors, MissingUnexpectedAndMisshapedAreAllNamed) {
  if (fixtures().empty()) GTEST_SKIP();
  std::vector<float> wrong(7 * 64, 0.f), extra(3, 0.f);
  fs::path dir = edited_checkpoint("broken", [&](std::vector<StTensorView>& v) {
    std::erase_if(v, [](const StTensorView& t) {
      return t.name == "model.layers.1.mlp.up_proj.weight" || t.name == "model.norm.weight";
    });
    for (auto& t : v)
      if (t.name == "model.layers.0.self_attn.k_proj.bias") t = {t.name, StDType::f32, {7, 64}, wrong.data(), wrong.size() * 4};
    v.push_back({"model.layers.0.extra.weight", StDType::f32, {3}, extra.data(), 12});
  });
  auto m = CausalLM::load(dir);
  ASSERT_FALSE(m.ok());
  const std::string msg = m.status().message();
  std::vector<std::string> parts = {"2 missing", "model.layers.1.mlp.up_proj.weight", "model.norm.weight",
                                    "1 unexpected", "model.layers.0.extra.weight", "1 mis-shaped",
                                    "model.layers.0.self_attn.k_proj.bias", "[7, 64]", dir.string()};
  for (const auto& part : parts)
    EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg;
}

TEST(ModelErrors, TruncatedShardIsAClearError) {
  if (fixtures().empty()) GTEST_SKIP();
  fs::path dir = scratch_dir("truncated");
  fs::copy_file(fixtures() / "qwen2" / "config.json", dir / "config.json");
  fs::copy_file(fixtures() / "qwen2" / "model.safetensors", dir / "model.safetensors");
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") - 100);
  auto m = CausalLM::load(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("truncated"), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("model.safetensors"), std::string::npos) << m.status().message();
}

TEST(ModelErrors, BrokenConfigNamesTheField) {
  if (fixtures().empty()) GTEST_SKIP();
  fs::path dir = scratch_dir("badconfig");
  fs::copy_file(fixtures() / "qwen2" / "model.safetensors", dir / "model.safetensors");
  std::string config = *read_file(fixtures() / "qwen2" / "config.json");
  config.replace(config.find("\"num_hidden_layers\""), 19, "\"num_hidden_layerz\"");
  ASSERT_TRUE(write_file_atomic(dir / "config.json", config).is_ok());
  auto m = CausalLM::load(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("num_hidden_layers"), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("config.json"), std::string::npos) << m.status().message();
}

TEST(ModelErrors, RandomInitSavesAndLoads) {
  auto config = load_model_config(fixtures() / "qwen3");
  if (fixtures().empty()) GTEST_SKIP();
  ASSERT_TRUE(config.ok());
  auto m = CausalLM::random(*config, 5);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  fs::path dir = scratch_dir("random");
  SaveOptions save;
  save.dtype = at::kBFloat16;
  ASSERT_TRUE((*m)->save(dir, save).is_ok());
  auto back = load(dir);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->dtype(), at::kBFloat16);
  EXPECT_EQ(back->config().dtype, WeightDType::bf16);
}

}  // namespace
}  // namespace kz::model
