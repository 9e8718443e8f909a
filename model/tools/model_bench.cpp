// kz_model_bench: throughput of the libtorch engine on one checkpoint, as JSON (bench/model_bench.py
// sets it beside transformers on the same checkpoint).
//
//   kz_model_bench --model DIR [--device cuda:0] [--batches 1,16,64] [--prompt 512] [--new 256]
//                  [--prefill-batch 8] [--prefill-len 2048] [--no-graph] [--no-inference]
//                  [--train lora,full] [--train-batch 4] [--train-len 1024] [--train-steps 5]
//                  [--no-train-checkpointing] [--no-train-masters]
//                  [--rollout] [--rollout-prompts 64] [--rollout-samples 8] [--rollout-prompt 512]
//                  [--rollout-new 1024] [--rollout-temperature 1] [--rollout-max-rows 0]
//                  [--rollout-seed 0] [--out FILE]
//
// Phases, each with the peak CUDA memory the caching allocator saw during it (weights included):
//  - prefill: prefill-batch x prefill-len random tokens into a KV cache, one warm-up then timed
//    repeats; tokens/s = prompt tokens / s.
//  - decode at each batch size: random prompts of `prompt` tokens, greedy, eos ignored, `new` new
//    tokens. After a warm-up generation (and the CUDA graph capture), one timed generation:
//    decode tokens/s = batch x (new - 1) / time of the decode steps (the first new token comes
//    from the prefill logits); end-to-end tokens/s = batch x new / (prefill + decode time). Then
//    the same prompt is decoded eagerly for a few steps and compared with the graph's tokens.
//  - train_lora / train_full (--train, in the order given, after the others): optimiser steps of
//    the Trainer (train.h) on one batch of train-batch x train-len random ids, token-mean NLL,
//    AdamW (lr 1e-5, no weight decay, grad-norm clip 1), activation checkpointing unless
//    --no-train-checkpointing. lora: fresh adapters (r 16, alpha 32, float32) on every projection,
//    base frozen, removed afterwards; full: every parameter, float32 masters, gradients and
//    moments for a bf16 model (it changes the weights: later phases see trained ones). One warm-up
//    step, then train-steps timed ones: tokens/s = batch x len x steps / time.
//  - rollout (--rollout, after decode, before training): a GRPO-style rollout through generate(),
//    the serving path (continuous batching, CUDA graphs): rollout-prompts distinct random prompts
//    of rollout-prompt tokens, each sampled rollout-samples times (own seed per sample) at
//    rollout-temperature, no stop tokens, each request's max_new_tokens drawn uniformly from
//    [rollout-new / 8, rollout-new]. After an untimed warm-up generate() of one prompt's samples
//    (at most 32 new tokens each), one timed call: tokens/s = the requests' own new tokens / wall
//    time of the call (prefill and graph captures included). The work (prompts, limits) goes to
//    the JSON's "rollout_work" so that bench/model_bench.py gives transformers the same.
// A failing phase (out of memory, say) is reported in its JSON entry ("error"), its memory is
// released and the others still run.
#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/cuda.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "kz/model/decode_loop.h"
#include "kz/model/generate.h"
#include "kz/model/lora.h"
#include "kz/model/train.h"
#include "kz/model/transformer.h"

