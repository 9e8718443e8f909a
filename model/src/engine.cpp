// The engine (engine.h): a loaded CausalLM + Tokenizer, and text-level generation on them. The
// one libtorch translation unit behind engine.h.
#include "kz/model/engine.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "kz/model/generate.h"
#include "kz/model/stop_strings.h"

namespace kz::model {
namespace {

using json = nlohmann::json;

// generation_config.json's ids ("eos_token_id": int or list; "pad_token_id": int), when present.
struct GenerationConfig {
  std::vector<int64_t> eos;
  std::optional<int64_t> pad;
};

Result<GenerationConfig> read_generation_config(const fs::path& dir) {
  GenerationConfig g;
  fs::path path = dir / "generation_config.json";
  if (!fs::exists(path)) return g;
  auto text = read_file(path);
  if (!text.ok()) return text.status();
  json j = json::parse(*text, nullptr, false);
  if (!j.is_object()) return parse_error(path.string() + ": not a JSON object");
  if (auto it = j.find("eos_token_id"); it != j.end()) {
    if (it->is_number_integer()) g.eos.push_back(it->get<int64_t>());
    else if (it->is_array())
      for (const auto& v : *it)
        if (v.is_number_integer()) g.eos.push_back(v.get<int64_t>());
  }
  if (auto it = j.find("pad_token_id"); it != j.end() && it->is_number_integer()) g.pad = it->get<int64_t>();
  return g;
}

// A row's text while it decodes, shared by its stop check and its stream: generate.h hands both
// the row's tokens so far, and each token is decoded once.
struct RowText {
  StopStringText text;
  size_t fed = 0;       // tokens pushed into text
  size_t streamed = 0;  // bytes of text handed to on_text

  // Pushes the tokens not seen yet; true once a stop string is complete.
  bool feed(const std::vector<int64_t>& ids) {
    for (; fed < ids.size() && !text.stopped(); ++fed) text.push(static_cast<TokenId>(ids[fed]));
    return text.stopped();
  }
};

// A request handed to the scheduler, and its outcome once finished.
struct Queued {
  GenerateRequest request;
  std::optional<Result<GenerateResult>> outcome;  // written under Engine::Impl::mutex
};

}  // namespace

struct Engine::Impl {
  EngineOptions options;
  std::shared_ptr<CausalLM> model;
  Tokenizer tokenizer;
  std::vector<int64_t> eos;
  int64_t pad_id = 0;

  std::mutex mutex;                              // guards queue, stopping and every Queued::outcome
  std::condition_variable queued_or_stopping;    // wakes the scheduler
  std::condition_variable finished;              // wakes callers whose requests may be done
  std::deque<std::shared_ptr<Queued>> queue;     // not yet in a batch, in arrival order
  bool stopping = false;
  std::thread scheduler;                         // runs schedule(); started and joined by Engine

  Impl(EngineOptions o, std::shared_ptr<CausalLM> m, Tokenizer t)
      : options(std::move(o)), model(std::move(m)), tokenizer(std::move(t)) {}

  Status check(const EngineRequest& r) const {
    if (r.prompt_ids.empty()) return invalid_argument("the prompt is empty (no tokens)");
    const auto context = model->config().max_position_embeddings;
    if (context > 0 && static_cast<int64_t>(r.prompt_ids.size()) >= context)
      return invalid_argument(fmt::format("the prompt has {} tokens; the model's context is {} tokens",
                                          r.prompt_ids.size(), context));
    if (r.sampling.max_new_tokens < 1)
      return invalid_argument(fmt::format("max new tokens must be >= 1, got {}", r.sampling.max_new_tokens));
    return Status::ok();
  }

  GenerateRequest to_request(const EngineRequest& r) const {
    GenerateRequest g;
    g.prompt_ids.assign(r.prompt_ids.begin(), r.prompt_ids.end());
    const TextSampling& s = r.sampling;
    g.sampling.temperature = s.temperature;
    g.sampling.top_k = s.top_k;
    g.sampling.top_p = s.top_p;
    g.sampling.seed = s.seed;
    int64_t context = model->config().max_position_embeddings;
    int64_t room = context > 0 ? context - static_cast<int64_t>(r.prompt_ids.size()) : s.max_new_tokens;
    g.sampling.max_new_tokens = std::max<int64_t>(1, std::min(s.max_new_tokens, room));
    if (s.stop_at_eos) g.sampling.stop_token_ids = eos;
    if (s.stop.empty() && !r.on_text) return g;
    auto text = std::make_shared<RowText>(RowText{StopStringText(tokenizer, s.stop)});
    if (!s.stop.empty()) g.stop_check = [text](const std::vector<int64_t>& ids) { return text->feed(ids); };
    if (r.on_text)
      g.on_progress = [this, &r, text](const GenerateResult& so_far, bool finished) {
        stream_text(r, *text, so_far, finished);
      };
    return g;
  }

