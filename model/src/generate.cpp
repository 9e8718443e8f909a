// Batched generation (prefill + cached decode, per-request sampling) and teacher-forced log-probs.
#include "kz/model/generate.h"

#include "kz/model/decode_loop.h"
#include "target_logprobs.h"
#include "torch_status.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <optional>

namespace kz::model {
namespace {

Status validate_requests(const std::vector<GenerateRequest>& requests, int64_t vocab_size) {
  if (requests.empty()) return invalid_argument("generate: no requests");
  for (size_t i = 0; i < requests.size(); ++i)
    KZ_RETURN_IF_ERROR(check_request(requests[i], vocab_size).with_context(fmt::format("generate: request {}", i)));
  return Status::ok();
}

// One request's progress.
struct Row {
  const GenerateRequest* request;
  GenerateResult result;
  bool done = false;
};

// Marks the row done when its last token is a stop token, it reached its limit or its stop_check
// says so.
void finish_if_done(Row& row) {
  const auto& stops = row.request->sampling.stop_token_ids;
  int64_t last = row.result.token_ids.back();
  if (std::find(stops.begin(), stops.end(), last) != stops.end()) {
    row.result.finish_reason = FinishReason::stop;
    row.done = true;
  } else if (static_cast<int64_t>(row.result.token_ids.size()) >= row.request->sampling.max_new_tokens) {
    row.result.finish_reason = FinishReason::length;
    row.done = true;
  } else if (row.request->stop_check && row.request->stop_check(row.result.token_ids)) {
    row.result.finish_reason = FinishReason::stop;
    row.done = true;
  }
}

// Appends tokens[j], logprobs[j] for j < n (host tensors [n]) to a running row until it is done,
// then hands it its result so far (generate.h's on_progress).
void append_tokens(Row& row, const at::Tensor& tokens, const at::Tensor& logprobs) {
  auto t = tokens.accessor<int64_t, 1>();
  auto lp = logprobs.accessor<float, 1>();
  for (int64_t j = 0; j < tokens.size(0) && !row.done; ++j) {
    row.result.token_ids.push_back(t[j]);
    row.result.logprobs.push_back(lp[j]);
    finish_if_done(row);
  }
  if (row.request->on_progress) row.request->on_progress(row.result, row.done);
}

at::Tensor index_tensor(const std::vector<int64_t>& values, at::Device device) {
  return at::tensor(values, at::kLong).to(device);
}

// Continuous batching over one KV cache of a fixed number of rows (at most max_batch_rows).
//
// Cache layout: one write cursor L (KVCache::length and slot) is shared by every row and each
// row's real slots end at it: a live row whose prompt has p tokens and which has n tokens so far
// (the last not yet fed back) holds slots [L - (p + n - 1), L), the rest of its key_mask is false,
// and its RoPE positions are its own (next_position), so where its slots sit changes nothing. A
// joiner's prompt, prefilled apart, is copied right-aligned into [L - p, L) of a freed row with
// next_position = p. A row that will feed back m more tokens needs L + m <= capacity. When L < p
// or the cache lacks that room, every row's slots are shifted, all by the same amount, so that
// they end at a new cursor C (the longest live extent or joiner prompt): in place, so a captured
// CUDA graph of the decode step stays valid. The capacity holds any request alone, so a joiner
// that finds no room fits once the live rows have finished. Freed rows keep decoding (masked
// garbage, never read) until a joiner takes them or the batch shrinks.
//
// With every request in one batch (max_batch_rows 0) all join at once into the empty cache: the
// same prefill, layout and decode as prefilling the batch in place.
//
// Requests from options.admit are stored here and wait like the call's own; when more wait than
// rows are free, the batch widens (its new rows copies of row 0, free) up to max_batch_rows.
class ContinuousBatch {
 public:
  ContinuousBatch(CausalLM& model, const std::vector<GenerateRequest>& requests, const GenerateOptions& options);
  Result<std::vector<GenerateResult>> run();