namespace {

using json = nlohmann::json;
using kz::model::CausalLM;

struct BenchOptions {
  std::string model_dir;
  std::string device = "cuda:0";
  std::vector<int64_t> batches{1, 16, 64};
  int64_t prompt_tokens = 512;
  int64_t new_tokens = 256;
  int64_t prefill_batch = 8;
  int64_t prefill_tokens = 2048;
  int64_t prefill_repeats = 3;
  int64_t check_steps = 16;  // eager steps compared with the graph's tokens
  bool cuda_graph = true;
  double temperature = 0;    // decode: 0 greedy, else sampled at this temperature (per-row seeds)
  bool inference = true;     // the prefill and decode phases
  std::vector<std::string> train;  // training phases to run, in order: "lora", "full"
  int64_t train_batch = 4;
  int64_t train_tokens = 1024;
  int64_t train_steps = 5;   // timed, after one warm-up step
  bool train_checkpointing = true;
  bool train_masters = true;  // float32 masters and moments for bf16 weights (train.h)
  bool rollout = false;
  int64_t rollout_prompts = 64;
  int64_t rollout_samples = 8;     // samples per prompt (a GRPO group)
  int64_t rollout_prompt_tokens = 512;
  int64_t rollout_new_tokens = 1024;  // the most new tokens of a request
  double rollout_temperature = 1.0;
  int64_t rollout_max_rows = 0;    // generate()'s max_batch_rows; 0: every request at once
  uint64_t rollout_seed = 0;
  std::string out = "-";     // JSON destination; "-" = stdout
};

// ---- device helpers: no-ops on the CPU ----

void sync(at::Device d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

c10::DeviceAllocator* cuda_allocator() {
  return c10::getDeviceAllocator(c10::DeviceType::CUDA);
}

void reset_peak(at::Device d) {
  if (d.is_cuda()) cuda_allocator()->resetPeakStats(d.index());
}

// Hands the caching allocator's free blocks back to the driver, so a phase that ran out of memory
// leaves none of its fragments to the next one.
void release_cached(at::Device d) {
  if (d.is_cuda()) cuda_allocator()->emptyCache();
}

json peak_bytes(at::Device d) {  // null on the CPU
  if (!d.is_cuda()) return nullptr;
  auto stats = cuda_allocator()->getDeviceStats(d.index());
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

template <class T>
T value_or_throw(kz::Result<T> r) {
  if (!r.ok()) throw std::runtime_error(r.status().to_string());
  return std::move(*r);
}

void ok_or_throw(const kz::Status& s) {
  if (!s.is_ok()) throw std::runtime_error(s.to_string());
}

std::vector<int64_t> to_ids(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

at::Tensor random_prompts(const CausalLM& model, int64_t batch, int64_t tokens) {
  return at::randint(0, model.config().vocab_size, {batch, tokens},
                     at::TensorOptions().dtype(at::kLong).device(model.device()));
}

// ---- phases ----

json bench_prefill(CausalLM& model, const BenchOptions& o) {
  const at::Device dev = model.device();
  reset_peak(dev);
  kz::model::KVCache cache = model.new_cache(o.prefill_batch, o.prefill_tokens);
  at::Tensor ids = random_prompts(model, o.prefill_batch, o.prefill_tokens);
  auto once = [&] {
    cache.reset();
    value_or_throw(model.prefill(ids, {}, cache));
  };
  once();  // warm-up
  sync(dev);
  auto start = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < o.prefill_repeats; ++r) once();
  sync(dev);
  double s = seconds_since(start);
  return {{"phase", "prefill"}, {"batch", o.prefill_batch}, {"tokens", o.prefill_tokens},
          {"repeats", o.prefill_repeats}, {"seconds", s},
          {"tokens_per_s", static_cast<double>(o.prefill_batch * o.prefill_tokens * o.prefill_repeats) / s},
          {"peak_bytes", peak_bytes(dev)}};
}

// Prefills `ids` into the emptied cache and returns each row's first new token (argmax).
at::Tensor prefill_first(CausalLM& model, kz::model::KVCache& cache, const at::Tensor& ids) {
  cache.reset();
  return value_or_throw(model.prefill(ids, {}, cache)).argmax(-1);
}

// The decode phases' token choice: greedy, or sampled at o.temperature with row i seeded i.
kz::model::Sampler make_sampler(const BenchOptions& o, int64_t batch, at::Device device) {
  if (o.temperature == 0) return kz::model::Sampler::greedy(batch, device);
  std::vector<kz::model::SamplingOptions> rows(static_cast<size_t>(batch));
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].temperature = o.temperature;
    rows[i].seed = i;
  }
  return kz::model::Sampler(rows, device);
}

// Fraction of the first `steps` tokens where an eager decode of the same prompt, its sampler at
// the same draw (`draws`), agrees with `tokens` [B, >= steps] (bf16 kernels may differ slightly;
// a broken graph gives ~0).
double eager_agreement(CausalLM& model, kz::model::KVCache& cache, const BenchOptions& o, const at::Tensor& ids,
                       const at::Tensor& tokens, const at::Tensor& draws, int64_t steps) {
  at::Tensor first = prefill_first(model, cache, ids);
  auto eager = value_or_throw(
      kz::model::DecodeLoop::create(model, cache, make_sampler(o, ids.size(0), model.device()), {.cuda_graph = false}));
  eager->sampler().step().copy_(draws);
  at::Tensor got = value_or_throw(eager->run(first, steps)).tokens;
  return got.eq(tokens.narrow(1, 0, steps)).to(at::kDouble).mean().item<double>();
}

json bench_decode(CausalLM& model, const BenchOptions& o, int64_t batch, json* sample) {
  const at::Device dev = model.device();
  reset_peak(dev);
  const int64_t steps = o.new_tokens - 1;  // the first new token comes from the prefill
  kz::model::KVCache cache = model.new_cache(batch, o.prompt_tokens + o.new_tokens);
  at::Tensor ids = random_prompts(model, batch, o.prompt_tokens);
  at::Tensor first = prefill_first(model, cache, ids);
  auto loop = value_or_throw(
      kz::model::DecodeLoop::create(model, cache, make_sampler(o, batch, dev), {.cuda_graph = o.cuda_graph}));
  value_or_throw(loop->run(first, std::min<int64_t>(8, steps)));  // warm-up after the capture
  sync(dev);

  auto start = std::chrono::steady_clock::now();
  first = prefill_first(model, cache, ids);
  sync(dev);
  double prefill_s = seconds_since(start);
  auto decode_start = std::chrono::steady_clock::now();
  at::Tensor draws = loop->sampler().step().clone();
  kz::model::DecodedTokens out = value_or_throw(loop->run(first, steps));
  sync(dev);
  double decode_s = seconds_since(decode_start);

  json r = {{"phase", "decode"}, {"batch", batch}, {"prompt_tokens", o.prompt_tokens},
            {"new_tokens", o.new_tokens}, {"timed_steps", steps}, {"prefill_seconds", prefill_s},
            {"decode_seconds", decode_s}, {"tokens_per_s", static_cast<double>(batch * steps) / decode_s},
            {"e2e_tokens_per_s", static_cast<double>(batch * o.new_tokens) / (prefill_s + decode_s)},
            {"cuda_graph", loop->uses_graph()}, {"graph_error", loop->graph_error()},
            {"capture_seconds", loop->capture_s()}, {"peak_bytes", peak_bytes(dev)}};
  at::Tensor all = at::cat({first.unsqueeze(1), out.tokens}, 1);
  r["tokens_in_vocab"] = all.min().item<int64_t>() >= 0 && all.max().item<int64_t>() < model.config().vocab_size;
  int64_t check = std::min(o.check_steps, steps);
  r["temperature"] = o.temperature;
  r["eager_agreement"] = eager_agreement(model, cache, o, ids, out.tokens, draws, check);
  r["eager_agreement_steps"] = check;
  if (batch == 1 && sample) *sample = {{"prompt", to_ids(ids[0])}, {"tokens", to_ids(all[0])}};
  return r;
}

// The rollout's requests, drawn from o.rollout_seed: prompt p's samples are requests p x samples ..
// (p + 1) x samples - 1. A random-init model emits no meaningful end-of-sequence token, so the
// lengths of a real rollout, which vary because sequences stop, are imitated by per-request limits.
std::vector<kz::model::GenerateRequest> rollout_requests(const CausalLM& model, const BenchOptions& o) {
  std::mt19937_64 rng(o.rollout_seed);
  std::uniform_int_distribution<int64_t> token(0, model.config().vocab_size - 1);
  std::uniform_int_distribution<int64_t> limit(std::max<int64_t>(1, o.rollout_new_tokens / 8), o.rollout_new_tokens);
  std::vector<kz::model::GenerateRequest> requests;
  for (int64_t p = 0; p < o.rollout_prompts; ++p) {
    std::vector<int64_t> prompt(static_cast<size_t>(o.rollout_prompt_tokens));
    for (int64_t& id : prompt) id = token(rng);
    for (int64_t g = 0; g < o.rollout_samples; ++g) {
      kz::model::GenerateRequest r;
      r.prompt_ids = prompt;
      r.sampling.temperature = o.rollout_temperature;
      r.sampling.seed = rng();
      r.sampling.max_new_tokens = limit(rng);
      requests.push_back(std::move(r));
    }
  }
  return requests;
}

// The prompts (one per group of samples) and every request's limit.
json rollout_work(const std::vector<kz::model::GenerateRequest>& requests, int64_t samples) {
  json prompts = json::array(), limits = json::array();
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i % static_cast<size_t>(samples) == 0) prompts.push_back(requests[i].prompt_ids);
    limits.push_back(requests[i].sampling.max_new_tokens);
  }
  return {{"prompts", prompts}, {"max_new_tokens", limits}};
}

