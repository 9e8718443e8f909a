// Training against PyTorch, transformers and peft on the tiny fixtures (make_fixtures.py), with
// references from train_reference.py (CTest runs both first): one full fine-tuning step and one
// LoRA step (loss, grad norm, weights after AdamW), adapters that load in peft, merging,
// activation checkpointing, clipping, losses, schedules, and clear errors for bad adapters.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "kz/core/files.h"
#include "kz/model/generate.h"
#include "kz/model/lora.h"
#include "kz/model/safetensors.h"
#include "kz/model/train.h"
#include "kz/model/transformer.h"
#include "test_util.h"

namespace kz::model {
namespace {

using namespace test;

using nlohmann::json;

constexpr double kRel = 1e-4;  // loss and grad norm, relative (issue #5)

fs::path train_fixtures() { return env_dir("KZ_TRAIN_FIXTURES"); }

// All tensors of a safetensors file (or checkpoint dir) by name, as float32.
std::map<std::string, at::Tensor> read_tensors(const fs::path& path) {
  std::map<std::string, at::Tensor> out;
  auto ck = Checkpoint::open(path);
  EXPECT_TRUE(ck.ok()) << ck.status().to_string();
  if (!ck.ok()) return out;
  for (const auto& [name, e] : ck->entries()) {
    EXPECT_EQ(e.info->dtype, StDType::f32) << name;
    out[name] = at::from_blob(const_cast<void*>(e.file->data(*e.info)), e.info->shape, at::kFloat).clone();
  }
  return out;
}

std::string sci(double v) {  // margins recorded in the XML report
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}


// The reference batch; `split` gives two micro-batches (row 0, rows 1..) to exercise accumulation.
std::vector<MicroBatch> reference_batches(const json& ref, bool split) {
  MicroBatch all;
  all.input_ids = to_tensor(ref["input_ids"], at::kLong);
  all.attention_mask = to_tensor(ref["attention_mask"], at::kLong);
  all.loss_mask = to_tensor(ref["loss_mask"], at::kFloat);
  if (!split) return {all};
  auto rows = [&](int64_t begin, int64_t n) {
    MicroBatch b;
    b.input_ids = all.input_ids.narrow(0, begin, n);
    b.attention_mask = all.attention_mask.narrow(0, begin, n);
    b.loss_mask = all.loss_mask.narrow(0, begin, n);
    return b;
  };
  return {rows(0, 1), rows(1, all.input_ids.size(0) - 1)};
}

TrainOptions reference_options(const json& ref) {
  const json& h = ref["hyper"];
  TrainOptions o;
  o.lr = h["lr"];
  o.beta1 = h["beta1"];
  o.beta2 = h["beta2"];
  o.eps = h["eps"];
  o.weight_decay = h["weight_decay"];
  o.max_grad_norm = h["max_grad_norm"];
  return o;
}

std::unique_ptr<Trainer> make_trainer(std::shared_ptr<CausalLM> model, const TrainOptions& options) {
  auto t = Trainer::create(std::move(model), options);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(*t) : nullptr;
}

// Every trainable parameter's gradient after one backward of `batch` (random stream seeded).
std::map<std::string, at::Tensor> gradients(std::shared_ptr<CausalLM> model, const MicroBatch& batch, bool checkpointing) {
  TrainOptions options;
  options.activation_checkpointing = checkpointing;
  auto trainer = make_trainer(model, options);
  LossOptions loss;
  at::manual_seed(1234);
  auto share = trainer->backward(batch, loss, step_denominator({batch}, loss));
  EXPECT_TRUE(share.ok()) << share.status().to_string();
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model->named_parameters())
    if (item.value().requires_grad()) out[item.key()] = item.value().grad().clone();
  trainer->zero_grad();
  return out;
}

class TrainTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (fixtures().empty() || train_fixtures().empty()) GTEST_SKIP() << "fixture directories not set (run through ctest)";
    at::set_num_threads(2);
    ref_ = read_json(train_fixtures() / GetParam() / "reference.json");
    model_ = load(fixtures() / GetParam());
    ASSERT_TRUE(model_);
  }
  fs::path ref_dir() const { return train_fixtures() / GetParam(); }
  json ref_;
  std::shared_ptr<CausalLM> model_;
};

TEST_P(TrainTest, FullFinetuneStepMatchesTorch) {
  auto trainer = make_trainer(model_, reference_options(ref_));
  auto stats = trainer->step(reference_batches(ref_, /*split=*/true), LossOptions{});
  ASSERT_TRUE(stats.ok()) << stats.status().to_string();
  const double loss = ref_["full"]["loss"], norm = ref_["full"]["grad_norm"];
  EXPECT_NEAR(stats->loss, loss, kRel * loss);
  EXPECT_NEAR(stats->grad_norm, norm, kRel * norm);
  RecordProperty("loss_rel_diff", sci(std::abs(stats->loss - loss) / loss));
  RecordProperty("grad_norm_rel_diff", sci(std::abs(stats->grad_norm - norm) / norm));
  EXPECT_EQ(stats->step, 1);
  auto want = read_tensors(ref_dir() / "full_step");
  double worst = 0;
  for (const auto& item : model_->named_parameters()) {
    ASSERT_TRUE(want.count(item.key())) << item.key();
    double diff = max_abs_diff(item.value(), want[item.key()]);
    worst = std::max(worst, diff);
    EXPECT_LT(diff, 1e-5) << item.key();
  }
  RecordProperty("max_param_diff", sci(worst));
}

