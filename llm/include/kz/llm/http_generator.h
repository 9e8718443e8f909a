// The OpenAI-compatible HTTP backend (libcurl): /v1/chat/completions and /v1/completions.
//
// Many requests in flight (curl multi, up to max_in_flight), retries with exponential backoff
// and jitter on 429, 5xx and connection errors (honouring Retry-After), a timeout per request,
// the API key read from the environment variable the config names, and every request and
// response appended to <log_dir>/requests.jsonl so a run can be audited and replayed.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "kz/core/status.h"
#include "kz/llm/generator.h"

namespace kz {

struct HttpGeneratorOptions {
  std::string base_url;              // e.g. "http://127.0.0.1:8000/v1" (…/chat/completions is appended)
  std::string model;                 // the "model" field sent with each request
  std::string api_key_env;           // environment variable holding the API key; empty: no key sent
  int max_in_flight = 16;            // concurrent HTTP requests
  double request_timeout_s = 600;    // whole-request deadline (generation can be slow)
  double connect_timeout_s = 10;
  int max_retries = 5;               // after the first attempt, for 429 / 5xx / connection errors
  double backoff_initial_s = 1.0;    // doubles each retry (with jitter), capped by backoff_max_s
  double backoff_max_s = 60;
  std::filesystem::path log_dir;     // where requests.jsonl goes; empty: no log

  Status validate() const;
};

// Parses "openai:<base-url>:<model>" (the base URL may itself contain ':').
Result<HttpGeneratorOptions> parse_model_spec(const std::string& spec);

Result<std::unique_ptr<Generator>> make_http_generator(HttpGeneratorOptions options);

}  // namespace kz
