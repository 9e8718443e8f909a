// kz init-model, kz generate and kz serve-model end to end, on a tiny checkpoint written by the
// test itself:
//   - transformers (cli/tests/hf_model_reference.py) loads the checkpoint and its tokenizer, and
//     its greedy continuations (raw and chat) equal ours token for token;
//   - `kz generate --json` is valid JSON with the documented fields;
//   - both commands take configs/model.toml's keys through --config, flags given overriding them;
//   - the in-process Generator (llm/engine_generator.h) gives the same tokens;
//   - `kz serve-model` on a free loopback port, driven by the project's HttpGenerator: the same
//     text as in-process for greedy, n completions, stop strings, logprobs, usage, concurrent
//     requests batched together, and OpenAI-style errors (400 on bad JSON / bad fields, 404);
//   - "stream": true: the same text in chunks that arrive while generating, stop strings cut as
//     without streaming, and a client hanging up mid-stream leaves the others' answers whole;
//   - the 0.5B and 7B presets' configs (no weights) load in transformers with the real shapes;
//   - continuous batching across callers: engine calls from several threads, and concurrent HTTP
//     requests (streamed or not), each get what they get alone, and a request that arrives while
//     a long one decodes joins its batch and finishes first.
#include <curl/curl.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kz/core/files.h"
#include "kz/sandbox/process.h"
#include "kz/llm/engine_generator.h"
#include "kz/llm/http_generator.h"
#include "kz/model/engine.h"

namespace kz {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

constexpr int kMaxNew = 24;
constexpr int kLongMaxNew = 400;  // long enough that streaming shows
const std::vector<std::string> kPrompts = {"def relu(x):", "import torch", "__global__ void add(float* x) {",
                                           "The quick brown fox"};

Result<RunResult> run(std::vector<std::string> argv, std::chrono::seconds timeout = 300s) {
  ProcessSpec spec;
  spec.argv = std::move(argv);
  spec.env = current_environment();
  spec.output_tail_bytes = 4 << 20;
  return run_process(spec, timeout);
}

// Runs and expects exit code 0; returns stdout.
std::string run_ok(std::vector<std::string> argv) {
  std::string shown = fmt::format("{}", fmt::join(argv, " "));
  auto r = run(std::move(argv));
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return "";
  EXPECT_TRUE(r->exit.exited && r->exit.exit_code == 0) << shown << ": " << r->exit.describe() << "\n" << r->stderr_text;
  return r->stdout_text;
}

size_t append_body(char* data, size_t size, size_t count, void* user) {
  static_cast<std::string*>(user)->append(data, size * count);
  return size * count;
}

// A JSON request (POST when `body` is given) whose reply goes to `write`; {transfer code, status}.
std::pair<CURLcode, long> perform_json(const std::string& url, const std::string* body, curl_write_callback write,
                                       void* sink, long timeout_s) {
  CURL* easy = curl_easy_init();
  curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, write);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, sink);
  curl_easy_setopt(easy, CURLOPT_TIMEOUT, timeout_s);
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
  if (body) {
    curl_easy_setopt(easy, CURLOPT_POST, 1L);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body->c_str());
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE, static_cast<long>(body->size()));
  }
  const CURLcode code = curl_easy_perform(easy);
  long status = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(easy);
  return {code, status};
}

// One raw HTTP exchange: {status, body}.
std::pair<long, std::string> http(const std::string& method, const std::string& url, const std::string& body = "") {
  std::string out;
  auto [code, status] = perform_json(url, method == "POST" ? &body : nullptr, append_body, &out, 60L);
  return {code == CURLE_OK ? status : 0, out};
}

// One server-sent event of a streamed answer and when it arrived.
struct StreamedEvent {
  std::string data;  // after "data: "
  std::chrono::steady_clock::time_point at;
};

struct Streamed {
  long status = 0;
  std::string body;                    // everything received (an error's JSON when not streamed)
  std::vector<StreamedEvent> events;
  std::chrono::steady_clock::time_point sent;
};

struct StreamReader {
  Streamed* out;
  size_t stop_after;  // events; then the transfer is aborted, as by a client that goes away
  std::string pending;
};

size_t read_events(char* data, size_t size, size_t count, void* user) {
  auto* reader = static_cast<StreamReader*>(user);
  auto now = std::chrono::steady_clock::now();
  reader->out->body.append(data, size * count);
  reader->pending.append(data, size * count);
  for (size_t end; (end = reader->pending.find("\n\n")) != std::string::npos;) {
    std::string event = reader->pending.substr(0, end);
    reader->pending.erase(0, end + 2);
    if (event.rfind("data: ", 0) == 0) reader->out->events.push_back({event.substr(6), now});
  }
  return reader->out->events.size() >= reader->stop_after ? 0 : size * count;
}

// POSTs a "stream": true request and reads its events as they come (stop_after: hang up then).
Streamed http_stream(const std::string& url, const json& request, size_t stop_after = SIZE_MAX) {
  Streamed out;
  StreamReader reader{&out, stop_after, ""};
  const std::string body = request.dump();
  out.sent = std::chrono::steady_clock::now();
  out.status = perform_json(url, &body, read_events, &reader, 120L).second;  // a hang-up ends the transfer early
  return out;
}

// What a stream's events say, checked against OpenAI's chunk shape on the way.
struct StreamSummary {
  std::vector<std::string> texts;    // per choice index, the pieces joined
  std::vector<std::string> finish;   // per choice index
  size_t text_chunks = 0;            // chunks with non-empty text
  std::optional<std::chrono::steady_clock::time_point> first_text_at;
  bool usage = false, done = false;
};

