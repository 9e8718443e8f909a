// The OpenAI-compatible endpoint (openai_server.h): request parsing, the batching queue, routes.
#include "kz/llm/openai_server.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <string_view>
#include <thread>

#include "kz/core/http_server.h"

namespace kz {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr size_t kMaxRequestBytes = size_t(64) << 20;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A 400 with the offending parameter (OpenAI's error shape carries it).
struct BadRequest {
  std::string message;
  std::string param;
};

json error_body(const std::string& message, const char* type, const std::string& param = "") {
  return json{{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
                         {"code", nullptr}}}};
}

void reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

// ---- request parsing ------------------------------------------------------------------------

struct Parsed {
  bool chat = false;
  std::vector<GenerationRequest> requests;  // one per prompt (chat: one)
  bool logprobs = false;
  bool stream = false;         // answer as server-sent events while generating
  bool stream_usage = false;   // stream_options.include_usage
};

// Reads an optional field of a given kind; absent and null leave `out` as it is.
template <class T, class Check>
std::optional<BadRequest> optional_field(const json& body, const char* key, T& out, Check valid, const char* what) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  try {
    bool ok_type = false;
    if constexpr (std::is_same_v<T, bool>) ok_type = it->is_boolean();
    else if constexpr (std::is_integral_v<T>) ok_type = it->is_number_integer();
    else ok_type = it->is_number();
    if (!ok_type) return BadRequest{fmt::format("\"{}\" must be {}", key, what), key};
    T value = it->get<T>();
    if (!valid(value)) return BadRequest{fmt::format("\"{}\" must be {}, got {}", key, what, it->dump()), key};
    out = value;
  } catch (const json::exception&) {
    return BadRequest{fmt::format("\"{}\" must be {}", key, what), key};
  }
  return std::nullopt;
}

std::optional<BadRequest> string_list(const json& body, const char* key, std::vector<std::string>& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    out = {it->get<std::string>()};
    return std::nullopt;
  }
  if (!it->is_array()) return BadRequest{fmt::format("\"{}\" must be a string or an array of strings", key), key};
  out.clear();
  for (const auto& v : *it) {
    if (!v.is_string()) return BadRequest{fmt::format("\"{}\" must be a string or an array of strings", key), key};
    out.push_back(v.get<std::string>());
  }
  return std::nullopt;
}

// A chat message's content: a string, or an array of {"type": "text", "text": ...} parts.
std::optional<BadRequest> message_content(const json& m, size_t i, std::string& out) {
  std::string param = fmt::format("messages[{}].content", i);
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return std::nullopt;  // e.g. an assistant turn with tool calls
  if (it->is_string()) {
    out = it->get<std::string>();
    return std::nullopt;
  }
  if (!it->is_array()) return BadRequest{param + " must be a string or an array of text parts", param};
  for (const auto& part : *it) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      return BadRequest{param + ": only {\"type\": \"text\", \"text\": ...} parts are supported", param};
    out += part["text"].get<std::string>();
  }
  return std::nullopt;
}

