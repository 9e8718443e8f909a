// kz_model_bench: throughput of the libtorch engine on one checkpoint, as JSON (bench/model_bench.py
// sets it beside transformers on the same checkpoint).
//
//   kz_model_bench --model DIR [--device cuda:0] [--batches 1,16,64] [--prompt 512] [--new 256]
//                  [--prefill-batch 8] [--prefill-len 2048] [--no-graph] [--out FILE]
//
// Phases, each with the peak CUDA memory the caching allocator saw during it:
//  - prefill: prefill-batch x prefill-len random tokens into a KV cache, one warm-up then timed
//    repeats; tokens/s = prompt tokens / s.
//  - decode at each batch size: random prompts of `prompt` tokens, greedy, eos ignored, `new` new
//    tokens. After a warm-up generation (and the CUDA graph capture), one timed generation:
//    decode tokens/s = batch x (new - 1) / time of the decode steps (the first new token comes
//    from the prefill logits); end-to-end tokens/s = batch x new / (prefill + decode time). Then
//    the same prompt is decoded eagerly for a few steps and compared with the graph's tokens.
// A failing phase is reported in its JSON entry ("error") and the others still run.
#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/cuda.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "kz/model/decode_loop.h"
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

// Fraction of the first `steps` tokens where an eager decode of the same prompt agrees with
// `tokens` [B, >= steps] (bf16 kernels may differ slightly; a broken graph gives ~0).
double eager_agreement(CausalLM& model, kz::model::KVCache& cache, const at::Tensor& ids, const at::Tensor& tokens,
                       int64_t steps) {
  at::Tensor first = prefill_first(model, cache, ids);
  auto eager = value_or_throw(kz::model::GreedyLoop::create(model, cache, {.cuda_graph = false}));
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
  auto loop = value_or_throw(kz::model::GreedyLoop::create(model, cache, {.cuda_graph = o.cuda_graph}));
  value_or_throw(loop->run(first, std::min<int64_t>(8, steps)));  // warm-up after the capture
  sync(dev);

  auto start = std::chrono::steady_clock::now();
  first = prefill_first(model, cache, ids);
  sync(dev);
  double prefill_s = seconds_since(start);
  auto decode_start = std::chrono::steady_clock::now();
  kz::model::GreedyTokens out = value_or_throw(loop->run(first, steps));
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
  r["eager_agreement"] = eager_agreement(model, cache, ids, out.tokens, check);
  r["eager_agreement_steps"] = check;
  if (batch == 1 && sample) *sample = {{"prompt", to_ids(ids[0])}, {"tokens", to_ids(all[0])}};
  return r;
}

// Runs one phase, turning an exception into {"phase", "error"} so the others still run.
template <class F>
json guarded_phase(const std::string& phase, int64_t batch, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    std::cerr << "kz_model_bench: " << phase << " (batch " << batch << ") failed: " << e.what() << "\n";
    return {{"phase", phase}, {"batch", batch}, {"error", e.what()}};
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
  phases.push_back(guarded_phase("prefill", o.prefill_batch, [&] { return bench_prefill(*model, o); }));
  json sample;
  for (int64_t b : o.batches)
    phases.push_back(guarded_phase("decode", b, [&] { return bench_decode(*model, o, b, &sample); }));
  result["phases"] = phases;
  result["sample"] = sample;
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  BenchOptions o;
  CLI::App app{"Decode and prefill throughput of the libtorch engine (JSON)"};
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