TEST_P(TrainTest, LoraStepMatchesPeft) {
  ASSERT_TRUE(load_lora(*model_, ref_dir() / "lora_init").is_ok());
  auto trainer = make_trainer(model_, reference_options(ref_));
  EXPECT_EQ(trainer->parameter_names().size(), lora_parameters(*model_).size());
  auto stats = trainer->step(reference_batches(ref_, /*split=*/true), LossOptions{});
  ASSERT_TRUE(stats.ok()) << stats.status().to_string();
  const double loss = ref_["lora"]["loss"], norm = ref_["lora"]["grad_norm"];
  EXPECT_NEAR(stats->loss, loss, kRel * loss);
  EXPECT_NEAR(stats->grad_norm, norm, kRel * norm);
  RecordProperty("loss_rel_diff", sci(std::abs(stats->loss - loss) / loss));
  RecordProperty("grad_norm_rel_diff", sci(std::abs(stats->grad_norm - norm) / norm));
  auto want = read_tensors(ref_dir() / "lora_step" / "adapter_model.safetensors");
  ASSERT_EQ(want.size(), lora_parameters(*model_).size());
  for (const auto& [name, t] : lora_parameters(*model_)) {
    const std::string key = "base_model.model." + name;
    ASSERT_TRUE(want.count(key)) << key;
    EXPECT_LT(max_abs_diff(t, want[key]), 1e-5) << name;
  }
}

// Names of the autograd nodes reachable from `t`.
std::multiset<std::string> graph_nodes(const at::Tensor& t) {
  std::multiset<std::string> names;
  std::set<const torch::autograd::Node*> seen;
  std::vector<std::shared_ptr<torch::autograd::Node>> todo = {t.grad_fn()};
  while (!todo.empty()) {
    auto node = todo.back();
    todo.pop_back();
    if (!node || !seen.insert(node.get()).second) continue;
    names.insert(node->name());
    for (const auto& edge : node->next_edges()) todo.push_back(edge.function);
  }
  return names;
}

TEST_P(TrainTest, CheckpointingKeepsOnlyLayerInputs) {
  at::Tensor ids = to_tensor(ref_["input_ids"], at::kLong);
  auto plain = graph_nodes(*model_->logits(ids));
  model_->activation_checkpointing = true;
  auto recomputed = graph_nodes(*model_->logits(ids));
  int64_t layers = model_->config().num_hidden_layers, found = 0;
  for (const auto& name : recomputed) found += name.find("CheckpointedLayer") != std::string::npos;
  EXPECT_EQ(found, layers);
  EXPECT_LT(recomputed.size() + 20 * static_cast<size_t>(layers), plain.size());  // the layers' insides are gone
  c10::NoGradGuard no_grad;  // without grad mode nothing is recorded either way
  EXPECT_FALSE(model_->logits(ids)->requires_grad());
}

TEST_P(TrainTest, ActivationCheckpointingGivesTheSameGradients) {
  MicroBatch batch = reference_batches(ref_, false)[0];
  auto plain = gradients(model_, batch, false);
  auto recomputed = gradients(model_, batch, true);
  ASSERT_EQ(plain.size(), recomputed.size());
  for (const auto& [name, g] : plain) EXPECT_LT(max_abs_diff(g, recomputed[name]), 1e-6) << name;
  // LoRA: the layers' inputs (frozen embeddings) need no gradient, the adapters inside do.
  ASSERT_TRUE(load_lora(*model_, ref_dir() / "lora_init").is_ok());
  auto lora_plain = gradients(model_, batch, false);
  auto lora_recomputed = gradients(model_, batch, true);
  ASSERT_EQ(lora_plain.size(), lora_parameters(*model_).size());
  for (const auto& [name, g] : lora_plain) {
    ASSERT_TRUE(lora_recomputed[name].defined()) << name;
    EXPECT_LT(max_abs_diff(g, lora_recomputed[name]), 1e-6) << name;
  }
}

TEST_P(TrainTest, MergedAdapterGivesTheSameLogitsAndSaves) {
  ASSERT_TRUE(load_lora(*model_, ref_dir() / "lora_step").is_ok());
  c10::NoGradGuard no_grad;
  at::Tensor ids = to_tensor(ref_["input_ids"], at::kLong);
  at::Tensor with_adapter = *model_->logits(ids);
  ASSERT_TRUE(merge_lora(*model_).is_ok());
  EXPECT_FALSE(has_lora(*model_));
  EXPECT_EQ(model_->named_parameters().size(), expected_weights(model_->config()).size());
  at::Tensor merged = *model_->logits(ids);
  EXPECT_LT(max_abs_diff(with_adapter, merged), 1e-4);
  fs::path dir = scratch_dir("merged_" + GetParam());
  ASSERT_TRUE(model_->save(dir).is_ok());
  auto back = load(dir);
  ASSERT_TRUE(back);
  EXPECT_LT(max_abs_diff(*back->logits(ids), merged), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Families, TrainTest, ::testing::Values("qwen2", "qwen3", "llama"));

// ---- LoRA on its own ----

class LoraTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (fixtures().empty()) GTEST_SKIP() << "KZ_MODEL_FIXTURES is not set (run through ctest)";
    at::set_num_threads(2);
    model_ = load(fixtures() / "qwen2");
    ASSERT_TRUE(model_);
  }
  std::shared_ptr<CausalLM> model_;
};