 private:
  // Distinct prompts prefilled together (left-padded, so each ends at slot cache.length), with
  // their last-position logits [n, V].
  struct Prefill {
    KVCache cache;
    at::Tensor logits;
  };
  struct PrefilledPrompt {
    std::shared_ptr<const Prefill> prefill;
    int64_t row;         // in prefill
    int64_t users_left;  // requests of this prompt that have not joined yet
  };
  // Slots a row holds left of the cursor, and tokens it still feeds back (one slot each).
  struct Extent {
    int64_t span, need;
  };

  Row& row(int64_t request) { return rows_[static_cast<size_t>(request - retired_)]; }
  const Row& row(int64_t request) const { return rows_[static_cast<size_t>(request - retired_)]; }
  int64_t prompt_of(int64_t request) const { return prompt_of_[static_cast<size_t>(request - retired_)]; }
  void add_request(const GenerateRequest& request);
  void retire_finished();
  Status take_admitted();
  Sampler sampler_of(const std::vector<int64_t>& requests) const;
  void grow_for_waiting();
  void reindex_rows(const std::vector<int64_t>& from, size_t copies);
  int64_t prompt_length(int64_t request) const;
  const PrefilledPrompt& prefilled(int64_t request) const;
  std::vector<int64_t> rows_where(bool occupied) const;
  Extent extent_of(int64_t request) const;
  std::vector<Extent> live_extents() const;
  std::optional<int64_t> room_cursor(const std::vector<Extent>& extents) const;
  size_t seatable(size_t limit) const;
  std::vector<int64_t> pick_joiners();
  Status prefill_missing(const std::vector<int64_t>& joiners);
  Status admit_waiting();
  void move_cursor(int64_t cursor);
  Status place(const std::vector<int64_t>& joiners, const at::Tensor& first, const Sampler& joined);
  void copy_prompts(const std::vector<int64_t>& requests, const std::vector<int64_t>& rows);
  void release_prompts(const std::vector<int64_t>& joiners);
  void shrink_to_live_rows();
  Status decode_chunk();
  Sampler& sampler() { return loop_ ? loop_->sampler() : *idle_sampler_; }

