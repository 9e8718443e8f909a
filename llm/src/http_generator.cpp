// The OpenAI-compatible HTTP backend: one curl multi handle per generate() call.
//
// Shape of a generate() call (a Batch): every request becomes one or more HTTP *calls*; each call
// is tried up to 1 + max_retries times (*attempts*). The thread that called generate() drives
// curl_multi_perform/curl_multi_poll itself, starting queued calls whenever fewer than
// max_in_flight are in flight and their backoff has passed; so there is no background thread
// and nothing outlives the call.
//
// Short answers: some servers ignore `n` and return one choice. A call that gets k < n choices
// spawns follow-up calls for the missing ones (in parallel, each asking for at most k), until n
// completions are gathered. Each follow-up's seed is the request's seed plus the number of
// completions asked for before it, so a seeded request still yields distinct samples. Usage is
// reported per HTTP call: every completion carries the usage of the call that produced it.
//
// Retries: HTTP 429/500/502/503/504, transport errors that a retry can cure (refused
// connection, timeout, reset, empty or cut reply) and a 200 whose body is not JSON (a truncated
// answer). Other 4xx fail at once. The wait is exponential with jitter, or Retry-After when the
// server sends it. Each attempt is one line of <log_dir>/requests.jsonl; the API key only ever
// lives in the Authorization header, never in a body or a log line.
#include "kz/llm/http_generator.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <system_error>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "curl_handles.h"
#include "kz/core/files.h"

namespace kz {

namespace curl {
void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}
}  // namespace curl

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr size_t kSnippetChars = 500;  // of a response body, in error messages
constexpr long kMaxPollMs = 1000;      // upper bound on one curl_multi_poll wait

// ---------------------------------------------------------------------------------------------
// Wire format

bool is_chat(const GenerationRequest& request) { return !request.messages.empty(); }

// Serialises without throwing on invalid UTF-8 (model output or user text may contain some).
std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string snippet(const std::string& body) {
  return body.size() <= kSnippetChars ? body : body.substr(0, kSnippetChars) + "...";
}

json request_body(const std::string& model, const GenerationRequest& request, int n,
                   std::optional<uint64_t> seed) {
  const SamplingParams& p = request.params;
  json body = {{"model", model}, {"n", n},           {"temperature", p.temperature},
               {"top_p", p.top_p}, {"max_tokens", p.max_tokens}};
  if (is_chat(request)) {
    body["messages"] = json::array();
    for (const ChatMessage& m : request.messages) body["messages"].push_back({{"role", m.role}, {"content", m.content}});
  } else {
    body["prompt"] = request.prompt;
  }
  if (!p.stop.empty()) body["stop"] = p.stop;
  if (p.top_k > 0) body["top_k"] = p.top_k;
  if (p.ignore_eos) body["ignore_eos"] = true;
  if (seed) body["seed"] = *seed;
  // The two endpoints spell it differently: a flag for chat, a top-k count for completions.
  if (p.logprobs) body["logprobs"] = is_chat(request) ? json(true) : json(1);
  return body;
}