// One prompt's samples with short limits: kernels, allocator and graph paths warmed, little time.
std::vector<kz::model::GenerateRequest> rollout_warmup(const std::vector<kz::model::GenerateRequest>& requests,
                                                       int64_t samples) {
  std::vector<kz::model::GenerateRequest> warm(requests.begin(),
                                               requests.begin() + std::min<int64_t>(samples, requests.size()));
  for (auto& r : warm) r.sampling.max_new_tokens = std::min<int64_t>(r.sampling.max_new_tokens, 32);
  return warm;
}

json stats_json(const kz::model::GenerateStats& s) {
  return {{"peak_rows", s.peak_rows}, {"joins", s.joins}, {"compactions", s.compactions}, {"shrinks", s.shrinks},
          {"prefilled_prompts", s.prefilled_prompts}, {"decode_row_steps", s.decode_row_steps},
          {"grows", s.grows},           {"admitted", s.admitted}};
}

// Fills *work with the requests' prompts and limits before anything runs, so that transformers
// gets the same work even when this phase fails.
json bench_rollout(CausalLM& model, const BenchOptions& o, json* work) {
  const at::Device dev = model.device();
  const std::vector<kz::model::GenerateRequest> requests = rollout_requests(model, o);
  *work = rollout_work(requests, o.rollout_samples);
  kz::model::GenerateOptions options;
  options.cuda_graph = o.cuda_graph;
  options.max_batch_rows = o.rollout_max_rows;
  value_or_throw(kz::model::generate(model, rollout_warmup(requests, o.rollout_samples), options));
  sync(dev);
  reset_peak(dev);
  kz::model::GenerateStats stats;
  options.stats = &stats;
  auto start = std::chrono::steady_clock::now();
  const auto results = value_or_throw(kz::model::generate(model, requests, options));
  sync(dev);
  const double seconds = seconds_since(start);
  int64_t generated = 0, requested = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    generated += static_cast<int64_t>(results[i].token_ids.size());
    requested += requests[i].sampling.max_new_tokens;
  }
  return {{"phase", "rollout"}, {"batch", static_cast<int64_t>(requests.size())},
          {"prompts", o.rollout_prompts}, {"samples", o.rollout_samples},
          {"prompt_tokens", o.rollout_prompt_tokens}, {"max_new_tokens", o.rollout_new_tokens},
          {"temperature", o.rollout_temperature}, {"max_batch_rows", o.rollout_max_rows},
          {"seconds", seconds}, {"generated_tokens", generated}, {"requested_tokens", requested},
          {"tokens_per_s", static_cast<double>(generated) / seconds}, {"stats", stats_json(stats)},
          {"peak_bytes", peak_bytes(dev)}};
}