  CausalLM& model_;
  const GenerateOptions& options_;
  const size_t own_requests_;                      // the call's: ids 0 .. own_requests_ - 1
  bool filtered_;                                  // the sampler computes the top-k/top-p path
  // Requests by id (the call's, then admitted ones in arrival order) from `retired_` on: the
  // finished ones before the first unfinished are retired (retire_finished), so that a batch that
  // serving traffic keeps alive holds only what is still live or waiting, or finished after it.
  int64_t retired_ = 0;
  std::deque<GenerateRequest> admitted_;           // the admitted unretired requests; rows_ point into it
  std::deque<Row> rows_;                           // per unretired request (stable references as it grows)
  std::deque<int64_t> prompt_of_;                  // per unretired request: its prompt's index
  std::vector<GenerateResult> own_results_;        // the call's requests' results, as they retire
  // The distinct prompts of unretired requests: ids -> index, and by index its entry there and
  // how many unretired requests have it.
  struct Prompt {
    std::map<std::vector<int64_t>, int64_t>::iterator entry;
    int64_t users;
  };
  std::map<std::vector<int64_t>, int64_t> prompt_index_;
  std::map<int64_t, Prompt> prompts_;
  int64_t next_prompt_ = 0;
  std::map<int64_t, PrefilledPrompt> prefilled_;   // by prompt index, while a user waits
  std::deque<int64_t> waiting_;                    // requests, in order
  KVCache cache_;
  std::vector<int64_t> occupant_;                  // per cache row: its request, -1 when free
  at::Tensor last_;                                // [rows] int64: each row's token to feed next
  std::unique_ptr<DecodeLoop> loop_;               // null until the next decode_chunk
  std::optional<Sampler> idle_sampler_;            // the batch's sampler while loop_ is null
  GenerateStats stats_;
};

std::vector<SamplingOptions> sampling_of(const std::vector<GenerateRequest>& requests) {
  std::vector<SamplingOptions> out;
  for (const auto& r : requests) out.push_back(r.sampling);
  return out;
}

// The cache holds the longest prompt and the most new tokens at once (the last new token is never
// fed back, so it needs no slot): what any request needs alone, and every request in one batch.
int64_t cache_capacity(const std::vector<GenerateRequest>& requests) {
  int64_t prompt = 0, new_tokens = 0;
  for (const auto& r : requests) {
    prompt = std::max(prompt, static_cast<int64_t>(r.prompt_ids.size()));
    new_tokens = std::max(new_tokens, r.sampling.max_new_tokens);
  }
  return prompt + new_tokens - 1;
}

// Settings that, among a sampler's rows, make it compute the greedy and plain sampled paths.
std::vector<SamplingOptions> unfiltered_paths() {
  SamplingOptions greedy, plain;
  greedy.temperature = 0;
  return {greedy, plain};
}

// The row counts a batch with an admit hook takes: powers of two, so that serving traffic re-captures
// the decode graph at a few sizes rather than at each arrival and departure.
int64_t row_bucket(int64_t rows) {
  int64_t bucket = 1;
  while (bucket < rows) bucket *= 2;
  return bucket;
}

bool any_filtered(const std::vector<GenerateRequest>& requests) {
  return std::any_of(requests.begin(), requests.end(), [](const auto& r) { return r.sampling.filtered(); });
}

ContinuousBatch::ContinuousBatch(CausalLM& model, const std::vector<GenerateRequest>& requests,
                                 const GenerateOptions& options)
    : model_(model), options_(options), own_requests_(requests.size()), filtered_(any_filtered(requests)) {
  own_results_.resize(requests.size());
  for (const auto& r : requests) add_request(r);
  const auto n = static_cast<int64_t>(requests.size());
  const int64_t batch = options.max_batch_rows > 0 ? std::min(options.max_batch_rows, n) : n;
  cache_ = model.new_cache(batch, cache_capacity(requests));
  occupant_.assign(static_cast<size_t>(batch), -1);
  last_ = at::zeros({batch}, at::TensorOptions().device(model.device()).dtype(at::kLong));
  // Free rows hold request 0's settings until a joiner replaces them; the sampler keeps computing
  // every path some request needs (with an admit hook, the unfiltered ones too: the filtered one
  // once a request needs it, take_admitted).
  std::vector<SamplingOptions> settings = sampling_of(requests);
  if (options.admit)
    for (const auto& s : unfiltered_paths()) settings.push_back(s);
  idle_sampler_ = Sampler(settings, model.device()).select_rows(at::zeros({batch}, at::kLong));
}

// The request (stored by the caller or in admitted_) waits, its prompt shared with earlier ones.
void ContinuousBatch::add_request(const GenerateRequest& request) {
  auto [it, added] = prompt_index_.emplace(request.prompt_ids, next_prompt_);
  if (added) prompts_.emplace(next_prompt_++, Prompt{it, 0});
  prompt_of_.push_back(it->second);
  ++prompts_.at(it->second).users;
  // A prefill kept for waiting requests of this prompt serves this one too.
  if (auto kept = prefilled_.find(it->second); kept != prefilled_.end()) ++kept->second.users_left;
  waiting_.push_back(retired_ + static_cast<int64_t>(rows_.size()));
  rows_.push_back(Row{&request, {}});
}

// Drops the finished requests at the front (each had its last on_progress): a call's own keep
// their results for run() to return; an admitted one, delivered, goes with its prompt where no
// unretired request shares it.
void ContinuousBatch::retire_finished() {
  while (!rows_.empty() && rows_.front().done) {
    const int64_t request = retired_;
    if (request < static_cast<int64_t>(own_requests_)) own_results_[static_cast<size_t>(request)] = std::move(rows_.front().result);
    auto prompt = prompts_.find(prompt_of_.front());
    if (--prompt->second.users == 0) {
      prompt_index_.erase(prompt->second.entry);
      prompts_.erase(prompt);
    }
    rows_.pop_front();
    prompt_of_.pop_front();
    if (request >= static_cast<int64_t>(own_requests_)) admitted_.pop_front();
    ++retired_;
  }
}

// Takes the requests options.admit hands over (the header's contract checked: a broken one is a
// caller's bug, and fails the call).
Status ContinuousBatch::take_admitted() {
  if (!options_.admit) return Status::ok();
  for (GenerateRequest& request : options_.admit(cache_.capacity())) {
    KZ_RETURN_IF_ERROR(check_request(request, model_.config().vocab_size).with_context("generate: admitted request"));
    if (cache_slots_needed(request) > cache_.capacity())
      return internal_error(fmt::format("generate: an admitted request needs {} cache slots, the batch holds {}",
                                        cache_slots_needed(request), cache_.capacity()));
    if (request.sampling.filtered() && !filtered_) {  // the top-k/top-p path from now on: a new loop
      idle_sampler_ = sampler().with_filtering();
      loop_.reset();
      filtered_ = true;
    }
    admitted_.push_back(std::move(request));
    add_request(admitted_.back());
    ++stats_.admitted;
  }
  return Status::ok();
}

// A fresh sampler with the requests' settings, one row each (their token index 0).
Sampler ContinuousBatch::sampler_of(const std::vector<int64_t>& requests) const {
  std::vector<SamplingOptions> settings;
  for (int64_t request : requests) settings.push_back(row(request).request->sampling);
  return Sampler(settings, model_.device());
}

// When more requests could join than rows are free, widens the batch to the row bucket that seats
// them (up to max_batch_rows) with free rows copied from row 0: masked garbage, never read, until
// joiners take them. Only those the cache has room for count: rows for requests queued behind one
// that waits for room would decode garbage until it fits. Only admitted requests can make this
// happen: a call's own requests get min(max_batch_rows, count) rows.
void ContinuousBatch::grow_for_waiting() {
  const auto rows = static_cast<int64_t>(occupant_.size());
  const auto live = static_cast<int64_t>(rows_where(true).size());
  const int64_t needed = live + static_cast<int64_t>(seatable(waiting_.size()));
  if (needed <= rows) return;
  int64_t target = row_bucket(needed);
  if (options_.max_batch_rows > 0) target = std::min(target, options_.max_batch_rows);
  if (target <= rows) return;
  std::vector<int64_t> from(static_cast<size_t>(target), 0);
  for (int64_t i = 0; i < rows; ++i) from[static_cast<size_t>(i)] = i;
  reindex_rows(from, static_cast<size_t>(rows));
  ++stats_.grows;
}

// Row i of the batch becomes what row from[i] was (its cache, last token, sampler row and occupant);
// rows from `copies` on are copies, free. The next chunk builds a new loop for them.
void ContinuousBatch::reindex_rows(const std::vector<int64_t>& from, size_t copies) {
  at::Tensor index = index_tensor(from, model_.device());
  idle_sampler_ = sampler().select_rows(index);
  loop_.reset();  // it refers to cache_, replaced next
  cache_ = cache_.select_rows(index);
  last_ = last_.index_select(0, index);
  std::vector<int64_t> occupants(from.size(), -1);
  for (size_t i = 0; i < copies; ++i) occupants[i] = occupant_[static_cast<size_t>(from[i])];
  occupant_ = std::move(occupants);
}

int64_t ContinuousBatch::prompt_length(int64_t request) const {
  return static_cast<int64_t>(row(request).request->prompt_ids.size());
}

const ContinuousBatch::PrefilledPrompt& ContinuousBatch::prefilled(int64_t request) const {
  return prefilled_.at(prompt_of(request));
}

std::vector<int64_t> ContinuousBatch::rows_where(bool occupied) const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < occupant_.size(); ++i)
    if ((occupant_[i] >= 0) == occupied) out.push_back(static_cast<int64_t>(i));
  return out;
}

