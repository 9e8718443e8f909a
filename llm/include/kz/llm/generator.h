// The one interface every model backend implements: chat messages in, n completions out.
//
// Backends: the OpenAI-compatible HTTP client (http_generator.h: vLLM, SGLang, llama.cpp's
// server, hosted APIs) and the in-process libtorch engine (engine_generator.h). Callers (kz bench, kz propose,
// the co-evolution loop) only see this header.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kz/core/status.h"

namespace kz {

struct ChatMessage {
  std::string role;     // "system", "user" or "assistant"
  std::string content;
};

struct SamplingParams {
  int n = 1;                          // completions per request
  double temperature = 1.0;           // 0: greedy
  double top_p = 1.0;
  int top_k = 0;                      // 0: off; sent only when set (a vLLM/SGLang/kz extension)
  int max_tokens = 4096;              // new tokens per completion
  std::vector<std::string> stop;      // stop sequences (not included in the text)
  std::optional<uint64_t> seed;       // backends that support it make sampling reproducible
  bool logprobs = false;              // ask for per-token log-probs where the backend gives them
  bool ignore_eos = false;            // run to max_tokens past eos tokens; sent only when set (vLLM/kz extension)
};

struct TokenLogprob {
  std::string token;
  double logprob = 0;
};

struct Completion {
  std::string text;
  std::string finish_reason;          // "stop", "length", ... as the backend says
  int prompt_tokens = 0;              // usage, where reported (0 otherwise)
  int completion_tokens = 0;
  std::vector<TokenLogprob> logprobs; // empty unless requested and supported
  std::vector<int64_t> token_ids;        // the completion's token ids, where the backend gives them (the in-process engine)
  std::vector<int64_t> prompt_token_ids; // the rendered prompt's ids, idem
};

// A piece of one completion while it is generated (GenerationRequest::on_piece).
struct CompletionPiece {
  int index = 0;                         // which of the request's n completions
  std::string_view text;                 // new text; a completion's pieces concatenate to its text
  const Completion* finished = nullptr;  // on the completion's last piece: the whole completion
};

struct GenerationRequest {
  std::string id;                     // caller's label: written to the run log, used in errors
  std::vector<ChatMessage> messages;  // chat form; for a raw completion use `prompt`
  std::string prompt;                 // raw-text form (/v1/completions); used when messages is empty
  SamplingParams params;
  // Optional, for streaming: called with each completion's new text as it is generated and a last
  // time when it is finished, on the thread that runs generate() (the batch waits: keep it short).
  // generate() still returns every completion. Backends that cannot stream (the HTTP client)
  // never call it.
  std::function<void(const CompletionPiece& piece)> on_piece;
};

class Generator {
 public:
  virtual ~Generator() = default;
  // Generates params.n completions for each request. Requests may run concurrently; results come
  // back in request order, one Result per request (a failed request does not fail the others).
  virtual std::vector<Result<std::vector<Completion>>> generate(const std::vector<GenerationRequest>& requests) = 0;
  // A short description for logs and reports: "openai:http://127.0.0.1:8000/v1:qwen2.5-coder".
  virtual std::string describe() const = 0;
};

}  // namespace kz