TEST_F(LoraTest, FreshAdaptersStartAsPeftAndFreezeTheBase) {
  c10::NoGradGuard no_grad;
  at::Tensor ids = at::tensor(std::vector<int64_t>{5, 17, 99, 3, 64}).unsqueeze(0);
  at::Tensor before = *model_->logits(ids);
  LoraOptions options;
  options.r = 8;
  options.alpha = 16;
  options.target_modules = {"q_proj", "down_proj"};
  ASSERT_TRUE(add_lora(*model_, options).is_ok());
  auto params = lora_parameters(*model_);
  ASSERT_EQ(params.size(), 2u * 2u * 2u);  // 2 layers x 2 targets x (A, B)
  EXPECT_EQ(params[0].first, "model.layers.0.self_attn.q_proj.lora_A.weight");
  for (const auto& [name, t] : params) {
    EXPECT_EQ(t.scalar_type(), at::kFloat) << name;
    EXPECT_TRUE(t.requires_grad()) << name;
    if (name.ends_with("lora_B.weight")) {
      EXPECT_EQ(t.abs().max().item<double>(), 0.0) << name;
    } else {  // kaiming-uniform(a = sqrt(5)): U(-1/sqrt(in), 1/sqrt(in))
      double bound = 1.0 / std::sqrt(static_cast<double>(t.size(1)));
      EXPECT_LE(t.abs().max().item<double>(), bound) << name;
      EXPECT_GT(t.abs().max().item<double>(), 0.9 * bound) << name;
      EXPECT_NEAR(t.mean().item<double>(), 0.0, 0.1 * bound) << name;
    }
  }
  EXPECT_EQ(params[0].second.sizes().vec(), (std::vector<int64_t>{8, 64}));
  int64_t trainable = 0;
  for (const auto& p : model_->parameters()) trainable += p.requires_grad();
  EXPECT_EQ(trainable, static_cast<int64_t>(params.size()));
  EXPECT_LT(max_abs_diff(*model_->logits(ids), before), 1e-7);  // B = 0: unchanged
  EXPECT_FALSE(add_lora(*model_, options).is_ok());             // already attached
}

// Dropout masks drawn in forward are replayed by the recompute: same gradients, which differ
// from dropout-free ones (so dropout did act).
TEST_F(LoraTest, CheckpointingReplaysDropout) {
  LoraOptions options;
  options.dropout = 0.3;
  ASSERT_TRUE(add_lora(*model_, options).is_ok());
  {
    c10::NoGradGuard no_grad;
    for (auto& [name, t] : lora_parameters(*model_))
      if (name.ends_with("lora_B.weight")) t.normal_(0.0, 0.05);
  }
  MicroBatch batch;
  batch.input_ids = at::tensor(std::vector<int64_t>{5, 17, 99, 3, 64, 12, 7, 1, 2}).view({1, 9});
  auto plain = gradients(model_, batch, false);
  auto recomputed = gradients(model_, batch, true);
  for (const auto& [name, g] : plain) EXPECT_LT(max_abs_diff(g, recomputed[name]), 1e-6) << name;
  for (const auto& item : model_->named_modules())
    if (auto lin = std::dynamic_pointer_cast<Linear>(item.value()); lin && lin->lora_A) lin->lora_dropout = 0;
  auto no_dropout = gradients(model_, batch, false);
  const std::string name = "model.layers.1.mlp.down_proj.lora_A.weight";
  EXPECT_GT(max_abs_diff(plain[name], no_dropout[name]), 1e-4);
  EXPECT_FALSE(model_->is_training()) << "the trainer restores eval mode";
}

// Trains adapters a little on every fixture, saves them, and has peft load them (one Python run):
// peft's logits equal ours, and our own load gives them back.
TEST(LoraPeft, SavedAdaptersLoadInPeftWithTheSameLogits) {
  if (fixtures().empty()) GTEST_SKIP() << "KZ_MODEL_FIXTURES is not set (run through ctest)";
  std::vector<std::vector<int64_t>> prompts = {{5, 17, 99, 3, 64, 12, 7}, {101, 2, 33, 45, 8}};
  fs::path root = scratch_dir("peft");
  std::map<std::string, std::vector<at::Tensor>> ours;
  std::string pairs;
  for (std::string name : {"qwen2", "qwen3", "llama"}) {
    auto model = load(fixtures() / name);
    ASSERT_TRUE(model);
    LoraOptions options;
    options.r = 4;
    options.alpha = 12;
    options.seed = 7;
    ASSERT_TRUE(add_lora(*model, options).is_ok());
    TrainOptions train;
    train.lr = 1e-2;
    auto trainer = make_trainer(model, train);
    MicroBatch batch;
    batch.input_ids = at::tensor(prompts[0]).unsqueeze(0);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(trainer->step({batch}, LossOptions{}).ok());
    fs::path dir = root / name;
    ASSERT_TRUE(save_lora(*model, dir, (fixtures() / name).string()).is_ok());
    c10::NoGradGuard no_grad;
    for (const auto& p : prompts) ours[dir.string()].push_back(model->logits(at::tensor(p).unsqueeze(0))->squeeze(0));
    pairs.append(" ").append((fixtures() / name).string()).append(":").append(dir.string());

    auto again = load(fixtures() / name);  // our own loader reads it back
    ASSERT_TRUE(load_lora(*again, dir).is_ok());
    EXPECT_LT(max_abs_diff(*again->logits(at::tensor(prompts[1]).unsqueeze(0)), ours[dir.string()][1].unsqueeze(0)), 1e-6);
  }
  std::ofstream(root / "prompts.json") << json(prompts).dump();
  std::string cmd = std::string(std::getenv("KZ_PYTHON")) + " " + std::getenv("KZ_SOURCE_DIR") +
                    "/model/tests/train_reference.py peft_logits " + (root / "logits.json").string() + " " +
                    (root / "prompts.json").string() + pairs;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  json theirs = read_json(root / "logits.json");
  for (const auto& [dir, logits] : ours) {
    ASSERT_EQ(theirs[dir].size(), logits.size()) << dir;
    for (size_t i = 0; i < logits.size(); ++i) {
      at::Tensor peft = to_tensor(theirs[dir][i], at::kFloat);
      EXPECT_LT(max_abs_diff(peft, logits[i]), 1e-4) << dir << " prompt " << i;
    }
  }
}

// ---- bad adapters ----