// A request that waits counts as having its first token, which comes from its prompt's prefill.
ContinuousBatch::Extent ContinuousBatch::extent_of(int64_t request) const {
  const Row& r = row(request);
  const int64_t tokens = std::max<int64_t>(static_cast<int64_t>(r.result.token_ids.size()), 1);
  return {prompt_length(request) + tokens - 1, r.request->sampling.max_new_tokens - tokens};
}

std::vector<ContinuousBatch::Extent> ContinuousBatch::live_extents() const {
  std::vector<Extent> out;
  for (int64_t request : occupant_)
    if (request >= 0) out.push_back(extent_of(request));
  return out;
}

// Where the cursor must be for every extent to fit: where it is when that fits (no moves), else
// the longest span, the lowest cursor that holds every row; nullopt when even that lacks room.
std::optional<int64_t> ContinuousBatch::room_cursor(const std::vector<Extent>& extents) const {
  int64_t span = 0, need = 0;
  for (const Extent& e : extents) {
    span = std::max(span, e.span);
    need = std::max(need, e.need);
  }
  if (span <= cache_.length && cache_.length + need <= cache_.capacity()) return cache_.length;
  if (span + need <= cache_.capacity()) return span;
  return std::nullopt;
}

// How many waiting requests, in order and at most `limit`, the cache has room for beside the live
// rows: one that does not fit stops the count, as it stops the intake (the ones behind it wait).
// With no live rows the first always fits: the capacity covers any request alone.
size_t ContinuousBatch::seatable(size_t limit) const {
  std::vector<Extent> extents = live_extents();
  size_t count = 0;
  for (int64_t request : waiting_) {
    if (count == limit) break;
    extents.push_back(extent_of(request));
    if (!room_cursor(extents)) break;
    ++count;
  }
  return count;
}