StreamSummary summarize(const Streamed& streamed, bool chat) {
  StreamSummary out;
  for (const auto& event : streamed.events) {
    if (event.data == "[DONE]") {
      out.done = true;
      continue;
    }
    json chunk = json::parse(event.data, nullptr, false);
    EXPECT_FALSE(chunk.is_discarded()) << event.data;
    if (chunk.is_discarded()) continue;
    EXPECT_EQ(chunk["object"], chat ? "chat.completion.chunk" : "text_completion") << event.data;
    if (chunk.contains("usage")) out.usage = true;
    for (const auto& choice : chunk["choices"]) {
      auto index = choice["index"].get<size_t>();
      if (out.texts.size() <= index) {
        out.texts.resize(index + 1);
        out.finish.resize(index + 1);
      }
      std::string piece;
      if (chat && choice["delta"].contains("content")) piece = choice["delta"]["content"];
      if (!chat) piece = choice["text"];
      if (!piece.empty()) {
        ++out.text_chunks;
        if (!out.first_text_at) out.first_text_at = event.at;
      }
      out.texts[index] += piece;
      if (!choice["finish_reason"].is_null()) out.finish[index] = choice["finish_reason"];
    }
  }
  return out;
}

class ServeModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto dir = make_unique_dir(fs::temp_directory_path(), "kz_serve_model_test");
    ASSERT_TRUE(dir.ok()) << dir.status().to_string();
    dir_ = *dir;
    model_ = dir_ / "tiny";
    run_ok({KZ_BIN, "init-model", "--preset", "tiny", "--out", model_.string(), "--seed", "0"});
    std::vector<std::string> argv = {KZ_PYTHON, KZ_HF_REFERENCE, "generate", model_.string(), std::to_string(kMaxNew)};
    argv.insert(argv.end(), kPrompts.begin(), kPrompts.end());
    std::string out = run_ok(argv);
    reference_ = json::parse(out, nullptr, false);
    ASSERT_FALSE(reference_.is_discarded()) << "transformers' reference is not JSON: " << out;
  }

  static void TearDownTestSuite() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  static std::unique_ptr<Generator> local() {
    model::EngineOptions options;
    options.model_dir = model_;
    auto g = open_engine_generator(options);
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    return g.ok() ? std::move(*g) : nullptr;
  }

  static GenerationRequest raw(const std::string& prompt, double temperature = 0) {
    GenerationRequest r;
    r.id = prompt;
    r.prompt = prompt;
    r.params.temperature = temperature;
    r.params.max_tokens = kMaxNew;
    return r;
  }

  // Eight requests over the prompts with different limits, seeds and sampling (greedy, plain,
  // top-k, top-p), log-probs asked; every third gets a stop string from the middle of its text
  // alone.
  static std::vector<GenerationRequest> varied_requests(Generator& alone) {
    std::vector<GenerationRequest> out;
    for (int i = 0; i < 8; ++i) {
      GenerationRequest r = raw(kPrompts[static_cast<size_t>(i) % kPrompts.size()], i % 2 ? 0.9 : 0);
      r.id = fmt::format("varied-{}", i);
      r.params.max_tokens = 8 + 5 * i;
      r.params.seed = 100 + static_cast<uint64_t>(i);
      r.params.top_k = i % 4 == 1 ? 20 : 0;
      r.params.top_p = i % 4 == 3 ? 0.8 : 1.0;
      r.params.logprobs = true;
      out.push_back(r);
    }
    for (size_t i = 0; i < out.size(); i += 3) {
      auto whole = alone.generate({out[i]});
      EXPECT_TRUE(whole[0].ok()) << whole[0].status().to_string();
      if (!whole[0].ok()) continue;
      const std::string& text = (*whole[0])[0].text;
      if (text.size() >= 8) out[i].params.stop = {text.substr(text.size() / 2, 2)};
    }
    return out;
  }

  // Completion `got` of request `id` is `want` (generated alone): text, finish, tokens, log-probs.
  static void expect_same_completion(const Completion& got, const Completion& want, const std::string& id) {
    EXPECT_EQ(got.text, want.text) << id;
    EXPECT_EQ(got.finish_reason, want.finish_reason) << id;
    EXPECT_EQ(got.completion_tokens, want.completion_tokens) << id;
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << id;
    for (size_t t = 0; t < want.logprobs.size(); ++t) {
      EXPECT_EQ(got.logprobs[t].token, want.logprobs[t].token) << id << " token " << t;
      EXPECT_NEAR(got.logprobs[t].logprob, want.logprobs[t].logprob, 1e-4) << id << " token " << t;
    }
  }

  static GenerationRequest chat() {
    GenerationRequest r;
    r.id = "chat";
    r.messages = {{"system", "You write CUDA kernels."}, {"user", "Write a ReLU kernel."}};
    r.params.temperature = 0;
    r.params.max_tokens = kMaxNew;
    return r;
  }

  static inline fs::path dir_, model_;
  static inline json reference_;
};

TEST_F(ServeModelTest, GreedyGenerateMatchesTransformers) {
  ASSERT_TRUE(reference_.contains("raw"));
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    std::string out = run_ok({KZ_BIN, "generate", "--model", model_.string(), "--prompt", kPrompts[i],
                              "--temperature", "0", "--max-new-tokens", std::to_string(kMaxNew), "--json"});
    json got = json::parse(out, nullptr, false);
    ASSERT_FALSE(got.is_discarded()) << "kz generate --json printed: " << out;
    for (const char* key : {"text", "token_ids", "logprobs", "finish_reason", "prompt_ids", "prompt_tokens",
                            "completion_tokens", "tokens_per_s"})
      EXPECT_TRUE(got.contains(key)) << key;
    const json& want = reference_["raw"][i];
    EXPECT_EQ(got["prompt_ids"], want["prompt_ids"]) << kPrompts[i];
    EXPECT_EQ(got["token_ids"], want["token_ids"]) << kPrompts[i];
    EXPECT_EQ(got["text"], want["text"]) << kPrompts[i];
    EXPECT_EQ(got["logprobs"].size(), got["token_ids"].size());
    for (const auto& lp : got["logprobs"]) EXPECT_LE(lp.get<double>(), 0.0);
    bool hit_eos = got["token_ids"].size() < kMaxNew;
    EXPECT_EQ(got["finish_reason"], hit_eos ? "stop" : "length");
  }
}