// The adapter the benchmark trains, spelled out (not the library's defaults) because
// bench/model_bench.py gives peft the same one.
kz::model::LoraOptions bench_lora() {
  kz::model::LoraOptions lora;
  lora.r = 16;
  lora.alpha = 32;
  lora.target_modules = kz::model::lora_target_names();
  return lora;
}

// Undoes a training phase's set-up, also when a step throws (out of memory): adapters removed,
// gradients dropped, checkpointing off, cached blocks released (the full phase's weight updates
// stay). Declared before the Trainer so that the Trainer's masters and moments are freed first.
class TrainingPhaseCleanup {
 public:
  explicit TrainingPhaseCleanup(CausalLM& model) : model_(model) {}
  ~TrainingPhaseCleanup() {
    if (kz::model::has_lora(model_)) kz::model::remove_lora(model_);
    for (auto& p : model_.parameters()) p.mutable_grad() = at::Tensor();
    model_.activation_checkpointing = false;
    release_cached(model_.device());
  }
  TrainingPhaseCleanup(const TrainingPhaseCleanup&) = delete;
  TrainingPhaseCleanup& operator=(const TrainingPhaseCleanup&) = delete;

 private:
  CausalLM& model_;
};

int64_t trainable_parameters(const CausalLM& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters())
    if (p.requires_grad()) n += p.numel();
  return n;
}