// Takes the waiting requests that free rows and room seat, in order.
std::vector<int64_t> ContinuousBatch::pick_joiners() {
  std::vector<int64_t> joiners;
  for (size_t n = seatable(rows_where(false).size()); n > 0; --n) {
    joiners.push_back(waiting_.front());
    waiting_.pop_front();
  }
  return joiners;
}

// Prefills, in one batch, the joiners' distinct prompts that no earlier prefill holds.
Status ContinuousBatch::prefill_missing(const std::vector<int64_t>& joiners) {
  std::vector<int64_t> missing;
  for (int64_t request : joiners) {
    int64_t prompt = prompt_of(request);
    if (!prefilled_.count(prompt) && std::find(missing.begin(), missing.end(), prompt) == missing.end())
      missing.push_back(prompt);
  }
  if (missing.empty()) return Status::ok();
  std::vector<std::vector<int64_t>> ids_of;
  for (int64_t prompt : missing) ids_of.push_back(prompts_.at(prompt).entry->first);
  auto [ids, mask] = left_pad(ids_of, options_.pad_token_id);
  auto prefill = std::make_shared<Prefill>();
  prefill->cache = model_.new_cache(ids.size(0), ids.size(1));
  auto logits = model_.prefill(ids, mask, prefill->cache);
  if (!logits.ok()) return logits.status();
  prefill->logits = *logits;
  auto users_of = [&](int64_t prompt) {  // requests of the prompt that have not joined yet
    auto of_prompt = [&](int64_t request) { return prompt_of(request) == prompt; };
    return std::count_if(joiners.begin(), joiners.end(), of_prompt) +
           std::count_if(waiting_.begin(), waiting_.end(), of_prompt);
  };
  for (size_t i = 0; i < missing.size(); ++i)
    prefilled_[missing[i]] = PrefilledPrompt{prefill, static_cast<int64_t>(i), users_of(missing[i])};
  stats_.prefilled_prompts += static_cast<int64_t>(missing.size());
  return Status::ok();
}