class BadAdapterTest : public LoraTest {
 protected:
  // A valid adapter directory to break.
  fs::path saved(const std::string& name, LoraOptions options = {}) {
    options.r = 4;
    auto m = load(fixtures() / "qwen2");
    EXPECT_TRUE(add_lora(*m, options).is_ok());
    fs::path dir = scratch_dir(name);
    EXPECT_TRUE(save_lora(*m, dir).is_ok());
    return dir;
  }
  std::string load_error(const fs::path& dir) {
    Status s = load_lora(*model_, dir);
    EXPECT_FALSE(s.is_ok());
    EXPECT_FALSE(has_lora(*model_)) << "a failed load must leave no adapters";
    return s.message();
  }
};

TEST_F(BadAdapterTest, MissingConfigNamesTheFile) {
  fs::path dir = saved("noconfig");
  fs::remove(dir / "adapter_config.json");
  std::string msg = load_error(dir);
  EXPECT_NE(msg.find("adapter_config.json"), std::string::npos) << msg;
}

TEST_F(BadAdapterTest, WrongRankNamesTheTensorsAndShapes) {
  fs::path dir = saved("wrongrank");
  json config = read_json(dir / "adapter_config.json");
  config["r"] = 8;  // the tensors have rank 4
  ASSERT_TRUE(write_file_atomic(dir / "adapter_config.json", config.dump()).is_ok());
  std::string msg = load_error(dir);
  for (const char* part : {"mis-shaped", "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "[4, 64]", "[8, 64]"})
    EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg;
}

TEST_F(BadAdapterTest, MissingAndUnexpectedTensorsAreNamed) {
  LoraOptions only_q;
  only_q.target_modules = {"q_proj"};
  fs::path dir = saved("missing", only_q);
  json config = read_json(dir / "adapter_config.json");
  config["target_modules"] = {"q_proj", "v_proj"};
  ASSERT_TRUE(write_file_atomic(dir / "adapter_config.json", config.dump()).is_ok());
  std::string msg = load_error(dir);
  EXPECT_NE(msg.find("missing: base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight"), std::string::npos) << msg;
}

TEST_F(BadAdapterTest, UnsupportedFeaturesAreRefused) {
  fs::path dir = saved("dora");
  json config = read_json(dir / "adapter_config.json");
  config["use_dora"] = true;
  ASSERT_TRUE(write_file_atomic(dir / "adapter_config.json", config.dump()).is_ok());
  std::string msg = load_error(dir);
  EXPECT_NE(msg.find("use_dora"), std::string::npos) << msg;
  config["use_dora"] = false;
  config["target_modules"] = {"lm_head"};
  ASSERT_TRUE(write_file_atomic(dir / "adapter_config.json", config.dump()).is_ok());
  msg = load_error(dir);
  EXPECT_NE(msg.find("lm_head"), std::string::npos) << msg;
}

// ---- losses, clipping, schedules, precision ----

class StepTest : public LoraTest {
 protected:
  MicroBatch batch() const {
    MicroBatch b;
    b.input_ids = at::tensor(std::vector<int64_t>{3, 14, 15, 92, 65, 35, 89, 79, 2, 71, 82, 81, 82, 8, 45, 0}).view({2, 8});
    b.attention_mask = at::ones_like(b.input_ids);
    b.attention_mask[1][7] = 0;
    return b;
  }
};

TEST_F(StepTest, ClippingScalesToMaxNorm) {
  TrainOptions options;
  options.max_grad_norm = 0.25;
  auto trainer = make_trainer(model_, options);
  MicroBatch b = batch();
  ASSERT_TRUE(trainer->backward(b, LossOptions{}, step_denominator({b}, LossOptions{})).ok());
  const double before = trainer->grad_norm();
  ASSERT_GT(before, 0.25);
  EXPECT_DOUBLE_EQ(trainer->clip_gradients(), before);
  EXPECT_NEAR(trainer->grad_norm(), 0.25, 1e-5);
  EXPECT_NEAR(trainer->clip_gradients(), 0.25, 1e-5);  // below the limit: unchanged
  EXPECT_NEAR(trainer->grad_norm(), 0.25, 1e-5);
}

TEST_F(StepTest, SftStepsLowerTheLoss) {
  TrainOptions options;
  options.lr = 3e-3;
  options.schedule = LrSchedule::warmup_cosine;
  options.warmup_steps = 2;
  options.total_steps = 12;
  auto trainer = make_trainer(model_, options);
  std::vector<double> losses;
  for (int i = 0; i < 12; ++i) {
    auto s = trainer->step({batch()}, LossOptions{});
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_DOUBLE_EQ(s->lr, learning_rate(options, i));
    EXPECT_EQ(s->tokens, 13);
    losses.push_back(s->loss);
  }
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << losses.front() << " -> " << losses.back();
}

TEST_F(StepTest, Bfloat16KeepsFloat32MasterWeights) {
  LoadOptions bf16;
  bf16.dtype = at::kBFloat16;
  auto model = load(fixtures() / "qwen2", bf16);
  TrainOptions options;
  options.lr = 1e-5;  // below bf16's resolution for weights ~0.15: only the masters move
  auto trainer = make_trainer(model, options);
  const std::string name = "model.layers.0.mlp.up_proj.weight";
  at::Tensor start = trainer->master(name).clone();
  ASSERT_EQ(start.scalar_type(), at::kFloat);
  MicroBatch b = batch();
  // Two micro-batches accumulate in float32.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(trainer->step({b, b}, LossOptions{}).ok());
  at::Tensor master = trainer->master(name);
  at::Tensor param = model->named_parameters()[name];
  EXPECT_EQ(param.scalar_type(), at::kBFloat16);
  EXPECT_GT(max_abs_diff(master, start), 1e-5);
  EXPECT_TRUE(at::equal(param, master.to(at::kBFloat16)));
}

// Without masters, bf16 weights take each step rounded stochastically: at lr 1e-5 (a tenth of
// bf16's resolution at these weights, so rounded to nearest nothing would move) the weights'
// change over 20 steps follows the float32 masters' change, element by element, in expectation:
// the least-squares slope of one against the other is ~1 (measured 0.95; rounded to nearest
// instead, 0.02). Threshold: 1 +- 0.25.
TEST_F(StepTest, Bfloat16WithoutMastersRoundsStochastically) {
  LoadOptions bf16;
  bf16.dtype = at::kBFloat16;
  const std::string name = "model.layers.0.mlp.up_proj.weight";
  auto run = [&](bool masters) {
    auto model = load(fixtures() / "qwen2", bf16);
    TrainOptions options;
    options.lr = 1e-5;
    options.fp32_master_weights = masters;
    auto trainer = make_trainer(model, options);
    at::Tensor start = model->named_parameters()[name].to(at::kFloat);
    for (int i = 0; i < 20; ++i) EXPECT_TRUE(trainer->step({batch()}, LossOptions{}).ok());
    at::Tensor end = masters ? trainer->master(name) : model->named_parameters()[name].to(at::kFloat);
    EXPECT_EQ(model->named_parameters()[name].scalar_type(), at::kBFloat16);
    return end - start;
  };
  at::Tensor exact = run(true), rounded = run(false);
  const double slope = (rounded * exact).sum().item<double>() / (exact * exact).sum().item<double>();
  RecordProperty("slope", fmt::format("{:.3f}", slope));
  EXPECT_GT(exact.abs().max().item<double>(), 1e-4) << "the masters should move (the test's premise)";
  EXPECT_NEAR(slope, 1.0, 0.25) << "bf16 weights without masters do not follow the float32 update";
}

// Two steps, save weights and optimiser state, resume in a fresh model: the third step is the
// same as without the interruption (bf16, so the float32 masters must come back too).
TEST_F(StepTest, ResumedTrainingContinuesExactly) {
  LoadOptions bf16;
  bf16.dtype = at::kBFloat16;
  TrainOptions options;
  options.lr = 1e-3;
  options.weight_decay = 0.01;
  options.schedule = LrSchedule::warmup_cosine;
  options.warmup_steps = 2;
  options.total_steps = 5;
  auto model = load(fixtures() / "qwen2", bf16);
  auto trainer = make_trainer(model, options);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(trainer->step({batch()}, LossOptions{}).ok());
  fs::path dir = scratch_dir("resume");
  ASSERT_TRUE(model->save(dir).is_ok());
  ASSERT_TRUE(trainer->save_state(dir / "trainer").is_ok());
  auto third = trainer->step({batch()}, LossOptions{});
  ASSERT_TRUE(third.ok());

  auto again = load(dir);
  ASSERT_TRUE(again);
  auto resumed = make_trainer(again, options);
  ASSERT_TRUE(resumed->load_state(dir / "trainer").is_ok());
  EXPECT_EQ(resumed->steps_done(), 2);
  auto third_again = resumed->step({batch()}, LossOptions{});
  ASSERT_TRUE(third_again.ok());
  EXPECT_DOUBLE_EQ(third_again->lr, third->lr);
  EXPECT_DOUBLE_EQ(third_again->loss, third->loss);
  for (const auto& name : trainer->parameter_names())
    EXPECT_TRUE(at::equal(trainer->master(name), resumed->master(name))) << name;

  // A LoRA trainer cannot take a full fine-tuning state.
  auto lora_model = load(fixtures() / "qwen2");
  ASSERT_TRUE(add_lora(*lora_model, LoraOptions{}).is_ok());
  auto lora_trainer = make_trainer(lora_model, options);
  Status s = lora_trainer->load_state(dir / "trainer");
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("model.layers.0.self_attn.q_proj.lora_A.weight.exp_avg missing"), std::string::npos) << s.message();
  EXPECT_EQ(lora_trainer->steps_done(), 0);
}

TEST_F(StepTest, PolicyLossesReduceToNllWhereTheyShould) {
  MicroBatch b = batch();
  auto nll = micro_batch_loss(*model_, b, LossOptions{}, 14);
  ASSERT_TRUE(nll.ok()) << nll.status().to_string();
  // Advantage 1 everywhere: -mean(logp), the NLL.
  LossOptions pg;
  pg.kind = TokenLoss::policy_gradient;
  b.advantages = at::ones({2});
  auto pg_loss = micro_batch_loss(*model_, b, pg, 14);
  ASSERT_TRUE(pg_loss.ok()) << pg_loss.status().to_string();
  EXPECT_NEAR(pg_loss->item<double>(), nll->item<double>(), 1e-6);
  // Clipped, on-policy (ratio 1).
  LossOptions clipped;
  clipped.kind = TokenLoss::clipped_policy;
  b.advantages = at::tensor(std::vector<float>{1.5f, -0.5f});
  {
    c10::NoGradGuard no_grad;
    b.old_logprobs = *token_logprobs(*model_, b.input_ids, b.attention_mask, false);
  }
  at::Tensor pg_value = *micro_batch_loss(*model_, b, pg, 14);
  at::Tensor clip_value = *micro_batch_loss(*model_, b, clipped, 14);
  // At ratio 1 the clipped surrogate's value is -sum(A m) / N (the log-probs cancel)...
  EXPECT_NEAR(clip_value.item<double>(), -(1.5 * 7 - 0.5 * 6) / 14, 1e-6);
  // ...and its gradient is policy_gradient's: d ratio = ratio * d logp.
  const at::Tensor& w = model_->layers[0]->mlp->up_proj->weight;
  model_->zero_grad();
  pg_value.backward();
  at::Tensor g_pg = w.grad().clone();
  model_->zero_grad();
  clip_value.backward();
  EXPECT_LT(max_abs_diff(g_pg, w.grad()), 1e-6);
  EXPECT_GT(g_pg.abs().max().item<double>(), 0.0);
}

// The k3 KL penalty: zero with zero gradient against itself, the formula against another policy.
TEST_F(StepTest, KlPenaltyIsK3) {
  MicroBatch b = batch();
  at::Tensor lp;
  {
    c10::NoGradGuard no_grad;
    lp = *token_logprobs(*model_, b.input_ids, b.attention_mask, false);
  }
  LossOptions kl;
  kl.kl_coef = 0.5;
  EXPECT_FALSE(micro_batch_loss(*model_, b, kl, 13).ok());  // needs ref_logprobs
  b.ref_logprobs = lp;
  at::Tensor nll = *micro_batch_loss(*model_, b, LossOptions{}, 13);
  at::Tensor with_kl = *micro_batch_loss(*model_, b, kl, 13);
  EXPECT_NEAR(with_kl.item<double>(), nll.item<double>(), 1e-6);
  const at::Tensor& w = model_->layers[1]->self_attn->v_proj->weight;
  model_->zero_grad();
  nll.backward();
  at::Tensor g = w.grad().clone();
  model_->zero_grad();
  with_kl.backward();
  EXPECT_LT(max_abs_diff(g, w.grad()), 1e-6);
  b.ref_logprobs = lp - 0.3;  // log(p_ref / p) = -0.3 on every token
  double k3 = std::exp(-0.3) + 0.3 - 1.0;
  EXPECT_NEAR(micro_batch_loss(*model_, b, kl, 13)->item<double>(), nll.item<double>() + 0.5 * k3, 1e-6);
  // Far from the reference the term is bounded (verl's clamps): finite, at most 10 a token.
  b.ref_logprobs = lp + 200.0;
  EXPECT_NEAR(micro_batch_loss(*model_, b, kl, 13)->item<double>(), nll.item<double>() + 0.5 * 10.0, 1e-4);
  b.ref_logprobs = lp - 200.0;  // exp(-20) + 20 - 1, clamped to 10
  EXPECT_NEAR(micro_batch_loss(*model_, b, kl, 13)->item<double>(), nll.item<double>() + 0.5 * 10.0, 1e-4);
}

// At a sampling temperature T the policy is softmax(logits / T): token_logprobs and the losses use
// it, so old log-probs scored at T leave the clipped surrogate on-policy (ratio 1), and the NLL at T
// is the mean of -log softmax(logits / T) at the targets.
TEST_F(StepTest, ATemperatureScalesTheLogitsOfEveryLogProb) {
  MicroBatch b = batch();
  c10::NoGradGuard no_grad;
  at::Tensor logits = model_->logits(b.input_ids, b.attention_mask)->narrow(1, 0, 7).to(at::kFloat);
  at::Tensor targets = b.input_ids.narrow(1, 1, 7);
  at::Tensor want = at::log_softmax(logits / 0.7, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1);
  want[1][6] = 0.0;  // a pad target
  at::Tensor at_07 = *token_logprobs(*model_, b.input_ids, b.attention_mask, false, 0.7);
  EXPECT_LT(max_abs_diff(at_07, want), 1e-5);
  at::Tensor at_1 = *token_logprobs(*model_, b.input_ids, b.attention_mask, false);
  EXPECT_GT(max_abs_diff(at_07, at_1), 1e-3) << "the temperature changed nothing";
  EXPECT_FALSE(token_logprobs(*model_, b.input_ids, b.attention_mask, false, 0.0).ok());

  LossOptions nll;
  nll.temperature = 0.7;
  EXPECT_NEAR(micro_batch_loss(*model_, b, nll, 13)->item<double>(), -want.sum().item<double>() / 13, 1e-5);
  LossOptions clipped = nll;
  clipped.kind = TokenLoss::clipped_policy;
  b.advantages = at::tensor(std::vector<float>{1.0f, -1.0f});
  b.old_logprobs = at_07;
  LossStats on_policy;
  micro_batch_loss(*model_, b, clipped, 13, &on_policy);
  EXPECT_EQ(on_policy.clipped, 0.0);
  EXPECT_LT(std::abs(on_policy.kl), 1e-9) << "old log-probs at the same temperature: ratio 1";
  b.old_logprobs = at_1;  // scored at temperature 1: not the sampling policy's
  LossStats off_policy;
  micro_batch_loss(*model_, b, clipped, 13, &off_policy);
  EXPECT_GT(std::abs(off_policy.kl), 1e-4);
  LossOptions bad;
  bad.temperature = 0.0;
  EXPECT_FALSE(bad.validate().is_ok());
}

TEST_F(StepTest, SequenceMeanAveragesEachSequenceFirst) {
  MicroBatch b = batch();
  LossOptions seq;
  seq.reduction = LossReduction::sequence_mean;
  EXPECT_EQ(step_denominator({b, b}, seq), 4.0);
  EXPECT_EQ(step_denominator({b, b}, LossOptions{}), 26.0);
  auto value = micro_batch_loss(*model_, b, seq, step_denominator({b}, seq));
  ASSERT_TRUE(value.ok()) << value.status().to_string();
  c10::NoGradGuard no_grad;
  at::Tensor lp = *token_logprobs(*model_, b.input_ids, b.attention_mask, false);
  double want = 0.5 * (-lp[0].sum().item<double>() / 7 - lp[1].narrow(0, 0, 6).sum().item<double>() / 6);
  EXPECT_NEAR(value->item<double>(), want, 1e-5);
}

TEST_F(StepTest, BadBatchesAndOptionsAreErrors) {
  auto trainer = make_trainer(model_, TrainOptions{});
  MicroBatch b = batch();
  b.loss_mask = at::ones({2, 8});
  auto s = trainer->step({b}, LossOptions{});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("loss_mask has shape [2, 8], expected [2, 7]"), std::string::npos) << s.status().message();
  LossOptions pg;
  pg.kind = TokenLoss::policy_gradient;
  s = trainer->step({batch()}, pg);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("advantages"), std::string::npos) << s.status().message();
  TrainOptions bad;
  bad.schedule = LrSchedule::warmup_cosine;
  bad.warmup_steps = 10;
  bad.total_steps = 5;
  EXPECT_FALSE(Trainer::create(model_, bad).ok());
  EXPECT_TRUE(parse_token_loss("clipped_policy").ok());
  EXPECT_FALSE(parse_token_loss("ppo").ok());
  for (auto& p : model_->parameters()) p.set_requires_grad(false);
  EXPECT_FALSE(Trainer::create(model_, TrainOptions{}).ok());
}