// `mode` "lora" or "full": one warm-up optimiser step, then o.train_steps timed ones on the same
// batch of random ids.
json bench_train(const std::shared_ptr<CausalLM>& model, const BenchOptions& o, const std::string& mode) {
  const at::Device dev = model->device();
  reset_peak(dev);
  TrainingPhaseCleanup cleanup(*model);
  if (mode == "lora") ok_or_throw(kz::model::add_lora(*model, bench_lora()));
  kz::model::TrainOptions options;  // AdamW lr 1e-5, no weight decay, clip 1
  options.activation_checkpointing = o.train_checkpointing;
  options.fp32_master_weights = o.train_masters;
  const int64_t trained = trainable_parameters(*model);
  auto trainer = value_or_throw(kz::model::Trainer::create(model, options));
  std::vector<kz::model::MicroBatch> batch(1);  // the whole batch in one micro-batch, every token trained
  batch[0].input_ids = random_prompts(*model, o.train_batch, o.train_tokens);
  const kz::model::LossOptions nll;  // token-mean NLL: transformers' causal-LM cross-entropy
  const double first_loss = value_or_throw(trainer->step(batch, nll)).loss;
  sync(dev);
  auto start = std::chrono::steady_clock::now();
  double last_loss = first_loss;
  for (int64_t s = 0; s < o.train_steps; ++s) last_loss = value_or_throw(trainer->step(batch, nll)).loss;
  sync(dev);
  const double seconds = seconds_since(start);
  const auto tokens = static_cast<double>(o.train_batch * o.train_tokens * o.train_steps);
  return {{"phase", "train_" + mode}, {"batch", o.train_batch}, {"tokens", o.train_tokens},
          {"timed_steps", o.train_steps}, {"seconds", seconds},
          {"step_seconds", seconds / static_cast<double>(o.train_steps)}, {"tokens_per_s", tokens / seconds},
          {"first_loss", first_loss}, {"last_loss", last_loss}, {"trained_parameters", trained},
          {"activation_checkpointing", o.train_checkpointing}, {"fp32_master_weights", o.train_masters},
          {"peak_bytes", peak_bytes(dev)}};
}

json phase_error(const std::string& phase, int64_t batch, const std::string& error) {
  std::cerr << "kz_model_bench: " << phase << " (batch " << batch << ") failed: " << error << "\n";
  return {{"phase", phase}, {"batch", batch}, {"error", error}};
}