std::variant<Parsed, BadRequest> parse_request(const std::string& text, bool chat, const OpenAIServerOptions& o) {
  json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return BadRequest{"the request body is not valid JSON", ""};
  if (!body.is_object()) return BadRequest{"the request body must be a JSON object", ""};
  Parsed parsed;
  parsed.chat = chat;
  SamplingParams p;
  p.max_tokens = chat ? o.chat_default_max_tokens : o.default_max_tokens;
  int n = 1;
  std::optional<BadRequest> bad;
  auto non_negative = [](auto v) { return v >= 0; };
  if ((bad = optional_field(body, "max_tokens", p.max_tokens, [](int v) { return v >= 1; }, "an integer >= 1"))) return *bad;
  if (chat && (bad = optional_field(body, "max_completion_tokens", p.max_tokens, [](int v) { return v >= 1; },
                                    "an integer >= 1")))
    return *bad;
  if ((bad = optional_field(body, "temperature", p.temperature, non_negative, "a number >= 0"))) return *bad;
  if ((bad = optional_field(body, "top_p", p.top_p, [](double v) { return v > 0 && v <= 1; }, "a number in (0, 1]")))
    return *bad;
  if ((bad = optional_field(body, "top_k", p.top_k, [](int v) { return v >= -1; }, "an integer >= -1 (-1 or 0: off)")))
    return *bad;
  if (p.top_k < 0) p.top_k = 0;
  int max_n = o.max_n;
  if ((bad = optional_field(body, "n", n, [max_n](int v) { return v >= 1 && v <= max_n; },
                            fmt::format("an integer in [1, {}]", max_n).c_str())))
    return *bad;
  p.n = n;
  int64_t seed = 0;
  if ((bad = optional_field(body, "seed", seed, [](int64_t) { return true; }, "an integer"))) return *bad;
  if (body.contains("seed") && !body["seed"].is_null()) p.seed = static_cast<uint64_t>(seed);
  if ((bad = string_list(body, "stop", p.stop))) return *bad;
  if (chat) {
    bool lp = false;
    if ((bad = optional_field(body, "logprobs", lp, [](bool) { return true; }, "a boolean"))) return *bad;
    p.logprobs = lp;
  } else {
    int lp = -1;
    if ((bad = optional_field(body, "logprobs", lp, [](int v) { return v >= 0 && v <= 20; }, "an integer in [0, 20]")))
      return *bad;
    p.logprobs = lp >= 0;
  }
  parsed.logprobs = p.logprobs;
  bool flag = false;
  if ((bad = optional_field(body, "stream", flag, [](bool) { return true; }, "a boolean"))) return *bad;
  parsed.stream = flag;
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return BadRequest{"\"stream_options\" must be an object", "stream_options"};
    if ((bad = optional_field(*it, "include_usage", parsed.stream_usage, [](bool) { return true; }, "a boolean")))
      return *bad;
  }
  if ((bad = optional_field(body, "ignore_eos", p.ignore_eos, [](bool) { return true; }, "a boolean"))) return *bad;
  flag = false;
  if ((bad = optional_field(body, "echo", flag, [](bool) { return true; }, "a boolean"))) return *bad;
  if (flag) return BadRequest{"\"echo\" is not supported by this server", "echo"};
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    double v = 0;
    if ((bad = optional_field(body, key, v, [](double) { return true; }, "a number"))) return *bad;
    if (v != 0) return BadRequest{fmt::format("\"{}\" is not supported by this server (only 0)", key), key};
  }

  if (chat) {
    auto it = body.find("messages");
    if (it == body.end() || !it->is_array() || it->empty())
      return BadRequest{"\"messages\" must be a non-empty array of {\"role\", \"content\"} objects", "messages"};
    GenerationRequest r;
    for (size_t i = 0; i < it->size(); ++i) {
      const json& m = (*it)[i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        return BadRequest{fmt::format("messages[{}] must be an object with a string \"role\"", i), "messages"};
      ChatMessage message{m["role"].get<std::string>(), ""};
      if ((bad = message_content(m, i, message.content))) return *bad;
      r.messages.push_back(std::move(message));
    }
    r.params = p;
    parsed.requests.push_back(std::move(r));
  } else {
    auto it = body.find("prompt");
    std::vector<std::string> prompts;
    if (it == body.end()) return BadRequest{"\"prompt\" is required", "prompt"};
    if ((bad = string_list(body, "prompt", prompts)))
      return BadRequest{"\"prompt\" must be a string or an array of strings (token-id prompts are not supported)",
                        "prompt"};
    if (prompts.empty()) return BadRequest{"\"prompt\" is an empty array", "prompt"};
    for (auto& prompt : prompts) {
      if (prompt.empty()) return BadRequest{"\"prompt\" must not be empty", "prompt"};
      GenerationRequest r;
      r.prompt = std::move(prompt);
      r.params = p;
      parsed.requests.push_back(std::move(r));
    }
  }
  return parsed;
}

// ---- responses --------------------------------------------------------------------------------