  // Hands on_text the row's newly settled text, and at the end the rest of the completion's.
  void stream_text(const EngineRequest& r, RowText& row, const GenerateResult& so_far, bool finished) const {
    row.feed(so_far.token_ids);
    if (finished) {
      // apply_stop_strings cuts as row.text does, so this text extends what was streamed.
      EngineCompletion done = to_completion(r, so_far);
      r.on_text(std::string_view(done.text).substr(row.streamed), &done);
      return;
    }
    size_t settled = row.text.settled();
    if (settled == row.streamed) return;
    r.on_text(std::string_view(row.text.text()).substr(row.streamed, settled - row.streamed), nullptr);
    row.streamed = settled;
  }

  // Runs a batch whenever requests wait, until the engine is destroyed (no generate() call is in
  // flight then, so nothing is left queued).
  void schedule() {
    // A new thread's current CUDA device is 0: the batches' graphs and streams belong on the model's.
    c10::DeviceGuard on_model_device(model->device());
    std::unique_lock lock(mutex);
    for (;;) {
      queued_or_stopping.wait(lock, [&] { return stopping || !queue.empty(); });
      if (stopping) return;
      std::vector<std::shared_ptr<Queued>> batch(queue.begin(), queue.end());
      queue.clear();
      lock.unlock();
      run_batch(std::move(batch));
      lock.lock();
    }
  }

  // One generate() call over `batch`, taking in the requests queued while it runs that its cache
  // holds (in arrival order: one that does not fit stops the intake, so it is first in the next
  // batch rather than overtaken indefinitely).
  void run_batch(std::vector<std::shared_ptr<Queued>> batch) {
    std::vector<GenerateRequest> requests;
    for (const auto& q : batch) requests.push_back(q->request);
    GenerateOptions generate_options;
    generate_options.pad_token_id = pad_id;
    generate_options.cuda_graph = options.cuda_graph;
    generate_options.max_batch_rows = options.max_batch_rows;
    generate_options.admit = [&](int64_t capacity) {
      std::lock_guard lock(mutex);
      // Requests already answered need no failure status at the end: a batch that serving traffic
      // keeps alive holds only those still running.
      std::erase_if(batch, [](const auto& q) { return q->outcome.has_value(); });
      std::vector<GenerateRequest> admitted;
      while (!queue.empty() && cache_slots_needed(queue.front()->request) <= capacity) {
        admitted.push_back(queue.front()->request);
        batch.push_back(std::move(queue.front()));
        queue.pop_front();
      }
      return admitted;
    };
    auto results = model::generate(*model, requests, generate_options);
    if (results.ok()) return;  // each request's outcome came through its on_progress
    std::lock_guard lock(mutex);
    for (const auto& q : batch)
      if (!q->outcome) q->outcome = results.status();
    finished.notify_all();
  }

  // A queued request whose on_progress also records its outcome when it finishes.
  std::shared_ptr<Queued> to_queued(const EngineRequest& r) {
    auto q = std::make_shared<Queued>();
    q->request = to_request(r);
    q->request.on_progress = [this, stream = std::move(q->request.on_progress), queued = q.get()](
                                 const GenerateResult& so_far, bool done) {
      if (stream) stream(so_far, done);
      if (!done) return;
      std::lock_guard lock(mutex);
      queued->outcome = so_far;
      finished.notify_all();
    };
    return q;
  }