// Shards of ~100 KB: an index and several files, the same weights (streams are keyed by tensor
// name, not by file), so the same greedy tokens.
TEST_F(ServeModelTest, ShardedCheckpointGivesTheSameTokens) {
  fs::path sharded = dir_ / "tiny-sharded";
  run_ok({KZ_BIN, "init-model", "--preset", "tiny", "--out", sharded.string(), "--max-shard-gb", "0.0001",
          "--jobs", "3"});
  ASSERT_TRUE(fs::exists(sharded / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(sharded / "model.safetensors"));
  json got = json::parse(run_ok({KZ_BIN, "generate", "--model", sharded.string(), "--prompt", kPrompts[1],
                                 "--temperature", "0", "--max-new-tokens", std::to_string(kMaxNew), "--json"}),
                         nullptr, false);
  ASSERT_FALSE(got.is_discarded());
  EXPECT_EQ(got["token_ids"], reference_["raw"][1]["token_ids"]);
}

TEST_F(ServeModelTest, InProcessGeneratorMatchesTransformers) {
  auto g = local();
  ASSERT_TRUE(g);
  std::vector<GenerationRequest> requests;
  for (const auto& p : kPrompts) requests.push_back(raw(p));
  requests.push_back(chat());
  auto results = g->generate(requests);  // one batch: left padding must not change greedy tokens
  ASSERT_EQ(results.size(), requests.size());
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status().to_string();
    ASSERT_EQ(results[i]->size(), 1u);
    EXPECT_EQ((*results[i])[0].text, reference_["raw"][i]["text"].get<std::string>()) << kPrompts[i];
    EXPECT_EQ((*results[i])[0].completion_tokens, static_cast<int>(reference_["raw"][i]["token_ids"].size()));
    EXPECT_EQ((*results[i])[0].prompt_tokens, static_cast<int>(reference_["raw"][i]["prompt_ids"].size()));
  }
  const auto& c = results.back();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ((*c)[0].text, reference_["chat"]["text"].get<std::string>());  // ChatML as transformers renders it
  EXPECT_EQ((*c)[0].prompt_tokens, static_cast<int>(reference_["chat"]["prompt_ids"].size()));
}

TEST_F(ServeModelTest, InProcessStopStringsSeedsAndN) {
  auto g = local();
  ASSERT_TRUE(g);
  // A stop string cut out of the greedy text: the text ends before it.
  std::string full = reference_["raw"][2]["text"];
  ASSERT_GE(full.size(), 8u);
  std::string stop = full.substr(full.size() / 2, 3);
  GenerationRequest r = raw(kPrompts[2]);
  r.params.stop = {stop};
  r.params.logprobs = true;
  auto results = g->generate({r});
  ASSERT_TRUE(results[0].ok()) << results[0].status().to_string();
  const Completion& c = (*results[0])[0];
  EXPECT_EQ(c.text, full.substr(0, full.find(stop)));
  EXPECT_EQ(c.finish_reason, "stop");
  EXPECT_EQ(c.logprobs.size(), static_cast<size_t>(c.completion_tokens));
  // n samples with a seed: reproducible, and the n rows differ from each other.
  GenerationRequest s = raw(kPrompts[0], 1.0);
  s.params.n = 4;
  s.params.seed = 7;
  auto a = g->generate({s}), b = g->generate({s});
  ASSERT_TRUE(a[0].ok() && b[0].ok());
  ASSERT_EQ(a[0]->size(), 4u);
  std::set<std::string> distinct;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ((*a[0])[i].text, (*b[0])[i].text);
    distinct.insert((*a[0])[i].text);
  }
  EXPECT_GT(distinct.size(), 1u);
  // A bad request fails alone.
  GenerationRequest bad = raw("");
  auto mixed = g->generate({bad, raw(kPrompts[0])});
  EXPECT_FALSE(mixed[0].ok());
  EXPECT_TRUE(mixed[1].ok());
}

// `kz serve-model` on a free port, stopped with SIGTERM at the end.
class ServedModel {
 public:
  static inline const std::vector<std::string> kFlags = {"--port", "0", "--max-batch", "8", "--batch-wait-ms", "20",
                                                         "--served-model-name", "tiny"};

  explicit ServedModel(const fs::path& model, const std::vector<std::string>& flags = kFlags) {
    ProcessSpec spec;
    spec.argv = {KZ_BIN, "serve-model", "--model", model.string()};
    spec.argv.insert(spec.argv.end(), flags.begin(), flags.end());
    spec.env = current_environment();
    auto p = Process::spawn(spec);
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    if (!p.ok()) return;
    process_.emplace(std::move(*p));
    std::regex listening(R"(http://127\.0\.0\.1:(\d+)/v1)");
    auto deadline = std::chrono::steady_clock::now() + 120s;
    while (std::chrono::steady_clock::now() < deadline) {
      if (process_->wait_for(50ms)) break;  // exited: failed to start
      std::smatch m;
      const std::string& err = process_->stderr_tail();
      if (std::regex_search(err, m, listening)) {
        port_ = std::stoi(m[1]);
        return;
      }
    }
    ADD_FAILURE() << "kz serve-model did not start: " << process_->stderr_tail();
  }