// A string field that may be absent or null (servers differ): "" then.
std::string string_field(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::vector<TokenLogprob> parse_logprobs(const json& choice, bool chat) {
  std::vector<TokenLogprob> out;
  auto lp = choice.find("logprobs");
  if (lp == choice.end() || !lp->is_object()) return out;
  if (chat) {
    auto content = lp->find("content");
    if (content == lp->end() || !content->is_array()) return out;
    for (const json& t : *content) out.push_back({string_field(t, "token"), t.value("logprob", 0.0)});
    return out;
  }
  const json& tokens = lp->value("tokens", json::array());
  const json& values = lp->value("token_logprobs", json::array());
  for (size_t i = 0; i < tokens.size(); ++i) {
    // The first token's logprob is null when the server echoes the prompt.
    double v = i < values.size() && values[i].is_number() ? values[i].get<double>() : 0.0;
    out.push_back({tokens[i].is_string() ? tokens[i].get<std::string>() : "", v});
  }
  return out;
}

// The choices of one response. Throws json exceptions on a malformed shape (caller catches).
std::vector<Completion> parse_completions(const json& body, bool chat) {
  const json& usage = body.contains("usage") && body["usage"].is_object() ? body["usage"] : json::object();
  auto count = [&](const char* key) { return usage.contains(key) && usage[key].is_number() ? usage[key].get<int>() : 0; };
  std::vector<Completion> out;
  for (const json& choice : body.at("choices")) {
    Completion c;
    c.text = chat ? string_field(choice.at("message"), "content") : string_field(choice, "text");
    c.finish_reason = string_field(choice, "finish_reason");
    c.prompt_tokens = count("prompt_tokens");
    c.completion_tokens = count("completion_tokens");
    c.logprobs = parse_logprobs(choice, chat);
    out.push_back(std::move(c));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// What one attempt produced, and what to do about it

struct AttemptResult {
  CURLcode curl_code = CURLE_OK;
  std::string curl_error;   // libcurl's detailed message, "" on success
  long http_status = 0;     // 0: no HTTP response at all
  std::string body;
  double retry_after_s = 0; // Retry-After, 0 when absent
  double elapsed_s = 0;
};

enum class Disposition { done, retry, fail };

struct Outcome {
  Disposition what = Disposition::fail;
  Status error;                       // when not done
  std::vector<Completion> completions;  // when done
};

bool retryable_http(long status) {
  return status == 429 || status == 500 || status == 502 || status == 503 || status == 504;
}

// Transport failures that a later attempt may not hit; the rest (bad URL, unsupported protocol,
// certificate problems) would fail the same way again.
bool retryable_curl(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

Outcome transport_outcome(const AttemptResult& a) {
  std::string what = fmt::format("curl error {}: {}", static_cast<int>(a.curl_code),
                                 a.curl_error.empty() ? curl_easy_strerror(a.curl_code) : a.curl_error);
  Status error = a.curl_code == CURLE_OPERATION_TIMEDOUT ? timeout_error(what) : io_error(what);
  return {retryable_curl(a.curl_code) ? Disposition::retry : Disposition::fail, error, {}};
}

Outcome judge(const AttemptResult& a, bool chat) {
  if (a.curl_code != CURLE_OK) return transport_outcome(a);
  std::string what = fmt::format("HTTP {}: {}", a.http_status, snippet(a.body));
  if (a.http_status < 200 || a.http_status >= 300) {
    if (retryable_http(a.http_status)) return {Disposition::retry, io_error(what), {}};
    return {Disposition::fail, a.http_status < 500 ? invalid_argument(what) : io_error(what), {}};
  }
  json body = json::parse(a.body, nullptr, /*allow_exceptions=*/false);
  // A cut connection with a plausible Content-Length, or a proxy's truncation: worth another try.
  if (body.is_discarded()) return {Disposition::retry, parse_error("response is not valid JSON: " + what), {}};
  try {
    std::vector<Completion> completions = parse_completions(body, chat);
    if (completions.empty()) return {Disposition::fail, parse_error("response has no choices: " + what), {}};
    return {Disposition::done, Status::ok(), std::move(completions)};
  } catch (const json::exception& e) {
    return {Disposition::fail, parse_error(fmt::format("unexpected response shape ({}): {}", e.what(), what)), {}};
  }
}

// ---------------------------------------------------------------------------------------------
// The generator

class HttpGenerator final : public Generator {
 public:
  HttpGenerator(HttpGeneratorOptions options, curl::HeaderList headers)
      : options_(std::move(options)), headers_(std::move(headers)) {}

  std::vector<Result<std::vector<Completion>>> generate(const std::vector<GenerationRequest>& requests) override;
  std::string describe() const override { return "openai:" + options_.base_url + ":" + options_.model; }

  const HttpGeneratorOptions& options() const { return options_; }
  // Shared read-only by every transfer (libcurl never modifies a header list it is given).
  curl_slist* headers() const { return headers_.get(); }

  void log_attempt(const json& line) const {
    if (options_.log_dir.empty()) return;
    std::lock_guard lock(log_mutex_);
    // An audit line that cannot be written must not throw away tokens already generated; the
    // directory was checked at construction, so this is a disk-full class of problem.
    (void)append_line(options_.log_dir / "requests.jsonl", dump(line));
  }

 private:
  HttpGeneratorOptions options_;
  curl::HeaderList headers_;
  mutable std::mutex log_mutex_;
};

// One HTTP exchange asking for `n` completions of one request, with its retries.
struct Call {
  size_t request = 0;
  int index = 0;      // the request's index-th call (0, then follow-ups for short answers)
  int n = 1;
  std::string url;
  std::string body;   // serialised once: retries resend the same bytes
  int attempts = 0;   // attempts finished so far
  Clock::time_point not_before;
};

// A call's attempt in flight. Heap-allocated so libcurl's pointers into it stay valid.
struct Transfer {
  Call call;
  curl::EasyHandle easy;
  std::string response;
  char error[CURL_ERROR_SIZE] = {};
  Clock::time_point started;
};

struct RequestState {
  std::vector<Completion> completions;
  int calls = 0;           // calls made so far (numbers them in the log)
  uint64_t asked = 0;      // completions asked for so far: offsets the seed of follow-ups
  std::optional<Status> error;
};

size_t on_body(char* data, size_t size, size_t count, void* user) {
  static_cast<std::string*>(user)->append(data, size * count);
  return size * count;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Everything one generate() call needs; lives for that call only.
class Batch {
 public:
  Batch(const HttpGenerator& generator, const std::vector<GenerationRequest>& requests)
      : gen_(generator), opts_(generator.options()), requests_(requests), states_(requests.size()),
        multi_(curl_multi_init()), rng_(std::random_device{}()) {}

  ~Batch() {
    for (auto& [easy, transfer] : active_) curl_multi_remove_handle(multi_.get(), easy);
  }

  std::vector<Result<std::vector<Completion>>> run();

 private:
  void enqueue(size_t request, int n);
  void start_ready();
  Status launch(Call call);
  void collect_finished();
  void finish_attempt(std::unique_ptr<Transfer> transfer, CURLcode code);
  void on_success(const Call& call, std::vector<Completion> completions);
  void retry_or_fail(Call call, const Status& error, double retry_after_s);
  void fail(const Call& call, const Status& error);
  void log(const Transfer& t, const AttemptResult& a) const;
  double backoff_s(int retry);
  CURLMcode wait();
  void abort_all(const Status& error);

  const HttpGenerator& gen_;
  const HttpGeneratorOptions& opts_;
  const std::vector<GenerationRequest>& requests_;
  std::vector<RequestState> states_;
  std::vector<Call> pending_;  // queued calls, oldest first
  std::map<CURL*, std::unique_ptr<Transfer>> active_;
  curl::MultiHandle multi_;
  std::mt19937_64 rng_;
};

std::vector<Result<std::vector<Completion>>> Batch::run() {
  if (!multi_) {
    return std::vector<Result<std::vector<Completion>>>(requests_.size(), internal_error("curl_multi_init failed"));
  }
  for (size_t i = 0; i < requests_.size(); ++i) {
    if (requests_[i].params.n < 1) {
      states_[i].error = invalid_argument(fmt::format("request {}: n must be >= 1, got {}", requests_[i].id, requests_[i].params.n));
      continue;
    }
    enqueue(i, requests_[i].params.n);
  }
  while (!pending_.empty() || !active_.empty()) {
    start_ready();
    int running = 0;
    CURLMcode code = curl_multi_perform(multi_.get(), &running);
    collect_finished();
    if (code == CURLM_OK) code = wait();
    // The multi handle itself broke (out of memory, bad socket): nothing would ever finish.
    if (code != CURLM_OK) abort_all(internal_error(fmt::format("curl multi: {}", curl_multi_strerror(code))));
  }
  std::vector<Result<std::vector<Completion>>> results;
  for (RequestState& s : states_) {
    if (s.error) results.emplace_back(*s.error);
    else results.emplace_back(std::move(s.completions));
  }
  return results;
}

void Batch::enqueue(size_t request, int n) {
  const GenerationRequest& r = requests_[request];
  RequestState& s = states_[request];
  std::optional<uint64_t> seed;
  if (r.params.seed) seed = *r.params.seed + s.asked;
  Call call;
  call.request = request;
  call.index = s.calls++;
  call.n = n;
  call.url = opts_.base_url + (is_chat(r) ? "/chat/completions" : "/completions");
  call.body = dump(request_body(opts_.model, r, n, seed));
  call.not_before = Clock::now();
  s.asked += static_cast<uint64_t>(n);
  pending_.push_back(std::move(call));
}

// Starts queued calls whose backoff has passed, oldest first, up to max_in_flight.
void Batch::start_ready() {
  auto now = Clock::now();
  for (auto it = pending_.begin(); it != pending_.end() && active_.size() < static_cast<size_t>(opts_.max_in_flight);) {
    RequestState& s = states_[it->request];
    if (s.error) {  // another call of this request already failed it: drop the rest
      it = pending_.erase(it);
      continue;
    }
    if (it->not_before > now) {
      ++it;
      continue;
    }
    Call call = std::move(*it);
    it = pending_.erase(it);
    Status started = launch(call);
    if (!started.is_ok()) fail(call, started);
  }
}

Status Batch::launch(Call call) {
  auto t = std::make_unique<Transfer>();
  t->call = std::move(call);
  t->easy.reset(curl_easy_init());
  if (!t->easy) return internal_error("curl_easy_init failed");
  CURL* e = t->easy.get();
  curl_easy_setopt(e, CURLOPT_URL, t->call.url.c_str());
  curl_easy_setopt(e, CURLOPT_POST, 1L);
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, t->call.body.c_str());
  curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(t->call.body.size()));
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, gen_.headers());
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &t->response);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->error);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(opts_.request_timeout_s * 1000));
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(opts_.connect_timeout_s * 1000));
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);       // no SIGALRM: generate() may run on any thread
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);  // long generations: keep idle NATs from dropping us
  curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, "");
  t->started = Clock::now();
  if (curl_multi_add_handle(multi_.get(), e) != CURLM_OK) return internal_error("curl_multi_add_handle failed");
  active_.emplace(e, std::move(t));
  return Status::ok();
}