// Lets waiting requests join in free rows: their first token comes from their prompt's prefill
// logits; those that do not stop on it take a row.
Status ContinuousBatch::admit_waiting() {
  std::vector<int64_t> joiners = pick_joiners();
  if (joiners.empty()) return Status::ok();
  KZ_RETURN_IF_ERROR(prefill_missing(joiners));
  std::vector<at::Tensor> logits;
  for (int64_t request : joiners) {
    const PrefilledPrompt& p = prefilled(request);
    logits.push_back(p.prefill->logits[p.row]);
  }
  Sampler joined = sampler_of(joiners);
  auto [first, first_logprob] = joined.choose(at::stack(logits));
  at::Tensor tokens = first.to(at::kCPU), logprobs = first_logprob.to(at::kCPU);
  for (size_t i = 0; i < joiners.size(); ++i) {
    auto j = static_cast<int64_t>(i);
    append_tokens(row(joiners[i]), tokens.narrow(0, j, 1), logprobs.narrow(0, j, 1));
  }
  Status placed = place(joiners, first, joined);
  release_prompts(joiners);
  return placed;
}

// Shifts every row's slots so that they end at `cursor` (see the class comment), keeping the last
// min(L, cursor) slots of each row: all of a live row's, and at least the last slot of a freed one,
// whose mask then never goes empty.
void ContinuousBatch::move_cursor(int64_t cursor) {
  const int64_t length = cache_.length, kept = std::min(length, cursor);
  auto shift = [&](at::Tensor& t, int64_t dim) {
    at::Tensor window = t.narrow(dim, length - kept, kept).clone();  // source and target may overlap
    t.narrow(dim, cursor - kept, kept).copy_(window);
  };
  for (size_t layer = 0; layer < cache_.k.size(); ++layer) {
    shift(cache_.k[layer], 2);
    shift(cache_.v[layer], 2);
  }
  at::Tensor mask = cache_.key_mask.narrow(1, length - kept, kept).clone();
  cache_.key_mask.zero_();
  cache_.key_mask.narrow(1, cursor - kept, kept).copy_(mask);
  cache_.slot.fill_(cursor);
  cache_.length = cursor;
}

// Copies the still running joiners' prompts into free rows (moving the cursor first when they
// need room) and hands those rows the joiners' sampler rows and first tokens.
Status ContinuousBatch::place(const std::vector<int64_t>& joiners, const at::Tensor& first, const Sampler& joined) {
  std::vector<int64_t> running, positions;  // requests, and their index in joiners
  std::vector<Extent> extents = live_extents();
  const size_t live = extents.size();
  for (size_t i = 0; i < joiners.size(); ++i) {
    if (row(joiners[i]).done) continue;
    running.push_back(joiners[i]);
    positions.push_back(static_cast<int64_t>(i));
    extents.push_back(extent_of(joiners[i]));
  }
  if (running.empty()) return Status::ok();
  std::optional<int64_t> cursor = room_cursor(extents);
  if (!cursor) return internal_error("generate: joiners were picked without room in the cache");
  if (cache_.length > 0) stats_.joins += static_cast<int64_t>(running.size());
  if (*cursor != cache_.length) {
    stats_.compactions += live > 0;  // without live rows, only the cursor moves back
    move_cursor(*cursor);
  }
  std::vector<int64_t> free_rows = rows_where(false);
  free_rows.resize(running.size());
  copy_prompts(running, free_rows);
  const at::Device device = model_.device();
  at::Tensor rows = index_tensor(free_rows, device), picked = index_tensor(positions, device);
  KZ_RETURN_IF_ERROR(sampler().replace_rows(rows, joined.select_rows(picked)));
  last_.index_copy_(0, rows, first.index_select(0, picked));
  for (size_t i = 0; i < running.size(); ++i) occupant_[static_cast<size_t>(free_rows[i])] = running[i];
  return Status::ok();
}