  // SIGTERM; the server must exit 0 promptly.
  void stop() {
    if (!process_) return;
    process_->kill_group(SIGTERM);
    auto exit = process_->wait_for(30s);
    ASSERT_TRUE(exit.has_value()) << "kz serve-model did not stop on SIGTERM";
    EXPECT_TRUE(exit->exited && exit->exit_code == 0) << exit->describe() << "\n" << process_->stderr_tail();
    process_.reset();
  }

  int port() const { return port_; }
  const std::string& stderr_text() const { return process_->stderr_tail(); }
  std::string url(const std::string& path) const { return fmt::format("http://127.0.0.1:{}{}", port_, path); }

  std::unique_ptr<Generator> client(int max_in_flight = 16) const {
    HttpGeneratorOptions o;
    o.base_url = url("/v1");
    o.model = "tiny";
    o.max_in_flight = max_in_flight;
    o.request_timeout_s = 120;
    o.max_retries = 0;
    auto g = make_http_generator(o);
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    return g.ok() ? std::move(*g) : nullptr;
  }

 private:
  std::optional<Process> process_;
  int port_ = 0;
};

TEST_F(ServeModelTest, ServerMatchesInProcessAndBatchesConcurrentRequests) {
  ServedModel server(model_);
  ASSERT_GT(server.port(), 0);
  auto [models_status, models_body] = http("GET", server.url("/v1/models"));
  EXPECT_EQ(models_status, 200);
  EXPECT_EQ(json::parse(models_body)["data"][0]["id"], "tiny");
  EXPECT_EQ(http("GET", server.url("/health")).first, 200);

  // Greedy through HTTP == transformers == in process: raw prompts and chat, with logprobs.
  auto client = server.client();
  ASSERT_TRUE(client);
  std::vector<GenerationRequest> requests;
  for (const auto& p : kPrompts) requests.push_back(raw(p));
  requests.push_back(chat());
  for (auto& r : requests) r.params.logprobs = true;
  auto served = client->generate(requests);
  auto g = local();
  ASSERT_TRUE(g);
  auto in_process = g->generate(requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(served[i].ok()) << served[i].status().to_string();
    ASSERT_TRUE(in_process[i].ok()) << in_process[i].status().to_string();
    const Completion &a = (*served[i])[0], &b = (*in_process[i])[0];
    const json& want = i < kPrompts.size() ? reference_["raw"][i] : reference_["chat"];
    EXPECT_EQ(a.text, want["text"].get<std::string>()) << requests[i].id;
    EXPECT_EQ(a.text, b.text) << requests[i].id;
    EXPECT_EQ(a.finish_reason, b.finish_reason);
    EXPECT_EQ(a.completion_tokens, b.completion_tokens);
    EXPECT_EQ(a.prompt_tokens, b.prompt_tokens);
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
    for (size_t t = 0; t < a.logprobs.size(); ++t) {
      EXPECT_EQ(a.logprobs[t].token, b.logprobs[t].token);
      EXPECT_NEAR(a.logprobs[t].logprob, b.logprobs[t].logprob, 1e-4);
    }
  }

  // 24 concurrent requests (n = 1 and n = 2 mixed): all answered, the same greedy texts, and
  // fewer generate() batches than requests.
  json before = json::parse(http("GET", server.url("/health")).second);
  std::vector<GenerationRequest> burst;
  for (int i = 0; i < 24; ++i) {
    GenerationRequest r = raw(kPrompts[i % kPrompts.size()]);
    r.id = fmt::format("burst-{}", i);
    r.params.n = 1 + i % 2;
    burst.push_back(r);
  }
  auto burst_results = client->generate(burst);
  for (size_t i = 0; i < burst.size(); ++i) {
    ASSERT_TRUE(burst_results[i].ok()) << burst_results[i].status().to_string();
    ASSERT_EQ(burst_results[i]->size(), static_cast<size_t>(burst[i].params.n));
    for (const auto& c : *burst_results[i])
      EXPECT_EQ(c.text, reference_["raw"][i % kPrompts.size()]["text"].get<std::string>()) << burst[i].id;
  }
  json after = json::parse(http("GET", server.url("/health")).second);
  size_t requests_served = after["requests"].get<size_t>() - before["requests"].get<size_t>();
  size_t batches = after["batches"].get<size_t>() - before["batches"].get<size_t>();
  EXPECT_EQ(requests_served, burst.size());
  EXPECT_LT(batches, burst.size()) << "concurrent requests were not batched";
  server.stop();
}