TEST_F(StepTest, NonFiniteGradientsSkipTheUpdate) {
  auto trainer = make_trainer(model_, TrainOptions{});
  at::Tensor up = model_->layers[1]->mlp->up_proj->weight;
  at::Tensor before = up.detach().clone();
  {
    c10::NoGradGuard no_grad;
    model_->layers[0]->input_layernorm->weight[3] = std::nan("");
  }
  auto s = trainer->step({batch()}, LossOptions{});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("update skipped"), std::string::npos) << s.status().message();
  EXPECT_TRUE(at::equal(up, before));
  EXPECT_EQ(trainer->steps_done(), 0);
}

// seq_mean_token_sum: each sequence's token losses summed, then the mean over sequences.
TEST_F(StepTest, SeqMeanTokenSumSumsEachSequenceThenAverages) {
  MicroBatch b = batch();
  LossOptions seq;
  seq.reduction = LossReduction::seq_mean_token_sum;
  ASSERT_EQ(*parse_loss_reduction("seq_mean_token_sum"), LossReduction::seq_mean_token_sum);
  EXPECT_STREQ(loss_reduction_name(LossReduction::seq_mean_token_sum), "seq_mean_token_sum");
  EXPECT_EQ(step_denominator({b, b}, seq), 4.0);
  auto value = micro_batch_loss(*model_, b, seq, step_denominator({b}, seq));
  ASSERT_TRUE(value.ok()) << value.status().to_string();
  c10::NoGradGuard no_grad;
  at::Tensor lp = *token_logprobs(*model_, b.input_ids, b.attention_mask, false);
  double want = 0.5 * (-lp[0].sum().item<double>() - lp[1].narrow(0, 0, 6).sum().item<double>());
  EXPECT_NEAR(value->item<double>(), want, 1e-5);
}

