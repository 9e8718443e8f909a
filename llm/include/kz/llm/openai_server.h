// An OpenAI-compatible HTTP endpoint over any Generator (`kz serve-model` puts the in-process
// engine behind it), so vLLM-style clients, including the project's own HttpGenerator, can use it.
//
// API (JSON; errors are {"error": {"message", "type", "param", "code"}} with HTTP 400 for a bad
// request, 404 for an unknown path, 500 when generation fails):
//   POST /v1/completions       {"model", "prompt": string or [string], "max_tokens" (default 16),
//                              "temperature" (1), "top_p" (1), "top_k" (0: off), "n" (1), "stop":
//                              string or [string], "seed", "logprobs": int (the chosen token's
//                              log-prob only; top alternatives are not computed), "stream"}
//                              -> {"id", "object": "text_completion", "created", "model",
//                                  "choices": [{"index", "text", "logprobs", "finish_reason"}], "usage"}
//   POST /v1/chat/completions  {"model", "messages": [{"role", "content": string or [{"type":
//                              "text", "text"}]}], "max_tokens" | "max_completion_tokens"
//                              (default: the server's chat default), "logprobs": bool, the rest as above}
//                              -> {"id", "object": "chat.completion", ..., "choices": [{"index",
//                                  "message": {"role": "assistant", "content"}, "logprobs", "finish_reason"}]}
//   GET /v1/models             -> {"object": "list", "data": [{"id": model name, "object": "model", ...}]}
//   GET /health, /v1/health    -> {"status": "ok", "model", "queued", "running", "requests", "batches", ...}
// "model" in a request is accepted whatever it names (one model is served). usage counts the
// prompt once and every choice's tokens.
//
// Batching: handlers put requests on one queue; a batcher thread takes what is queued (up to
// max_batch completions, waiting up to batch_wait_ms after the first for others to arrive) and
// runs it as one Generator::generate() call, so requests that arrive together share one model
// batch. concurrent_batches batcher threads do so at once: with a generator that merges
// concurrent calls (the model engine's continuous batching), requests that arrive while a batch
// decodes join it instead of waiting for it to end.
//
// "stream": true is answered in OpenAI's server-sent-events format while the batch decodes: per
// choice, chunks of new text ("text", or chat's "delta" with the role first), the last with its
// finish_reason (and, when asked, all its log-probs); "stream_options": {"include_usage": true}
// adds a usage chunk; then "data: [DONE]". New text leaves the engine whenever its tokens reach
// the host: after the prefill, then every 16 decode steps (generate.h's stop_check_steps), the
// cadence at which the decode loop already syncs with the device, so streaming slows nothing. A
// chunk never ends inside a UTF-8 character or in text that could still become a stop string.
// Requests that stream share batches with the others; a client that disconnects leaves the batch
// running for them (its completion is still generated, and dropped). A request that fails before
// its first chunk is answered as a plain JSON error.
#pragma once

#include <memory>
#include <string>

#include "kz/core/status.h"
#include "kz/llm/generator.h"

namespace kz {

struct OpenAIServerOptions {
  std::string host = "127.0.0.1";   // loopback unless asked: there is no authentication
  int port = 0;                     // 0: any free port (port() says which)
  std::string model_name = "kz";    // listed by /v1/models and echoed in responses
  int max_batch = 32;               // completions per generate() call (a larger single request runs alone)
  double batch_wait_ms = 5;         // how long the first queued request waits for company
  int concurrent_batches = 16;      // generate() calls in flight at once (1: one batch after another)
  int http_threads = 64;            // connections served at once
  int max_n = 128;                  // largest n a request may ask for
  int default_max_tokens = 16;      // /v1/completions without max_tokens (OpenAI's default)
  int chat_default_max_tokens = 1024;  // /v1/chat/completions without max_tokens
  Status validate() const;
};

class OpenAIServer {
 public:
  // Binds host:port and serves in the background. `generator` must outlive the server.
  static Result<std::unique_ptr<OpenAIServer>> start(Generator& generator, const OpenAIServerOptions& options);
  ~OpenAIServer();  // stop()

  int port() const;
  // Stops accepting connections, answers queued requests with an error, waits for the running
  // batches. Idempotent.
  void stop();

  struct Counts {
    size_t queued = 0, running = 0;  // HTTP requests waiting / in running batches
    size_t requests = 0;             // HTTP generation requests answered
    size_t batches = 0;              // generate() calls made
  };
  Counts counts() const;

 private:
  struct Impl;
  explicit OpenAIServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kz