TEST_F(ServeModelTest, ServerAnswersOpenAIShapesAndErrors) {
  ServedModel server(model_);
  ASSERT_GT(server.port(), 0);
  // A completion with n, stop, seed and logprobs, read raw.
  json body = {{"model", "tiny"}, {"prompt", kPrompts[0]}, {"max_tokens", 8}, {"n", 3}, {"temperature", 0.8},
               {"seed", 3}, {"logprobs", 1}, {"stop", {"\n"}}};
  auto [status, text] = http("POST", server.url("/v1/completions"), body.dump());
  ASSERT_EQ(status, 200) << text;
  json answer = json::parse(text);
  EXPECT_EQ(answer["object"], "text_completion");
  EXPECT_EQ(answer["model"], "tiny");
  ASSERT_EQ(answer["choices"].size(), 3u);
  int completion_tokens = 0;
  for (const auto& choice : answer["choices"]) {
    EXPECT_EQ(choice["text"].get<std::string>().find('\n'), std::string::npos);
    EXPECT_TRUE(choice["finish_reason"] == "stop" || choice["finish_reason"] == "length");
    completion_tokens += static_cast<int>(choice["logprobs"]["tokens"].size());
  }
  EXPECT_EQ(answer["usage"]["prompt_tokens"], reference_["raw"][0]["prompt_ids"].size());
  EXPECT_EQ(answer["usage"]["completion_tokens"], completion_tokens);
  EXPECT_EQ(answer["usage"]["total_tokens"], answer["usage"]["prompt_tokens"].get<int>() + completion_tokens);
  // Chat answers in chat's shape.
  json chat_body = {{"model", "tiny"},
                    {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hi"}}}}}}},
                    {"max_tokens", 4}, {"logprobs", true}};
  auto [chat_status, chat_text] = http("POST", server.url("/v1/chat/completions"), chat_body.dump());
  ASSERT_EQ(chat_status, 200) << chat_text;
  json chat_answer = json::parse(chat_text);
  EXPECT_EQ(chat_answer["object"], "chat.completion");
  EXPECT_EQ(chat_answer["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(chat_answer["choices"][0]["logprobs"]["content"].is_array());

  // stream: true answers in server-sent events whose pieces add up to the greedy text.
  for (bool chat : {false, true}) {
    json request = {{"max_tokens", kMaxNew}, {"temperature", 0}, {"stream", true},
                    {"stream_options", {{"include_usage", true}}}};
    if (chat) request["messages"] = {{{"role", "system"}, {"content", "You write CUDA kernels."}},
                                     {{"role", "user"}, {"content", "Write a ReLU kernel."}}};
    else request["prompt"] = kPrompts[0];
    Streamed streamed = http_stream(server.url(chat ? "/v1/chat/completions" : "/v1/completions"), request);
    ASSERT_EQ(streamed.status, 200) << streamed.body;
    StreamSummary got = summarize(streamed, chat);
    EXPECT_TRUE(got.done && got.usage);
    ASSERT_EQ(got.texts.size(), 1u) << streamed.body;
    EXPECT_EQ(got.texts[0], (chat ? reference_["chat"] : reference_["raw"][0])["text"].get<std::string>());
    EXPECT_FALSE(got.finish[0].empty());
  }

  // Errors: OpenAI's shape, 400 for the client's mistakes.
  auto expect_error = [&](const std::string& path, const std::string& request, long want, const std::string& words) {
    auto [s, t] = http("POST", server.url(path), request);
    EXPECT_EQ(s, want) << request << " -> " << t;
    json e = json::parse(t, nullptr, false);
    ASSERT_FALSE(e.is_discarded()) << t;
    ASSERT_TRUE(e.contains("error") && e["error"].contains("message")) << t;
    EXPECT_NE(e["error"]["message"].get<std::string>().find(words), std::string::npos) << t;
  };
  expect_error("/v1/completions", "{not json", 400, "not valid JSON");
  expect_error("/v1/completions", R"({"model": "tiny"})", 400, "\"prompt\" is required");
  expect_error("/v1/completions", R"({"prompt": "x", "temperature": "hot"})", 400, "temperature");
  expect_error("/v1/completions", R"({"prompt": "x", "n": 0})", 400, "\"n\"");
  expect_error("/v1/completions", R"({"prompt": "x", "stream": "yes"})", 400, "stream");
  expect_error("/v1/completions", R"({"prompt": "x", "ignore_eos": 1})", 400, "ignore_eos");
  expect_error("/v1/chat/completions", R"({"messages": []})", 400, "messages");
  expect_error("/v1/chat/completions", R"({"messages": [{"content": "x"}]})", 400, "role");
  expect_error("/v1/nothing", "{}", 404, "no route");
  // A prompt longer than the context (16,384 tokens) is the client's mistake too.
  std::string long_prompt;
  for (int i = 0; i < 5000; ++i) long_prompt += fmt::format("w{} ", i);
  expect_error("/v1/completions", json{{"prompt", long_prompt}}.dump(), 400, "context");

  // The HttpGenerator sees a 400 as a failed request, the others in the batch unaffected.
  auto client = server.client();
  GenerationRequest too_long = raw(long_prompt);
  auto results = client->generate({too_long, raw(kPrompts[1])});
  EXPECT_FALSE(results[0].ok());
  EXPECT_TRUE(results[1].ok());
  server.stop();
}

// A long greedy completion, streamed: the same text as without streaming, in many chunks of which
// the first arrives long before the end; a stop string across two tokens (and two host copies of
// tokens, 16 steps apart) cuts the streamed text exactly where it cuts the plain one.
TEST_F(ServeModelTest, ServerStreamsTextWhileGenerating) {
  ServedModel server(model_);
  ASSERT_GT(server.port(), 0);
  json request = {{"prompt", kPrompts[1]}, {"max_tokens", kLongMaxNew}, {"temperature", 0}, {"logprobs", 0}};
  auto [status, text] = http("POST", server.url("/v1/completions"), request.dump());
  ASSERT_EQ(status, 200) << text;
  json plain = json::parse(text);
  const std::string full = plain["choices"][0]["text"];
  const json& tokens = plain["choices"][0]["logprobs"]["tokens"];
  ASSERT_GT(tokens.size(), 40u) << "the greedy completion ended early: " << full;

  request["stream"] = true;
  request.erase("logprobs");
  Streamed streamed = http_stream(server.url("/v1/completions"), request);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  StreamSummary got = summarize(streamed, false);
  ASSERT_TRUE(got.done && got.first_text_at) << streamed.body;
  EXPECT_EQ(got.texts[0], full);
  EXPECT_EQ(got.finish[0], plain["choices"][0]["finish_reason"]);
  EXPECT_GT(got.text_chunks, 2u);
  auto total = streamed.events.back().at - streamed.sent;
  EXPECT_LT(*got.first_text_at - streamed.sent, total / 2)
      << "the first chunk came " << std::chrono::duration<double>(*got.first_text_at - streamed.sent).count()
      << " s after the request, the last " << std::chrono::duration<double>(total).count() << " s";

  // A stop string of two tokens' ASCII ends, from token 16 on: tokens 16 and 17 reach the host in
  // different copies (the prefill's token, then 16 per copy).
  auto ascii = [](const std::string& t) {
    return !t.empty() && std::all_of(t.begin(), t.end(), [](char c) { return c > 0 && c < 0x7f; });
  };
  size_t k = 16;
  while (k + 1 < tokens.size() && !(ascii(tokens[k]) && ascii(tokens[k + 1]))) ++k;
  ASSERT_LT(k + 1, tokens.size()) << "no two ASCII tokens in a row: " << full;
  std::string left = tokens[k], right = tokens[k + 1];
  std::string stop = left.substr(left.size() - std::min<size_t>(2, left.size())) + right.substr(0, 2);
  request["stop"] = {stop};
  request["stream"] = false;
  json cut = json::parse(http("POST", server.url("/v1/completions"), request.dump()).second);
  ASSERT_TRUE(cut.contains("choices")) << cut.dump();
  EXPECT_EQ(cut["choices"][0]["text"], full.substr(0, full.find(stop)));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
  request["stream"] = true;
  StreamSummary stopped = summarize(http_stream(server.url("/v1/completions"), request), false);
  ASSERT_EQ(stopped.texts.size(), 1u);
  EXPECT_EQ(stopped.texts[0], cut["choices"][0]["text"]);
  EXPECT_EQ(stopped.finish[0], "stop");
  server.stop();
}

// A client that hangs up mid-stream: the requests batched with it still get their whole answers,
// streamed and not, and the server goes on serving.
TEST_F(ServeModelTest, ServerKeepsServingWhenAStreamingClientLeaves) {
  ServedModel server(model_);
  ASSERT_GT(server.port(), 0);
  json leaving = {{"prompt", kPrompts[1]}, {"max_tokens", kLongMaxNew}, {"temperature", 0}, {"stream", true}};
  json staying = {{"prompt", kPrompts[0]}, {"max_tokens", kMaxNew}, {"temperature", 0}};
  json staying_stream = staying;
  staying_stream["stream"] = true;
  Streamed left, stayed_streaming;
  std::pair<long, std::string> stayed;
  {
    std::jthread a([&] { left = http_stream(server.url("/v1/completions"), leaving, /*stop_after=*/2); });
    std::jthread b([&] { stayed = http("POST", server.url("/v1/completions"), staying.dump()); });
    std::jthread c([&] { stayed_streaming = http_stream(server.url("/v1/completions"), staying_stream); });
  }
  EXPECT_GE(left.events.size(), 2u);
  EXPECT_FALSE(summarize(left, false).done) << "the stream ended before the client left";
  const std::string want = reference_["raw"][0]["text"];
  ASSERT_EQ(stayed.first, 200) << stayed.second;
  EXPECT_EQ(json::parse(stayed.second)["choices"][0]["text"], want);
  StreamSummary streamed = summarize(stayed_streaming, false);
  EXPECT_TRUE(streamed.done);
  ASSERT_EQ(streamed.texts.size(), 1u);
  EXPECT_EQ(streamed.texts[0], want);
  // Later requests are served, streamed or not, while or after the departed one's row runs out.
  StreamSummary again = summarize(http_stream(server.url("/v1/completions"), staying_stream), false);
  ASSERT_EQ(again.texts.size(), 1u);
  EXPECT_EQ(again.texts[0], want);
  EXPECT_EQ(http("GET", server.url("/health")).first, 200);
  server.stop();
}

// Each request run by itself: what a batch must give every one of them.
std::vector<Completion> each_alone(Generator& g, const std::vector<GenerationRequest>& requests) {
  std::vector<Completion> alone;
  for (const auto& r : requests) {
    auto result = g.generate({r});
    EXPECT_TRUE(result[0].ok()) << result[0].status().to_string();
    if (!result[0].ok()) return alone;
    alone.push_back((*result[0])[0]);
  }
  return alone;
}

// One in-process engine called from eight threads at once: each request gets what it gets alone.
TEST_F(ServeModelTest, ConcurrentEngineCallsMatchEachAlone) {
  auto g = local();
  ASSERT_TRUE(g);
  auto requests = varied_requests(*g);
  std::vector<Completion> alone = each_alone(*g, requests);
  ASSERT_EQ(alone.size(), requests.size());
  std::vector<Result<std::vector<Completion>>> together(requests.size(), std::vector<Completion>());
  {
    std::vector<std::jthread> threads;
    for (size_t i = 0; i < requests.size(); ++i)
      threads.emplace_back([&, i] { together[i] = std::move(g->generate({requests[i]})[0]); });
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(together[i].ok()) << together[i].status().to_string();
    expect_same_completion((*together[i])[0], alone[i], requests[i].id);
  }
}

// A request made while a long one decodes joins its batch: it returns while the long one still
// runs (a whole-batch queue would make it wait for all of the long one's 400 tokens).
TEST_F(ServeModelTest, EngineRequestJoinsALongOneAlreadyDecoding) {
  model::EngineOptions options;
  options.model_dir = model_;
  auto engine = model::Engine::load(options);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto request = [&](const std::string& prompt, int64_t max_new) {
    model::EngineRequest r;
    r.prompt_ids = (*engine)->tokenizer().encode(prompt);
    r.sampling.temperature = 0;
    r.sampling.max_new_tokens = max_new;
    r.sampling.stop_at_eos = false;  // the long one runs its full length
    return r;
  };
  model::EngineRequest short_request = request(kPrompts[0], 4);
  auto short_alone = (*engine)->generate({short_request});
  ASSERT_TRUE(short_alone[0].ok()) << short_alone[0].status().to_string();

  std::atomic<bool> long_started{false}, long_done{false};
  model::EngineRequest long_request = request(kPrompts[1], kLongMaxNew);
  long_request.on_text = [&](std::string_view, const model::EngineCompletion* finished) {
    long_started = true;
    if (finished) long_done = true;
  };
  std::jthread long_call([&] {
    auto result = (*engine)->generate({long_request});
    long_started = true;  // a failed call must not leave the wait below hanging
    EXPECT_TRUE(result[0].ok()) << result[0].status().to_string();
    if (result[0].ok()) {
      EXPECT_EQ(result[0]->token_ids.size(), static_cast<size_t>(kLongMaxNew));
    }
  });
  while (!long_started) std::this_thread::sleep_for(1ms);
  auto joined = (*engine)->generate({short_request});
  EXPECT_FALSE(long_done.load()) << "the short request waited for the long one's batch to end";
  ASSERT_TRUE(joined[0].ok()) << joined[0].status().to_string();
  EXPECT_EQ(joined[0]->token_ids, short_alone[0]->token_ids);
  EXPECT_EQ(joined[0]->text, short_alone[0]->text);
}

// Concurrent HTTP requests, half of them streamed, each get what they get alone in process; a
// request sent while a long stream decodes is answered before that stream ends.
TEST_F(ServeModelTest, ServerJoinsConcurrentRequestsIntoTheRunningBatch) {
  auto g = local();
  ASSERT_TRUE(g);
  auto requests = varied_requests(*g);
  std::vector<Completion> alone = each_alone(*g, requests);
  ASSERT_EQ(alone.size(), requests.size());
  ServedModel server(model_);
  ASSERT_GT(server.port(), 0);
  auto client = server.client();
  ASSERT_TRUE(client);
  auto to_json = [](const GenerationRequest& r) {
    json body = {{"prompt", r.prompt},   {"max_tokens", r.params.max_tokens}, {"temperature", r.params.temperature},
                 {"top_p", r.params.top_p}, {"seed", *r.params.seed},           {"stream", true}};
    if (r.params.top_k > 0) body["top_k"] = r.params.top_k;
    if (!r.params.stop.empty()) body["stop"] = r.params.stop;
    return body;
  };
  std::vector<Result<std::vector<Completion>>> plain(requests.size(), std::vector<Completion>());
  std::vector<Streamed> streamed(requests.size());
  {
    std::vector<std::jthread> threads;
    for (size_t i = 0; i < requests.size(); ++i)
      threads.emplace_back([&, i] {
        if (i % 2) streamed[i] = http_stream(server.url("/v1/completions"), to_json(requests[i]));
        else plain[i] = std::move(client->generate({requests[i]})[0]);
      });
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i % 2 == 0) {
      ASSERT_TRUE(plain[i].ok()) << plain[i].status().to_string();
      expect_same_completion((*plain[i])[0], alone[i], requests[i].id);
      continue;
    }
    ASSERT_EQ(streamed[i].status, 200) << streamed[i].body;
    StreamSummary got = summarize(streamed[i], false);
    EXPECT_TRUE(got.done) << requests[i].id;
    ASSERT_EQ(got.texts.size(), 1u) << requests[i].id;
    EXPECT_EQ(got.texts[0], alone[i].text) << requests[i].id;
    EXPECT_EQ(got.finish[0], alone[i].finish_reason) << requests[i].id;
  }

  json long_request = {{"prompt", kPrompts[1]}, {"max_tokens", kLongMaxNew}, {"temperature", 0}, {"stream", true}};
  Streamed long_stream;
  std::jthread long_call([&] { long_stream = http_stream(server.url("/v1/completions"), long_request); });
  json health;
  do {  // until the long request is in a batch
    std::this_thread::sleep_for(1ms);
    health = json::parse(http("GET", server.url("/health")).second);
  } while (health["running"].get<size_t>() == 0);
  auto joined = client->generate({requests[0]});
  auto answered = std::chrono::steady_clock::now();
  long_call.join();
  ASSERT_TRUE(joined[0].ok()) << joined[0].status().to_string();
  expect_same_completion((*joined[0])[0], alone[0], "joined " + requests[0].id);
  ASSERT_EQ(long_stream.status, 200) << long_stream.body;
  ASSERT_FALSE(long_stream.events.empty());
  EXPECT_LT(answered, long_stream.events.back().at) << "the request waited for the long one's batch to end";
  server.stop();
}

// configs/model.toml's keys through --config: the file's values apply, a flag given overrides its
// key, and a flag left out keeps the file's value (not the flag's default).
TEST_F(ServeModelTest, GenerateTakesAConfigFileAndFlagsOverrideIt) {
  fs::path config = dir_ / "generate.toml";
  std::string settings = "[sampling]\ntemperature = 0\nmax_new_tokens = 3\nignore_eos = true\n";
  ASSERT_TRUE(write_file_atomic(config, settings).is_ok());
  auto generate = [&](const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {KZ_BIN, "generate", "--model", model_.string(), "--prompt", kPrompts[0],
                                     "--config", config.string(), "--json"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return json::parse(run_ok(argv), nullptr, false);
  };
  // Greedy (temperature 0 from the file): transformers' first tokens.
  auto expect_greedy_tokens = [&](const json& got, size_t count) {
    ASSERT_FALSE(got.is_discarded());
    EXPECT_EQ(got["completion_tokens"], count);
    const json& greedy = reference_["raw"][0]["token_ids"];
    for (size_t i = 0; i < std::min(count, greedy.size()); ++i) EXPECT_EQ(got["token_ids"][i], greedy[i]) << i;
  };
  expect_greedy_tokens(generate({}), 3);
  expect_greedy_tokens(generate({"--max-new-tokens", "2"}), 2);

  fs::path bad = dir_ / "bad.toml";
  ASSERT_TRUE(write_file_atomic(bad, "[sampling]\ntemprature = 0\n").is_ok());
  auto r = run({KZ_BIN, "generate", "--model", model_.string(), "--prompt", "x", "--config", bad.string()});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->exit.exit_code, 2) << r->exit.describe();
  EXPECT_NE(r->stderr_text.find(bad.string()), std::string::npos) << r->stderr_text;
  EXPECT_NE(r->stderr_text.find("'sampling.temprature'"), std::string::npos) << r->stderr_text;

  // A flag is held to its key's bounds, as the file is.
  auto zero_top_p = run({KZ_BIN, "generate", "--model", model_.string(), "--prompt", "x", "--top-p", "0"});
  ASSERT_TRUE(zero_top_p.ok()) << zero_top_p.status().to_string();
  EXPECT_EQ(zero_top_p->exit.exit_code, 2) << zero_top_p->exit.describe() << zero_top_p->stderr_text;
  EXPECT_NE(zero_top_p->stderr_text.find("--top-p: config key 'sampling.top_p' must be > 0"), std::string::npos)
      << zero_top_p->stderr_text;
}

// --prompts FILE: every line in one engine call, each answer what the prompt gets alone with its
// seed and limit; a bad line is an error naming the file and the line.
TEST_F(ServeModelTest, GenerateRunsAPromptsFileInOneCallAsEachAlone) {
  fs::path prompts = dir_ / "prompts.jsonl";
  std::string lines = json({{"prompt", kPrompts[0]}, {"seed", 5}}).dump() + "\n\n" +
                      json({{"prompt", kPrompts[1]}, {"max_new_tokens", 3}}).dump() + "\n";
  ASSERT_TRUE(write_file_atomic(prompts, lines).is_ok());
  std::vector<std::string> common = {"--model", model_.string(), "--ignore-eos", "--json"};
  auto with = [&](std::vector<std::string> argv) {
    argv.insert(argv.begin(), {KZ_BIN, "generate"});
    argv.insert(argv.end(), common.begin(), common.end());
    return run_ok(argv);
  };
  std::istringstream out(with({"--prompts", prompts.string(), "--max-new-tokens", "6"}));
  std::vector<json> got;
  for (std::string line; std::getline(out, line);) got.push_back(json::parse(line));
  ASSERT_EQ(got.size(), 2u);
  json first = json::parse(with({"--prompt", kPrompts[0], "--seed", "5", "--max-new-tokens", "6"}));
  json second = json::parse(with({"--prompt", kPrompts[1], "--max-new-tokens", "3"}));
  EXPECT_EQ(got[0]["token_ids"], first["token_ids"]);
  EXPECT_EQ(got[0]["seed"], 5);
  EXPECT_EQ(got[1]["token_ids"], second["token_ids"]);
  EXPECT_EQ(got[1]["completion_tokens"], 3);

  fs::path bad = dir_ / "bad.jsonl";
  ASSERT_TRUE(write_file_atomic(bad, lines + "{\"prompt\": \"x\", \"seed\": -1}\n").is_ok());
  auto r = run({KZ_BIN, "generate", "--model", model_.string(), "--prompts", bad.string()});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_NE(r->exit.exit_code, 0) << r->exit.describe();
  EXPECT_NE(r->stderr_text.find(bad.string() + " line 4: \"seed\""), std::string::npos) << r->stderr_text;
}

// No --port: the default, 0 (any free port). max_batch from the file; the name from the flag, over the file's.
TEST_F(ServeModelTest, ServeModelTakesAConfigFileAndFlagsOverrideIt) {
  fs::path config = dir_ / "serve.toml";
  ASSERT_TRUE(write_file_atomic(config, "[serve]\nserved_model_name = \"from-config\"\nmax_batch = 3\n").is_ok());
  ServedModel server(model_, {"--config", config.string(), "--served-model-name", "tiny"});
  ASSERT_GT(server.port(), 0);
  EXPECT_NE(server.stderr_text().find("(max batch 3)"), std::string::npos) << server.stderr_text();
  EXPECT_EQ(json::parse(http("GET", server.url("/v1/models")).second)["data"][0]["id"], "tiny");
  server.stop();
}

TEST_F(ServeModelTest, LargePresetConfigsLoadInTransformers) {
  struct Want {
    const char* preset;
    int64_t parameters, vocab, hidden, layers;
    bool tied;
  };
  for (Want w : {Want{"qwen2.5-0.5b", 494032768, 151936, 896, 24, true},
                 Want{"qwen2.5-7b", 7615616512, 152064, 3584, 28, false}}) {
    fs::path dir = dir_ / w.preset;
    std::string out = run_ok({KZ_BIN, "init-model", "--preset", w.preset, "--out", dir.string(), "--config-only"});
    EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
    json got = json::parse(run_ok({KZ_PYTHON, KZ_HF_REFERENCE, "config", dir.string()}), nullptr, false);
    ASSERT_FALSE(got.is_discarded());
    EXPECT_EQ(got["parameters"], w.parameters) << w.preset;  // Qwen2.5's published sizes
    EXPECT_EQ(got["vocab_size"], w.vocab);
    EXPECT_EQ(got["hidden_size"], w.hidden);
    EXPECT_EQ(got["num_hidden_layers"], w.layers);
    EXPECT_EQ(got["tie_word_embeddings"], w.tied);
    EXPECT_LT(got["eos_token_id"].get<int64_t>(), got["tokenizer_vocab"].get<int64_t>());
    EXPECT_LE(got["tokenizer_vocab"].get<int64_t>(), w.vocab);
    EXPECT_NE(got["chat"].get<std::string>().find("<|im_start|>assistant\n"), std::string::npos);
  }
}

}  // namespace
}  // namespace kz