void Batch::collect_finished() {
  int left = 0;
  while (CURLMsg* msg = curl_multi_info_read(multi_.get(), &left)) {
    if (msg->msg != CURLMSG_DONE) continue;
    CURL* easy = msg->easy_handle;
    CURLcode code = msg->data.result;  // read before removal invalidates msg
    curl_multi_remove_handle(multi_.get(), easy);
    auto node = active_.extract(easy);
    if (!node.empty()) finish_attempt(std::move(node.mapped()), code);
  }
}

void Batch::finish_attempt(std::unique_ptr<Transfer> t, CURLcode code) {
  AttemptResult a;
  a.curl_code = code;
  a.curl_error = code == CURLE_OK ? "" : t->error;
  a.body = std::move(t->response);
  a.elapsed_s = seconds_since(t->started);
  curl_easy_getinfo(t->easy.get(), CURLINFO_RESPONSE_CODE, &a.http_status);
  curl_off_t retry_after = 0;
  if (curl_easy_getinfo(t->easy.get(), CURLINFO_RETRY_AFTER, &retry_after) == CURLE_OK) {
    a.retry_after_s = static_cast<double>(retry_after);
  }
  t->call.attempts++;
  log(*t, a);
  if (states_[t->call.request].error) return;  // failed meanwhile by a sibling call
  Outcome outcome = judge(a, is_chat(requests_[t->call.request]));
  switch (outcome.what) {
    case Disposition::done: on_success(t->call, std::move(outcome.completions)); break;
    case Disposition::retry: retry_or_fail(std::move(t->call), outcome.error, a.retry_after_s); break;
    case Disposition::fail: fail(t->call, outcome.error); break;
  }
}

