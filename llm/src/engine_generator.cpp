// The in-process Generator over kz::model::Engine (see engine_generator.h).
#include "kz/llm/engine_generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "kz/model/chat_template.h"

namespace kz {
namespace {

class EngineGenerator final : public Generator {
 public:
  EngineGenerator(std::shared_ptr<model::Engine> engine, EngineGeneratorOptions options)
      : engine_(std::move(engine)), options_(options) {}

  std::vector<Result<std::vector<Completion>>> generate(const std::vector<GenerationRequest>& requests) override;
  std::string describe() const override { return engine_->describe(); }

 private:
  Result<std::vector<TokenId>> prompt_ids(const GenerationRequest& request) const;
  Completion to_completion(const model::EngineCompletion& c, const std::vector<TokenId>& prompt, bool logprobs) const;
  std::function<void(std::string_view, const model::EngineCompletion*)> forward_pieces(
      const GenerationRequest& request, int index, std::shared_ptr<const std::vector<TokenId>> prompt) const;

  std::shared_ptr<model::Engine> engine_;
  EngineGeneratorOptions options_;
};

Result<std::vector<TokenId>> EngineGenerator::prompt_ids(const GenerationRequest& request) const {
  const Tokenizer& tokenizer = engine_->tokenizer();
  if (request.messages.empty()) {
    if (request.prompt.empty()) return invalid_argument("the prompt is empty");
    return tokenizer.encode(request.prompt, /*allow_special=*/true);
  }
  const ChatTemplate& chat = tokenizer.chat_template();
  if (chat.present && !chat.chatml)
    return invalid_argument(fmt::format("{}: the tokenizer's chat template is not ChatML, which is all the engine renders",
                                        tokenizer.origin()));
  std::vector<ChatTurn> turns;
  for (const auto& m : request.messages) turns.push_back({m.role, m.content});
  return tokenizer.encode(render_chatml(turns, /*add_generation_prompt=*/true, chat), /*allow_special=*/true);
}

Completion EngineGenerator::to_completion(const model::EngineCompletion& c, const std::vector<TokenId>& prompt,
                                          bool logprobs) const {
  Completion out;
  out.text = c.text;
  out.finish_reason = c.finish_reason;
  out.prompt_tokens = static_cast<int>(c.prompt_tokens);
  out.completion_tokens = static_cast<int>(c.token_ids.size());
  out.token_ids = c.token_ids;
  out.prompt_token_ids.assign(prompt.begin(), prompt.end());
  if (logprobs)
    for (size_t i = 0; i < c.token_ids.size(); ++i) {
      TokenId id = static_cast<TokenId>(c.token_ids[i]);
      out.logprobs.push_back({engine_->tokenizer().decode(std::span(&id, 1)), c.logprobs[i]});
    }
  return out;
}

// An engine row's on_text that hands its text on as completion `index` of `request`.
std::function<void(std::string_view, const model::EngineCompletion*)> EngineGenerator::forward_pieces(
    const GenerationRequest& request, int index, std::shared_ptr<const std::vector<TokenId>> prompt) const {
  return [this, &request, index, prompt](std::string_view text, const model::EngineCompletion* finished) {
    if (!finished) return request.on_piece({index, text, nullptr});
    Completion whole = to_completion(*finished, *prompt, request.params.logprobs);
    request.on_piece({index, text, &whole});
  };
}

std::vector<Result<std::vector<Completion>>> EngineGenerator::generate(const std::vector<GenerationRequest>& requests) {
  std::vector<Result<std::vector<Completion>>> out(requests.size(), std::vector<Completion>());
  // Every completion becomes one engine row; owner[k] remembers its request.
  std::vector<model::EngineRequest> rows;
  std::vector<size_t> owner;
  std::random_device entropy;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& r = requests[i];
    const SamplingParams& p = r.params;
    std::string label = r.id.empty() ? fmt::format("request {}", i) : "request " + r.id;
    if (p.n < 1) {
      out[i] = invalid_argument(fmt::format("{}: n must be >= 1, got {}", label, p.n));
      continue;
    }
    auto ids = prompt_ids(r);
    if (!ids.ok()) {
      out[i] = ids.status().with_context(label);
      continue;
    }
    auto prompt = std::make_shared<const std::vector<TokenId>>(std::move(*ids));
    uint64_t base_seed = p.seed ? *p.seed : (uint64_t(entropy()) << 32 | entropy());
    for (int j = 0; j < p.n; ++j) {
      model::EngineRequest row;
      row.prompt_ids = *prompt;
      row.sampling.temperature = p.temperature;
      row.sampling.top_p = p.top_p;
      row.sampling.top_k = p.top_k;
      row.sampling.seed = base_seed + static_cast<uint64_t>(j);
      row.sampling.max_new_tokens = p.max_tokens;
      row.sampling.stop = p.stop;
      row.sampling.stop_at_eos = !p.ignore_eos;
      if (r.on_piece) row.on_text = forward_pieces(r, j, prompt);
      rows.push_back(std::move(row));
      owner.push_back(i);
    }
  }
  const size_t batch = static_cast<size_t>(std::max(1, options_.max_batch));
  for (size_t begin = 0; begin < rows.size(); begin += batch) {
    size_t end = std::min(rows.size(), begin + batch);
    std::vector<model::EngineRequest> part(rows.begin() + begin, rows.begin() + end);
    auto results = engine_->generate(part);
    for (size_t k = begin; k < end; ++k) {
      auto& slot = out[owner[k]];
      if (!slot.ok()) continue;  // an earlier completion of this request failed
      auto& result = results[k - begin];
      const GenerationRequest& r = requests[owner[k]];
      if (!result.ok()) slot = result.status().with_context(r.id.empty() ? "generate" : "request " + r.id);
      else slot->push_back(to_completion(*result, rows[k].prompt_ids, r.params.logprobs));
    }
  }
  return out;
}

}  // namespace

Status EngineGeneratorOptions::validate() const {
  if (max_batch < 1) return invalid_argument(fmt::format("max_batch must be >= 1, got {}", max_batch));
  return Status::ok();
}

Result<std::unique_ptr<Generator>> make_engine_generator(std::shared_ptr<model::Engine> engine,
                                                         EngineGeneratorOptions options) {
  KZ_RETURN_IF_ERROR(options.validate());
  if (!engine) return invalid_argument("make_engine_generator: no engine");
  return std::unique_ptr<Generator>(new EngineGenerator(std::move(engine), options));
}

Result<std::unique_ptr<Generator>> open_engine_generator(const model::EngineOptions& engine,
                                                         EngineGeneratorOptions options) {
  auto loaded = model::Engine::load(engine);
  if (!loaded.ok()) return loaded.status();
  return make_engine_generator(std::move(*loaded), options);
}

}  // namespace kz