// The statistics of a step on the fixture model: on-policy (old = current log-probs) nothing is
// clipped and the KL is 0; the entropy is the masked mean of token_entropy over the logits.
TEST_F(StepTest, StepStatisticsOnPolicy) {
  MicroBatch b = batch();
  b.loss_mask = at::ones({2, 7});
  b.loss_mask[0][0] = 0;  // 12 trained targets: 6 in row 0, 6 in row 1 (its last is a pad)
  b.advantages = at::tensor(std::vector<float>{1.0f, -1.0f});
  at::Tensor want_entropy;
  {
    c10::NoGradGuard no_grad;
    b.old_logprobs = *token_logprobs(*model_, b.input_ids, b.attention_mask, false);
    at::Tensor h = token_entropy(model_->logits(b.input_ids, b.attention_mask)->narrow(1, 0, 7));
    want_entropy = (h * target_mask(b)).sum() / 12.0;
  }
  LossOptions clipped;
  clipped.kind = TokenLoss::clipped_policy;
  TrainOptions options;
  options.lr = 1e-2;
  auto trainer = make_trainer(model_, options);
  auto s = trainer->step({b}, clipped);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->tokens, 12);
  EXPECT_EQ(s->clip_fraction, 0.0);
  EXPECT_LT(s->approx_kl, 1e-10);
  EXPECT_NEAR(s->entropy, want_entropy.item<double>(), 1e-5);
  EXPECT_GT(s->entropy, 0.1);
  // After an update with a large learning rate, the same batch sees moved ratios.
  auto again = trainer->step({b}, clipped);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_GT(again->approx_kl, 1e-6);
  EXPECT_GT(again->clip_fraction, 0.0);
}