void Batch::on_success(const Call& call, std::vector<Completion> completions) {
  RequestState& s = states_[call.request];
  int got = std::min(static_cast<int>(completions.size()), call.n);
  std::move(completions.begin(), completions.begin() + got, std::back_inserter(s.completions));
  // The server gave fewer than asked (it ignores or caps n): ask again for the rest, in pieces
  // no larger than what it just gave, so a server capping n at k needs ceil(rest / k) calls.
  for (int missing = call.n - got; missing > 0;) {
    int piece = std::min(missing, got);
    enqueue(call.request, piece);
    missing -= piece;
  }
}

void Batch::retry_or_fail(Call call, const Status& error, double retry_after_s) {
  if (call.attempts > opts_.max_retries) {
    fail(call, error);
    return;
  }
  // Retry-After is the server's own estimate, so it wins over our backoff when longer; capped so a
  // bogus value cannot stall the run for longer than a request may take anyway.
  double cap = std::max(opts_.backoff_max_s, opts_.request_timeout_s);
  double delay = std::max(backoff_s(call.attempts), std::min(retry_after_s, cap));
  call.not_before = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(delay));
  pending_.push_back(std::move(call));
}

// Exponential, with "equal jitter" (half fixed, half random) so clients that failed together
// do not retry in lockstep.
double Batch::backoff_s(int retry) {
  double base = std::min(opts_.backoff_max_s, opts_.backoff_initial_s * std::pow(2.0, retry - 1));
  return base / 2 + std::uniform_real_distribution<double>(0, base / 2)(rng_);
}