json completion_logprobs(const Completion& c) {
  json tokens = json::array(), values = json::array(), offsets = json::array();
  size_t offset = 0;
  for (const auto& t : c.logprobs) {
    tokens.push_back(t.token);
    values.push_back(t.logprob);
    offsets.push_back(offset);
    offset += t.token.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", nullptr}, {"text_offset", offsets}};
}

json chat_logprobs(const Completion& c) {
  json content = json::array();
  for (const auto& t : c.logprobs) {
    json bytes = json::array();
    for (unsigned char ch : t.token) bytes.push_back(static_cast<int>(ch));
    content.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", bytes}, {"top_logprobs", json::array()}});
  }
  return {{"content", content}};
}

std::string random_id() {
  static std::mutex mutex;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard lock(mutex);
  return fmt::format("{:016x}", rng());
}

// OpenAI's usage: the prompt counted once per request, every choice's tokens.
json usage_of(const std::vector<std::vector<Completion>>& results) {
  int prompt_tokens = 0, completion_tokens = 0;
  for (const auto& completions : results) {
    if (!completions.empty()) prompt_tokens += completions.front().prompt_tokens;
    for (const auto& c : completions) completion_tokens += c.completion_tokens;
  }
  return {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json response_body(const Parsed& parsed, const std::vector<std::vector<Completion>>& results, const std::string& model) {
  json choices = json::array();
  int index = 0;
  for (const auto& completions : results) {
    for (const auto& c : completions) {
      json choice = {{"index", index++}, {"finish_reason", c.finish_reason}};
      if (parsed.chat) {
        choice["message"] = {{"role", "assistant"}, {"content", c.text}};
        choice["logprobs"] = parsed.logprobs ? chat_logprobs(c) : json(nullptr);
      } else {
        choice["text"] = c.text;
        choice["logprobs"] = parsed.logprobs ? completion_logprobs(c) : json(nullptr);
      }
      choices.push_back(std::move(choice));
    }
  }
  return {{"id", (parsed.chat ? "chatcmpl-" : "cmpl-") + random_id()},
          {"object", parsed.chat ? "chat.completion" : "text_completion"},
          {"created", static_cast<int64_t>(std::time(nullptr))},
          {"model", model},
          {"choices", choices},
          {"usage", usage_of(results)}};
}

// A failed request's HTTP status and body: 400 for the client's mistakes, 500 otherwise.
std::pair<int, json> error_reply(const Status& status) {
  bool client = status.code() == StatusCode::invalid_argument;
  return {client ? 400 : 500, error_body(status.message(), client ? "invalid_request_error" : "server_error")};
}

using Results = std::vector<Result<std::vector<Completion>>>;

// ---- streaming ----------------------------------------------------------------------------------

// One "stream": true response. The batcher thread turns each piece of a choice into a
// server-sent event here as the batch decodes; the connection's thread waits for the events and
// writes them out. The batcher never waits on the network, so a slow or departed client cannot
// hold up the batch: its events only queue here, and are dropped once it has gone. The stream
// ends as soon as its own choices are finished, not when the whole batch is.
class EventStream {
 public:
  EventStream(const Parsed& parsed, const std::string& model)
      : chat_(parsed.chat), logprobs_(parsed.logprobs), usage_(parsed.stream_usage),
        id_((parsed.chat ? "chatcmpl-" : "cmpl-") + random_id()), model_(model),
        created_(static_cast<int64_t>(std::time(nullptr))) {
    for (const auto& r : parsed.requests) {
      first_choice_.push_back(choices_.size());
      choices_.resize(choices_.size() + static_cast<size_t>(r.params.n));
    }
  }

  // The index in the answer of request `request`'s first choice.
  size_t first_choice(size_t request) const { return first_choice_.at(request); }

  // On the batcher thread: a piece of choice `choice` (its index in the answer).
  void add_piece(size_t choice, const CompletionPiece& piece) {
    std::lock_guard lock(mutex_);
    append_piece(choice, piece.text, piece.finished);
    changed_.notify_all();
  }

  // On the batcher thread: the batch is done. A failed request ends the stream with its error;
  // choices the generator did not stream are sent whole.
  void end(const Results& results) {
    std::lock_guard lock(mutex_);
    for (size_t i = 0; i < results.size() && !ended_; ++i)
      if (!results[i].ok()) fail(results[i].status());
    for (size_t i = 0; i < results.size() && i < first_choice_.size() && !ended_; ++i)
      for (size_t k = 0; k < results[i]->size() && first_choice_[i] + k < choice_end(i); ++k) {
        const Completion& c = (*results[i])[k];
        const Choice& choice = choices_[first_choice_[i] + k];
        if (!choice.finished)
          append_piece(first_choice_[i] + k, std::string_view(c.text).substr(std::min(choice.sent, c.text.size())), &c);
      }
    if (!ended_) fail(internal_error("the generator lost completions"));
    changed_.notify_all();
  }

  // On the connection's thread, before answering: waits for the first event or the end. A request
  // that failed before streaming anything is answered as a plain JSON error (its 400 or 500).
  std::optional<Status> wait_for_start() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return started_ || ended_; });
    if (started_) return std::nullopt;
    return failure_;
  }

  // httplib's chunked content provider: writes what is queued, waiting up to a second for more;
  // false once the client is gone (httplib then closes the connection).
  bool write_to(httplib::DataSink& sink) {
    std::string out;
    bool ended = false;
    {
      std::unique_lock lock(mutex_);
      changed_.wait_for(lock, std::chrono::seconds(1), [&] { return !events_.empty() || ended_; });
      out.swap(events_);
      ended = ended_;
    }
    if (!out.empty() && !sink.write(out.data(), out.size())) {
      abandon();
      return false;
    }
    if (ended) sink.done();
    return true;
  }

  // The client went away: later events are dropped instead of queued.
  void abandon() {
    std::lock_guard lock(mutex_);
    client_gone_ = true;
    events_.clear();
  }

 private:
  struct Choice {
    bool started = false;                 // a chunk of it was sent
    size_t sent = 0;                      // bytes of its text sent
    std::optional<Completion> finished;   // sent with its finish_reason
  };

  // One past request `request`'s last choice.
  size_t choice_end(size_t request) const {
    return request + 1 < first_choice_.size() ? first_choice_[request + 1] : choices_.size();
  }

  json chunk(json choices, json usage = nullptr) const {
    json out = {{"id", id_}, {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
                {"created", created_}, {"model", model_}, {"choices", std::move(choices)}};
    if (!usage.is_null()) out["usage"] = std::move(usage);
    return out;
  }

  void append_event(const json& data) {
    if (!client_gone_) events_ += "data: " + dump(data) + "\n\n";
  }

  // A choice's chunk: its new text; the last one also carries its finish_reason and, when asked,
  // the log-probs of all its tokens (the earlier chunks carry none, so joining every chunk's
  // log-probs gives them all). The last choice to finish ends the stream.
  void append_piece(size_t index, std::string_view text, const Completion* finished) {
    Choice& choice = choices_.at(index);
    if (text.empty() && !finished) return;
    json c = {{"index", index}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (finished) {
      c["finish_reason"] = finished->finish_reason;
      if (logprobs_) c["logprobs"] = chat_ ? chat_logprobs(*finished) : completion_logprobs(*finished);
    }
    if (chat_) {
      c["delta"] = json::object();
      if (!choice.started) c["delta"]["role"] = "assistant";
      if (!text.empty()) c["delta"]["content"] = std::string(text);
    } else {
      c["text"] = std::string(text);
    }
    choice.started = true;
    choice.sent += text.size();
    if (finished) choice.finished = *finished;
    started_ = true;
    append_event(chunk(json::array({c})));
    if (finished && std::all_of(choices_.begin(), choices_.end(), [](const Choice& x) { return x.finished.has_value(); }))
      finish_stream();
  }

  // An error event (OpenAI's error shape) ends the stream.
  void fail(const Status& status) {
    failure_ = status;
    append_event(error_reply(status).second);
    finish_stream();
  }

  // The usage (when asked and nothing failed), then [DONE].
  void finish_stream() {
    if (!failure_ && usage_) {
      std::vector<std::vector<Completion>> completions;
      for (size_t i = 0; i < first_choice_.size(); ++i) {
        completions.emplace_back();
        for (size_t k = first_choice_[i]; k < choice_end(i); ++k) completions.back().push_back(*choices_[k].finished);
      }
      append_event(chunk(json::array(), usage_of(completions)));
    }
    if (!client_gone_) events_ += "data: [DONE]\n\n";
    ended_ = true;
  }

  const bool chat_, logprobs_, usage_;
  const std::string id_, model_;
  const int64_t created_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<size_t> first_choice_;  // per request
  std::vector<Choice> choices_;
  std::string events_;  // formatted, not yet written
  std::optional<Status> failure_;
  bool started_ = false, ended_ = false, client_gone_ = false;
};

// ---- the batching queue -----------------------------------------------------------------------

struct Pending {
  std::vector<GenerationRequest> requests;
  size_t completions = 0;
  std::function<void(Results)> answer;  // called once, with one Result per request
};

}  // namespace

Status OpenAIServerOptions::validate() const {
  if (port < 0 || port > 65535) return invalid_argument(fmt::format("port {} is not in [0, 65535]", port));
  if (max_batch < 1) return invalid_argument(fmt::format("max_batch must be >= 1, got {}", max_batch));
  if (batch_wait_ms < 0) return invalid_argument("batch_wait_ms must be >= 0");
  if (concurrent_batches < 1)
    return invalid_argument(fmt::format("concurrent_batches must be >= 1, got {}", concurrent_batches));
  if (http_threads < 1) return invalid_argument("http_threads must be >= 1");
  if (max_n < 1) return invalid_argument("max_n must be >= 1");
  if (default_max_tokens < 1 || chat_default_max_tokens < 1) return invalid_argument("default max tokens must be >= 1");
  if (model_name.empty()) return invalid_argument("model_name must not be empty");
  return Status::ok();
}

struct OpenAIServer::Impl {
  Generator& generator;
  OpenAIServerOptions options;
  HttpServer http;
  int port = 0;
  std::thread listener;
  std::vector<std::thread> batchers;
  mutable std::mutex mutex;
  std::condition_variable arrived;
  std::deque<std::shared_ptr<Pending>> queue;
  size_t running = 0, requests = 0, batches = 0;
  bool stopping = false;
  std::atomic<bool> stopped{false};

  Impl(Generator& g, OpenAIServerOptions o) : generator(g), options(std::move(o)) {}

  // Queues requests for the batcher; `answer` gets their results, once.
  void enqueue(std::vector<GenerationRequest> reqs, std::function<void(Results)> answer) {
    auto pending = std::make_shared<Pending>();
    for (const auto& r : reqs) pending->completions += static_cast<size_t>(r.params.n);
    pending->requests = std::move(reqs);
    pending->answer = std::move(answer);
    bool queued = false;
    {
      std::lock_guard lock(mutex);
      if (!stopping) {
        queue.push_back(pending);
        queued = true;
      }
    }
    if (!queued) return pending->answer(Results(pending->requests.size(), internal_error("the server is stopping")));
    arrived.notify_all();
  }

  Results submit(std::vector<GenerationRequest> reqs) {
    auto done = std::make_shared<std::promise<Results>>();
    auto future = done->get_future();
    enqueue(std::move(reqs), [done](Results results) { done->set_value(std::move(results)); });
    return future.get();
  }

  size_t queued_completions() const {
    size_t total = 0;
    for (const auto& p : queue) total += p->completions;
    return total;
  }

  void batch_loop() {
    const auto wait = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(options.batch_wait_ms));
    const size_t max_batch = static_cast<size_t>(options.max_batch);
    for (;;) {
      std::vector<std::shared_ptr<Pending>> taken;
      {
        std::unique_lock lock(mutex);
        arrived.wait(lock, [&] { return stopping || !queue.empty(); });
        if (stopping) break;
        auto deadline = Clock::now() + wait;
        while (!stopping && queued_completions() < max_batch)
          if (arrived.wait_until(lock, deadline) == std::cv_status::timeout) break;
        if (stopping) break;
        size_t total = 0;
        while (!queue.empty() && (taken.empty() || total + queue.front()->completions <= max_batch)) {
          total += queue.front()->completions;
          taken.push_back(queue.front());
          queue.pop_front();
        }
        if (taken.empty()) continue;  // another batcher took them
        running += taken.size();
      }
      std::vector<GenerationRequest> batch;
      for (const auto& p : taken) batch.insert(batch.end(), p->requests.begin(), p->requests.end());
      Results results;
      try {
        results = generator.generate(batch);
      } catch (const std::exception& e) {
        results.assign(batch.size(), internal_error(std::string("generation failed: ") + e.what()));
      }
      if (results.size() != batch.size()) results.assign(batch.size(), internal_error("the generator lost requests"));
      size_t at = 0;
      for (const auto& p : taken) {
        Results mine(std::make_move_iterator(results.begin() + at),
                     std::make_move_iterator(results.begin() + at + p->requests.size()));
        at += p->requests.size();
        p->answer(std::move(mine));
      }
      std::lock_guard lock(mutex);
      running -= taken.size();
      requests += taken.size();
      ++batches;
    }
    // Stopping: whatever is still queued is answered with an error.
    std::lock_guard lock(mutex);
    for (auto& p : queue) p->answer(Results(p->requests.size(), internal_error("the server is stopping")));
    queue.clear();
  }

  void on_generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    auto parsed = parse_request(req.body, chat, options);
    if (auto* bad = std::get_if<BadRequest>(&parsed))
      return reply(res, 400, error_body(bad->message, "invalid_request_error", bad->param));
    Parsed& p = std::get<Parsed>(parsed);
    if (p.stream) return stream(p, res);
    Results results = submit(p.requests);
    std::vector<std::vector<Completion>> completions;
    for (auto& r : results) {
      if (!r.ok()) {
        auto [status, body] = error_reply(r.status());
        return reply(res, status, body);
      }
      completions.push_back(std::move(*r));
    }
    reply(res, 200, response_body(p, completions, options.model_name));
  }

  // "stream": true: the requests' pieces become events as the batch makes them, and httplib's
  // chunked provider writes them out on this connection's thread.
  void stream(Parsed& p, httplib::Response& res) {
    auto events = std::make_shared<EventStream>(p, options.model_name);
    for (size_t i = 0; i < p.requests.size(); ++i)
      p.requests[i].on_piece = [events, first = events->first_choice(i)](const CompletionPiece& piece) {
        events->add_piece(first + static_cast<size_t>(piece.index), piece);
      };
    enqueue(std::move(p.requests), [events](Results results) { events->end(results); });
    if (auto failed = events->wait_for_start()) {
      auto [status, body] = error_reply(*failed);
      return reply(res, status, body);
    }
    res.status = 200;
    res.set_chunked_content_provider(
        "text/event-stream", [events](size_t, httplib::DataSink& sink) { return events->write_to(sink); },
        [events](bool success) {
          if (!success) events->abandon();
        });
  }

  json health() const {
    std::lock_guard lock(mutex);
    return {{"status", "ok"},          {"model", options.model_name}, {"backend", generator.describe()},
            {"queued", queue.size()},  {"running", running},          {"requests", requests},
            {"batches", batches},      {"max_batch", options.max_batch}};
  }

  void add_routes() {
    using httplib::Request, httplib::Response;
    http.Post("/v1/completions", [this](const Request& req, Response& res) { on_generate(req, res, false); });
    http.Post("/v1/chat/completions", [this](const Request& req, Response& res) { on_generate(req, res, true); });
    http.Get("/v1/models", [this](const Request&, Response& res) {
      reply(res, 200, json{{"object", "list"},
                           {"data", {{{"id", options.model_name}, {"object", "model"}, {"created", 0},
                                      {"owned_by", "kernelzero"}}}}});
    });
    for (const char* path : {"/health", "/v1/health"})
      http.Get(path, [this](const Request&, Response& res) { reply(res, 200, health()); });
    http.set_error_handler([](const Request& req, Response& res) {
      if (!res.body.empty()) return;
      std::string message = res.status == 404 ? fmt::format("no route {} {}", req.method, req.path)
                                              : fmt::format("HTTP {} for {} {}", res.status, req.method, req.path);
      reply(res, res.status, error_body(message, res.status == 404 ? "not_found_error" : "invalid_request_error"));
    });
    http.set_exception_handler([](const Request&, Response& res, std::exception_ptr error) {
      reply(res, 500, error_body("internal error: " + exception_message(error), "server_error"));
    });
  }

  Status listen() {
    add_routes();
    auto bound = http.bind(options.host, options.port, options.http_threads, kMaxRequestBytes);
    if (!bound.ok()) return bound.status();
    port = *bound;
    return Status::ok();
  }

  void start_threads() {
    for (int i = 0; i < options.concurrent_batches; ++i) batchers.emplace_back([this] { batch_loop(); });
    listener = http.serve_in_background();
  }

  void stop() {
    if (stopped.exchange(true)) return;
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    arrived.notify_all();
    for (auto& batcher : batchers) batcher.join();  // running batches finish, the queue is answered
    http.stop();
    if (listener.joinable()) listener.join();
  }
};

OpenAIServer::OpenAIServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OpenAIServer::~OpenAIServer() { stop(); }

Result<std::unique_ptr<OpenAIServer>> OpenAIServer::start(Generator& generator, const OpenAIServerOptions& options) {
  KZ_RETURN_IF_ERROR(options.validate());
  ignore_sigpipe();
  auto impl = std::make_unique<Impl>(generator, options);
  KZ_RETURN_IF_ERROR(impl->listen());
  impl->start_threads();
  return std::unique_ptr<OpenAIServer>(new OpenAIServer(std::move(impl)));
}

int OpenAIServer::port() const { return impl_->port; }
void OpenAIServer::stop() { impl_->stop(); }
OpenAIServer::Counts OpenAIServer::counts() const {
  std::lock_guard lock(impl_->mutex);
  return {impl_->queue.size(), impl_->running, impl_->requests, impl_->batches};
}

}  // namespace kz