// Two sequences, three targets each, with made-up log-probs so every ratio is known.
//   row 0, A = +1: targets r = 1 (loss-masked: a prompt token), 1.5, 0.5
//   row 1, A = -2: targets r = 0.7, 1.1, and a pad
// Clip range [0.8, 1.28]. The clipped term is taken where clip(r) A < r A:
//   r = 1.5, A > 0: 1.28 < 1.5   -> clipped, loss -1.28
//   r = 0.5, A > 0: 0.8 > 0.5    -> not,     loss -0.5
//   r = 0.7, A < 0: -1.6 < -1.4  -> clipped, loss  1.6
//   r = 1.1, A < 0: inside       -> not,     loss  2.2
// clip_fraction 2/4; losses sum 2.02: token_mean 2.02 / 4, seq_mean_token_sum 2.02 / 2;
// approx_kl = mean of (r - 1) - ln r = (0.0945349 + 0.1931472 + 0.0566749 + 0.0046898) / 4.
TEST(LossStatistics, ClipFractionKlAndEntropyByHand) {
  MicroBatch b;
  b.input_ids = at::tensor(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 0}).view({2, 4});
  b.attention_mask = at::tensor(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 0}).view({2, 4});
  b.loss_mask = at::tensor(std::vector<float>{0, 1, 1, 1, 1, 1}).view({2, 3});
  b.advantages = at::tensor(std::vector<float>{1.0f, -2.0f});
  at::Tensor lp = at::tensor(std::vector<float>{-1.0f, -1.0f, -2.0f, -0.5f, -1.5f, 0.0f}).view({2, 3});
  const std::vector<double> ratios = {1.0, 1.5, 0.5, 0.7, 1.1, 1.0};
  std::vector<float> log_r;
  for (double r : ratios) log_r.push_back(static_cast<float>(std::log(r)));
  b.old_logprobs = lp - at::tensor(log_r).view({2, 3});
  at::Tensor entropy = at::tensor(std::vector<float>{9, 1, 2, 3, 5, 100}).view({2, 3});
  LossOptions clipped;
  clipped.kind = TokenLoss::clipped_policy;
  ASSERT_TRUE(validate_micro_batch(b, clipped).is_ok());

  LossStats stats;
  at::Tensor value = reduce_token_losses(lp, entropy, b, clipped, step_denominator({b}, clipped), &stats);
  EXPECT_NEAR(value.item<double>(), 2.02 / 4, 1e-6);
  EXPECT_EQ(stats.tokens, 4);
  EXPECT_EQ(stats.clipped, 2);
  EXPECT_DOUBLE_EQ(stats.clip_fraction(), 0.5);
  double kl = 0;
  for (double r : {1.5, 0.5, 0.7, 1.1}) kl += (r - 1) - std::log(r);
  EXPECT_NEAR(kl / 4, (0.0945349 + 0.1931472 + 0.0566749 + 0.0046898) / 4, 1e-6);
  EXPECT_NEAR(stats.approx_kl(), kl / 4, 1e-6);
  EXPECT_NEAR(stats.mean_entropy(), (1 + 2 + 3 + 5) / 4.0, 1e-6);

  LossOptions seq = clipped;
  seq.reduction = LossReduction::seq_mean_token_sum;
  EXPECT_EQ(step_denominator({b}, seq), 2.0);
  EXPECT_NEAR(reduce_token_losses(lp, {}, b, seq, 2.0).item<double>(), 2.02 / 2, 1e-6);

  // Zero advantages never clip.
  b.advantages = at::zeros({2});
  LossStats none;
  reduce_token_losses(lp, entropy, b, clipped, 4.0, &none);
  EXPECT_EQ(none.clipped, 0);
  EXPECT_NEAR(none.approx_kl(), kl / 4, 1e-6);  // the KL does not depend on advantages

  // Per-token advantages: only row 1's first target keeps a negative advantage.
  b.advantages = at::tensor(std::vector<float>{0, 0, 0, -1, 0, 0}).view({2, 3});
  LossStats one;
  reduce_token_losses(lp, {}, b, clipped, 4.0, &one);
  EXPECT_EQ(one.clipped, 1);
  EXPECT_EQ(one.entropy, 0);  // no entropies given

  // Without old log-probs (nll, policy_gradient) there is no ratio: no KL and nothing clipped.
  b.old_logprobs = at::Tensor();
  LossStats nll;
  reduce_token_losses(lp, entropy, b, LossOptions{}, 4.0, &nll);
  EXPECT_EQ(nll.clipped, 0);
  EXPECT_EQ(nll.kl_tokens, 0);
  EXPECT_EQ(nll.approx_kl(), 0);
  EXPECT_NEAR(nll.mean_entropy(), 2.75, 1e-6);
}