// The first failure of a request is its error; later calls of that request are dropped.
void Batch::fail(const Call& call, const Status& error) {
  if (states_[call.request].error) return;
  std::string attempts = call.attempts == 1 ? "1 attempt" : fmt::format("{} attempts", call.attempts);
  states_[call.request].error = error.with_context(fmt::format("request {}: POST {} ({})", requests_[call.request].id, call.url, attempts));
}

void Batch::log(const Transfer& t, const AttemptResult& a) const {
  json response = json::parse(a.body, nullptr, /*allow_exceptions=*/false);
  if (response.is_discarded()) response = a.body.empty() ? json(nullptr) : json(a.body);
  json line = {
      {"id", requests_[t.call.request].id},
      {"call", t.call.index},
      {"attempt", t.call.attempts},
      {"url", t.call.url},
      {"request", json::parse(t.call.body, nullptr, false)},
      {"status", a.http_status > 0 ? json(a.http_status) : json(nullptr)},
      {"error", a.curl_code == CURLE_OK ? json(nullptr) : json(a.curl_error.empty() ? curl_easy_strerror(a.curl_code) : a.curl_error)},
      {"response", std::move(response)},
      {"elapsed_s", a.elapsed_s},
  };
  gen_.log_attempt(line);
}

// Sleeps until a socket is ready, libcurl's own timers fire, or the next backoff ends.
CURLMcode Batch::wait() {
  if (pending_.empty() && active_.empty()) return CURLM_OK;
  long timeout_ms = kMaxPollMs;
  if (active_.size() < static_cast<size_t>(opts_.max_in_flight)) {
    auto now = Clock::now();
    for (const Call& c : pending_) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(c.not_before - now).count();
      timeout_ms = std::min<long>(timeout_ms, std::max<long>(0, ms + 1));
    }
  }
  if (timeout_ms <= 0) return CURLM_OK;
  return curl_multi_poll(multi_.get(), nullptr, 0, static_cast<int>(timeout_ms), nullptr);
}

void Batch::abort_all(const Status& error) {
  for (auto& [easy, transfer] : active_) {
    curl_multi_remove_handle(multi_.get(), easy);
    fail(transfer->call, error);
  }
  active_.clear();
  for (const Call& call : pending_) fail(call, error);
  pending_.clear();
}

std::vector<Result<std::vector<Completion>>> HttpGenerator::generate(const std::vector<GenerationRequest>& requests) {
  Batch batch(*this, requests);
  return batch.run();
}