// Request requests[i]'s prefilled prompt goes into cache row rows[i], right-aligned at the cursor,
// with its mask and next position. One copy per layer for the joiners of each prefill: both sides
// are right-aligned, so the window of the longest of their prompts carries every one of them.
void ContinuousBatch::copy_prompts(const std::vector<int64_t>& requests, const std::vector<int64_t>& rows) {
  std::map<const Prefill*, std::vector<size_t>> by_prefill;
  for (size_t i = 0; i < requests.size(); ++i) by_prefill[prefilled(requests[i]).prefill.get()].push_back(i);
  for (const auto& [prefill, members] : by_prefill) {
    std::vector<int64_t> to_rows, from_rows;
    int64_t width = 0;
    for (size_t i : members) {
      to_rows.push_back(rows[i]);
      from_rows.push_back(prefilled(requests[i]).row);
      width = std::max(width, prompt_length(requests[i]));
    }
    at::Tensor to = index_tensor(to_rows, model_.device()), from = index_tensor(from_rows, model_.device());
    auto copy_window = [&](at::Tensor& dst, const at::Tensor& src, int64_t dim) {
      at::Tensor window = src.narrow(dim, prefill->cache.length - width, width).index_select(0, from);
      dst.narrow(dim, cache_.length - width, width).index_copy_(0, to, window);
    };
    for (size_t layer = 0; layer < cache_.k.size(); ++layer) {
      copy_window(cache_.k[layer], prefill->cache.k[layer], 2);
      copy_window(cache_.v[layer], prefill->cache.v[layer], 2);
    }
    cache_.key_mask.index_fill_(0, to, false);
    copy_window(cache_.key_mask, prefill->cache.key_mask, 1);
    cache_.next_position.index_copy_(0, to, prefill->cache.next_position.index_select(0, from));
  }
}

// Drops the joiners' claims on their prefilled prompts; a prompt no waiting request shares is
// freed (its prefill once every prompt of it is).
void ContinuousBatch::release_prompts(const std::vector<int64_t>& joiners) {
  for (int64_t request : joiners) {
    auto it = prefilled_.find(prompt_of(request));
    if (--it->second.users_left == 0) prefilled_.erase(it);
  }
}

// Once nothing waits and at most half the rows are live, the live rows move to a cache of their
// own (and their sampler rows to a narrower sampler; the next chunk builds a new loop for them).
// With an admit hook the new cache is a row bucket with room for as many again (free rows copied
// from the first live one), so a batch shrinks once at most a quarter of its rows are live: an
// arrival after a departure does not undo the shrink.
void ContinuousBatch::shrink_to_live_rows() {
  std::vector<int64_t> live = rows_where(true);
  const auto count = static_cast<int64_t>(live.size());
  const auto rows = static_cast<int64_t>(occupant_.size());
  if (!waiting_.empty() || live.empty() || 2 * count > rows) return;
  const int64_t target = options_.admit ? row_bucket(2 * count) : count;
  if (target >= rows) return;
  std::vector<int64_t> from = live;
  from.resize(static_cast<size_t>(target), live.front());
  reindex_rows(from, live.size());
  ++stats_.shrinks;
}

// Decodes up to stop_check_steps steps, hands the rows their tokens and frees the finished rows.
Status ContinuousBatch::decode_chunk() {
  if (!loop_) {
    auto loop = DecodeLoop::create(model_, cache_, std::move(*idle_sampler_), {.cuda_graph = options_.cuda_graph});
    idle_sampler_.reset();
    if (!loop.ok()) return loop.status();
    loop_ = std::move(*loop);
  }
  // Live rows fit (room_cursor), so each has at least one free slot ahead of the cursor.
  const int64_t steps = std::min(std::max<int64_t>(options_.stop_check_steps, 1), cache_.capacity() - cache_.length);
  const auto batch = static_cast<int64_t>(occupant_.size());
  auto out = loop_->run(last_, steps);
  if (!out.ok()) return out.status();
  stats_.peak_rows = std::max(stats_.peak_rows, batch);
  stats_.decode_row_steps += steps * batch;
  last_ = out->tokens.select(1, steps - 1).contiguous();
  at::Tensor tokens = out->tokens.to(at::kCPU), logprobs = out->logprobs.to(at::kCPU);
  for (int64_t i = 0; i < batch; ++i) {
    int64_t& request = occupant_[static_cast<size_t>(i)];
    if (request < 0) continue;
    Row& r = row(request);
    append_tokens(r, tokens[i], logprobs[i]);
    if (r.done) request = -1;
  }
  return Status::ok();
}