  EngineCompletion to_completion(const EngineRequest& r, GenerateResult g) const {
    EngineCompletion c;
    c.prompt_tokens = r.prompt_ids.size();
    StopCut cut = apply_stop_strings(tokenizer, g.token_ids, r.sampling.stop);
    g.token_ids.resize(cut.tokens);
    g.logprobs.resize(cut.tokens);
    c.text = std::move(cut.text);
    c.token_ids = std::move(g.token_ids);
    c.logprobs = std::move(g.logprobs);
    c.finish_reason = cut.stopped ? "stop" : finish_reason_name(g.finish_reason);
    return c;
  }
};

Status EngineOptions::validate() const {
  if (model_dir.empty()) return invalid_argument("a model directory is required");
  if (max_batch_rows < 0) return invalid_argument(fmt::format("max_batch_rows must be >= 0, got {}", max_batch_rows));
  if (auto d = parse_dtype(dtype); !d.ok()) return d.status();
  try {
    at::Device parsed(device);
    (void)parsed;
  } catch (const std::exception&) {
    return invalid_argument(fmt::format("device \"{}\" is not cpu, cuda or cuda:N", device));
  }
  return Status::ok();
}

Result<std::shared_ptr<Engine>> Engine::load(const EngineOptions& options) {
  KZ_RETURN_IF_ERROR(options.validate());
  LoadOptions load;
  load.dtype = *parse_dtype(options.dtype);
  try {
    load.device = at::Device(options.device);
  } catch (const std::exception& e) {
    return invalid_argument(fmt::format("device \"{}\": {}", options.device, e.what()));
  }
  auto tokenizer = Tokenizer::load(options.model_dir);
  if (!tokenizer.ok()) return tokenizer.status().with_context("loading the tokenizer");
  auto generation = read_generation_config(options.model_dir);
  if (!generation.ok()) return generation.status();
  auto model = CausalLM::load(options.model_dir, load);
  if (!model.ok()) return model.status();
  auto impl = std::make_unique<Impl>(options, std::move(*model), std::move(*tokenizer));
  impl->eos = generation->eos;
  if (impl->eos.empty()) impl->eos = impl->model->config().eos_token_ids;
  if (impl->eos.empty() && impl->tokenizer.eos_id()) impl->eos.push_back(*impl->tokenizer.eos_id());
  if (generation->pad) impl->pad_id = *generation->pad;
  else if (impl->tokenizer.pad_id()) impl->pad_id = *impl->tokenizer.pad_id();
  if (impl->pad_id < 0 || impl->pad_id >= impl->model->config().vocab_size) impl->pad_id = 0;
  return std::shared_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->scheduler = std::thread([impl = impl_.get()] { impl->schedule(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->queued_or_stopping.notify_all();
  impl_->scheduler.join();
}

std::vector<Result<EngineCompletion>> Engine::generate(const std::vector<EngineRequest>& requests) {
  std::vector<Result<EngineCompletion>> out(requests.size(), Result<EngineCompletion>(internal_error("not run")));
  std::vector<std::shared_ptr<Queued>> queued(requests.size());  // null for invalid requests
  for (size_t i = 0; i < requests.size(); ++i) {
    Status s = impl_->check(requests[i]);
    if (s.is_ok()) {
      queued[i] = impl_->to_queued(requests[i]);
      s = check_request(queued[i]->request, impl_->model->config().vocab_size);
    }
    if (!s.is_ok()) {
      out[i] = s;
      queued[i] = nullptr;
    }
  }
  {
    std::unique_lock lock(impl_->mutex);
    for (const auto& q : queued)
      if (q) impl_->queue.push_back(q);
    impl_->queued_or_stopping.notify_one();
    impl_->finished.wait(lock, [&] {
      return std::all_of(queued.begin(), queued.end(), [](const auto& q) { return !q || q->outcome; });
    });
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!queued[i]) continue;
    Result<GenerateResult>& outcome = *queued[i]->outcome;
    if (!outcome.ok()) out[i] = outcome.status();
    else out[i] = impl_->to_completion(requests[i], std::move(*outcome));
  }
  return out;
}

const Tokenizer& Engine::tokenizer() const { return impl_->tokenizer; }
const ModelConfig& Engine::config() const { return impl_->model->config(); }
const std::vector<int64_t>& Engine::eos_token_ids() const { return impl_->eos; }
int64_t Engine::context_length() const { return impl_->model->config().max_position_embeddings; }
std::string Engine::device() const { return impl_->model->device().str(); }
std::string Engine::dtype() const {
  auto d = to_weight_dtype(impl_->model->dtype());
  return d.ok() ? weight_dtype_name(*d) : "?";
}
const fs::path& Engine::model_dir() const { return impl_->options.model_dir; }
int64_t Engine::pad_token_id() const { return impl_->pad_id; }
std::shared_ptr<CausalLM> Engine::model() const { return impl_->model; }
std::string Engine::describe() const {
  return fmt::format("engine:{} ({}, {})", impl_->options.model_dir.string(), device(), dtype());
}

}  // namespace kz::model