// Content type, no "Expect: 100-continue" (some servers never answer it, costing a 1 s stall
// per large prompt), and the key.
Result<curl::HeaderList> make_headers(const std::string& api_key) {
  curl::HeaderList headers;
  bool ok = curl::append_header(headers, "Content-Type: application/json") && curl::append_header(headers, "Expect:");
  if (ok && !api_key.empty()) ok = curl::append_header(headers, ("Authorization: Bearer " + api_key).c_str());
  if (!ok) return internal_error("curl_slist_append failed");
  return headers;
}

bool starts_with(const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

Status HttpGeneratorOptions::validate() const {
  if (!starts_with(base_url, "http://") && !starts_with(base_url, "https://")) {
    return invalid_argument(fmt::format("base_url '{}' must start with http:// or https://", base_url));
  }
  if (model.empty()) return invalid_argument("model is empty");
  if (max_in_flight < 1) return invalid_argument(fmt::format("max_in_flight must be >= 1, got {}", max_in_flight));
  if (!(request_timeout_s > 0)) return invalid_argument(fmt::format("request_timeout_s must be > 0, got {}", request_timeout_s));
  if (!(connect_timeout_s > 0)) return invalid_argument(fmt::format("connect_timeout_s must be > 0, got {}", connect_timeout_s));
  if (max_retries < 0) return invalid_argument(fmt::format("max_retries must be >= 0, got {}", max_retries));
  if (!(backoff_initial_s >= 0)) return invalid_argument(fmt::format("backoff_initial_s must be >= 0, got {}", backoff_initial_s));
  if (!(backoff_max_s >= backoff_initial_s)) {
    return invalid_argument(fmt::format("backoff_max_s ({}) must be >= backoff_initial_s ({})", backoff_max_s, backoff_initial_s));
  }
  return Status::ok();
}

Result<HttpGeneratorOptions> parse_model_spec(const std::string& spec) {
  constexpr std::string_view kPrefix = "openai:";
  auto error = [&](const std::string& why) {
    return invalid_argument(fmt::format("model spec '{}': {} (expected openai:<base-url>:<model>)", spec, why));
  };
  if (!starts_with(spec, kPrefix)) return error("unknown backend");
  std::string rest = spec.substr(kPrefix.size());
  // The URL has colons of its own (scheme, port); the model name does not, so split at the last.
  size_t colon = rest.rfind(':');
  if (colon == std::string::npos) return error("no model");
  HttpGeneratorOptions options;
  options.base_url = rest.substr(0, colon);
  options.model = rest.substr(colon + 1);
  if (options.model.empty()) return error("empty model");
  // "openai:http://host:8000/v1" splits at the port's colon: "8000/v1" is not a model.
  if (std::isdigit(static_cast<unsigned char>(options.model[0])) && options.base_url.find("://") == options.base_url.rfind(':')) {
    size_t digits = options.model.find_first_not_of("0123456789");
    if (digits == std::string::npos || options.model[digits] == '/') return error("no model after the URL");
  }
  Status valid = options.validate();
  if (!valid.is_ok()) return error(valid.message());
  return options;
}

Result<std::unique_ptr<Generator>> make_http_generator(HttpGeneratorOptions options) {
  KZ_RETURN_IF_ERROR(options.validate().with_context("http generator options"));
  while (options.base_url.size() > 1 && options.base_url.back() == '/') options.base_url.pop_back();
  std::string api_key;
  if (!options.api_key_env.empty()) {
    const char* value = std::getenv(options.api_key_env.c_str());
    if (value == nullptr || *value == '\0') {
      return invalid_argument(fmt::format("API key environment variable {} is not set or empty (api_key_env)", options.api_key_env));
    }
    api_key = value;
  }
  if (!options.log_dir.empty()) {
    std::error_code ec;
    fs::create_directories(options.log_dir, ec);
    if (ec) return io_error(fmt::format("creating log directory {}: {}", options.log_dir.string(), ec.message()));
  }
  curl::global_init();
  auto headers = make_headers(api_key);
  if (!headers.ok()) return headers.status();
  return std::unique_ptr<Generator>(std::make_unique<HttpGenerator>(std::move(options), std::move(*headers)));
}

}  // namespace kz