Result<std::vector<GenerateResult>> ContinuousBatch::run() {
  c10::NoGradGuard no_grad;
  // Each round admits at least one waiting request when no row is live (pick_joiners), so this ends.
  for (;;) {
    KZ_RETURN_IF_ERROR(take_admitted());
    grow_for_waiting();
    KZ_RETURN_IF_ERROR(admit_waiting());
    retire_finished();
    if (rows_where(true).empty()) {
      if (waiting_.empty()) break;
      continue;  // every joiner stopped on its first token
    }
    shrink_to_live_rows();
    KZ_RETURN_IF_ERROR(decode_chunk());
    retire_finished();
  }
  if (options_.stats) *options_.stats = stats_;
  return std::move(own_results_);  // every request finished, so retired
}

}  // namespace

Status check_request(const GenerateRequest& request, int64_t vocab_size) {
  if (request.prompt_ids.empty()) return invalid_argument("empty prompt");
  for (int64_t id : request.prompt_ids)
    if (id < 0 || id >= vocab_size)
      return invalid_argument(fmt::format("token id {} outside the vocabulary [0, {})", id, vocab_size));
  return request.sampling.validate();
}

int64_t cache_slots_needed(const GenerateRequest& request) {
  return static_cast<int64_t>(request.prompt_ids.size()) + request.sampling.max_new_tokens - 1;
}

const char* finish_reason_name(FinishReason reason) { return reason == FinishReason::stop ? "stop" : "length"; }

std::pair<at::Tensor, at::Tensor> left_pad(const std::vector<std::vector<int64_t>>& sequences, int64_t pad_id) {
  size_t width = 0;
  for (const auto& s : sequences) width = std::max(width, s.size());
  const auto b = static_cast<int64_t>(sequences.size()), t = static_cast<int64_t>(width);
  at::Tensor ids = at::full({b, t}, pad_id, at::kLong);
  at::Tensor mask = at::zeros({b, t}, at::kLong);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<int64_t, 2>();
  for (int64_t i = 0; i < b; ++i) {
    const auto& s = sequences[static_cast<size_t>(i)];
    int64_t start = t - static_cast<int64_t>(s.size());
    for (size_t j = 0; j < s.size(); ++j) {
      ids_a[i][start + static_cast<int64_t>(j)] = s[j];
      mask_a[i][start + static_cast<int64_t>(j)] = 1;
    }
  }
  return {ids, mask};
}

Result<std::vector<GenerateResult>> generate(CausalLM& model, const std::vector<GenerateRequest>& requests,
                                             const GenerateOptions& options) {
  KZ_RETURN_IF_ERROR(validate_requests(requests, model.config().vocab_size));
  if (options.max_batch_rows < 0)
    return invalid_argument(fmt::format("generate: max_batch_rows must be >= 0, got {}", options.max_batch_rows));
  return guarded("generate", [&] { return ContinuousBatch(model, requests, options).run(); });
}

Result<at::Tensor> token_logprobs(CausalLM& model, const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                  bool keep_graph, double temperature) {
  return guarded("token_logprobs", [&]() -> Result<at::Tensor> {
    if (input_ids.dim() != 2 || input_ids.size(1) < 2)
      return invalid_argument("token_logprobs: input_ids must be [B, T] with T >= 2");
    if (!(temperature > 0)) return invalid_argument(fmt::format("token_logprobs: temperature {} must be > 0", temperature));
    c10::AutoGradMode grad_mode(keep_graph && c10::GradMode::is_enabled());
    auto logits = model.logits(input_ids, attention_mask);
    if (!logits.ok()) return logits.status().with_context("token_logprobs");
    return target_logprobs(*logits, input_ids, attention_mask, temperature).logprobs;
  });
}

}  // namespace kz::model