TEST(LossStatistics, TokenEntropy) {
  // Uniform over 8: ln 8. p = (1/4, 3/4): 0.5623351. A -inf logit adds nothing (0 log 0 = 0).
  EXPECT_NEAR(token_entropy(at::zeros({1, 8})).item<double>(), std::log(8.0), 1e-6);
  at::Tensor two = at::tensor(std::vector<float>{0.0f, std::log(3.0f)});
  EXPECT_NEAR(token_entropy(two).item<double>(), 0.5623351, 1e-6);
  at::Tensor masked = at::tensor(std::vector<float>{0.0f, std::log(3.0f), -INFINITY});
  EXPECT_NEAR(token_entropy(masked).item<double>(), 0.5623351, 1e-6);
  // Chunked (one row at a time) equals one chunk, and keeps the leading shape; bf16 logits work.
  at::manual_seed(3);
  at::Tensor logits = at::randn({3, 5, 7}) * 3;
  at::Tensor whole = token_entropy(logits);
  EXPECT_EQ(whole.sizes().vec(), (std::vector<int64_t>{3, 5}));
  EXPECT_LT(max_abs_diff(token_entropy(logits, 1), whole), 1e-6);
  at::Tensor direct = -(at::softmax(logits, -1) * at::log_softmax(logits, -1)).sum(-1);
  EXPECT_LT(max_abs_diff(whole, direct), 1e-5);
  EXPECT_LT(max_abs_diff(token_entropy(logits.to(at::kBFloat16)), whole), 0.05);
  EXPECT_FALSE(token_entropy(logits.requires_grad_()).requires_grad());
}

TEST(Schedule, WarmupThenCosine) {
  TrainOptions o;
  o.lr = 1.0;
  o.schedule = LrSchedule::warmup_cosine;
  o.warmup_steps = 4;
  o.total_steps = 14;
  o.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(learning_rate(o, 0), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(o, 3), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(o, 4), 1.0);
  EXPECT_NEAR(learning_rate(o, 9), 0.55, 1e-12);  // half way: (1 + 0.1) / 2
  EXPECT_NEAR(learning_rate(o, 14), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(o, 20), 0.1, 1e-12);
  o.schedule = LrSchedule::constant;
  EXPECT_DOUBLE_EQ(learning_rate(o, 100), 1.0);
}

}  // namespace
}  // namespace kz::model