// Runs one phase, turning an exception into {"phase", "error"} so the others still run. libtorch's
// own errors (an allocation outside the Trainer, say) are reported without their C++ backtrace.
template <class F>
json guarded_phase(const std::string& phase, int64_t batch, F&& f) {
  try {
    return f();
  } catch (const c10::Error& e) {
    return phase_error(phase, batch, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return phase_error(phase, batch, e.what());
  }
}

int64_t parameter_bytes(const CausalLM& model) {
  int64_t bytes = 0;
  for (const auto& p : model.parameters()) bytes += static_cast<int64_t>(p.nbytes());
  return bytes;
}

json run(const BenchOptions& o) {
  at::Device dev(o.device);
  auto start = std::chrono::steady_clock::now();
  kz::model::LoadOptions load;
  load.device = dev;
  auto model = value_or_throw(CausalLM::load(o.model_dir, load));
  sync(dev);
  json result = {{"framework", "kz"}, {"device", o.device}, {"dtype", c10::toString(model->dtype())},
                 {"weight_bytes", parameter_bytes(*model)}, {"load_seconds", seconds_since(start)},
                 {"cuda_graph_requested", o.cuda_graph}};
  json phases = json::array();
  json sample;
  if (o.inference) {
    phases.push_back(guarded_phase("prefill", o.prefill_batch, [&] { return bench_prefill(*model, o); }));
    for (int64_t b : o.batches)
      phases.push_back(guarded_phase("decode", b, [&] { return bench_decode(*model, o, b, &sample); }));
  }
  if (o.rollout) {
    json work;
    const int64_t requests = o.rollout_prompts * o.rollout_samples;
    phases.push_back(guarded_phase("rollout", requests, [&] { return bench_rollout(*model, o, &work); }));
    result["rollout_work"] = work;
  }
  for (const std::string& mode : o.train)
    phases.push_back(guarded_phase("train_" + mode, o.train_batch, [&] { return bench_train(model, o, mode); }));
  result["phases"] = phases;
  result["sample"] = sample;
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  BenchOptions o;
  CLI::App app{"Prefill, decode, rollout and training throughput of the libtorch engine (JSON)"};
  app.add_option("--model", o.model_dir, "checkpoint directory (config.json + safetensors)")->required();
  app.add_option("--device", o.device, "cuda:0, cpu, ...");
  app.add_option("--batches", o.batches, "decode batch sizes")->delimiter(',');
  app.add_option("--prompt", o.prompt_tokens, "decode prompt tokens per row");
  app.add_option("--new", o.new_tokens, "new tokens per row (>= 2)")->check(CLI::Range(2, 1 << 20));
  app.add_option("--prefill-batch", o.prefill_batch, "prefill rows");
  app.add_option("--prefill-len", o.prefill_tokens, "prefill tokens per row");
  app.add_option("--prefill-repeats", o.prefill_repeats, "timed prefills");
  app.add_option("--check-steps", o.check_steps, "eager steps compared with the graph's tokens");
  app.add_flag("!--no-graph", o.cuda_graph, "decode eagerly (no CUDA graph)");
  app.add_option("--temperature", o.temperature, "decode: 0 greedy, else sampled at this temperature")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("!--no-inference", o.inference, "skip prefill and decode (training phases only)");
  app.add_option("--train", o.train, "training phases, in this order: lora, full")
      ->delimiter(',')
      ->check(CLI::IsMember({"lora", "full"}));
  app.add_option("--train-batch", o.train_batch, "training sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--train-len", o.train_tokens, "tokens per training sequence (>= 2)")->check(CLI::Range(2, 1 << 20));
  app.add_option("--train-steps", o.train_steps, "timed training steps after the warm-up")->check(CLI::PositiveNumber);
  app.add_flag("!--no-train-checkpointing", o.train_checkpointing, "train without activation checkpointing");
  app.add_flag("!--no-train-masters", o.train_masters,
               "bf16 weights, gradients and moments only, rounded stochastically (8 bytes a parameter)");
  app.add_flag("--rollout", o.rollout, "run the rollout phase (generate() on GRPO-shaped work)");
  app.add_option("--rollout-prompts", o.rollout_prompts, "distinct prompts")->check(CLI::PositiveNumber);
  app.add_option("--rollout-samples", o.rollout_samples, "samples per prompt")->check(CLI::PositiveNumber);
  app.add_option("--rollout-prompt", o.rollout_prompt_tokens, "tokens per prompt")->check(CLI::PositiveNumber);
  app.add_option("--rollout-new", o.rollout_new_tokens, "most new tokens of a request (limits in [new/8, new])")
      ->check(CLI::PositiveNumber);
  app.add_option("--rollout-temperature", o.rollout_temperature, "sampling temperature (0: greedy)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rollout-max-rows", o.rollout_max_rows, "rows decoded at once; 0: every request")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rollout-seed", o.rollout_seed, "seed of the prompts, limits and per-sample seeds");
  app.add_option("--out", o.out, "JSON file; - for stdout");
  CLI11_PARSE(app, argc, argv);
  try {
    std::string text = run(o).dump(1);
    if (o.out == "-") {
      std::cout << text << "\n";
    } else {
      std::ofstream(o.out) << text << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "kz_model_bench: " << e.what() << "\n";
    return 1;
  }
}
