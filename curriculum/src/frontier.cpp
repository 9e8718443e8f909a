// The frontier buffer: band and leakage checks on joining, ageing, capacity, replay selection.
#include "kz/curriculum/frontier.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "json_read.h"
#include "kz/curriculum/dedup.h"

namespace kz::curriculum {
namespace {

std::set<uint64_t> source_shingles(const std::string& source) {
  return kz::shingles(kz::normalize_source_tokens(source));
}

}  // namespace

const char* frontier_decision_name(FrontierDecision decision) {
  switch (decision) {
    case FrontierDecision::joined: return "joined";
    case FrontierDecision::out_of_band: return "out_of_band";
    case FrontierDecision::leak: return "leak";
  }
  return "unknown";
}

Status FrontierOptions::validate() const {
  if (!(band_low >= 0 && band_low <= 1))
    return invalid_argument(fmt::format("frontier: band_low must be in [0, 1], got {}", band_low));
  if (!(band_high >= band_low && band_high <= 1))
    return invalid_argument(
        fmt::format("frontier: band_high must be in [band_low ({}), 1], got {}", band_low, band_high));
  if (capacity < 1) return invalid_argument("frontier: capacity must be >= 1");
  if (max_age < 0) return invalid_argument(fmt::format("frontier: max_age must be >= 0, got {}", max_age));
  if (!(replay_share >= 0 && replay_share <= 1))
    return invalid_argument(fmt::format("frontier: replay_share must be in [0, 1], got {}", replay_share));
  if (!(leak_threshold > 0 && leak_threshold <= 1))
    return invalid_argument(fmt::format("frontier: leak_threshold must be in (0, 1], got {}", leak_threshold));
  return Status::ok();
}

Result<FrontierBuffer> FrontierBuffer::create(FrontierOptions options) {
  KZ_RETURN_IF_ERROR(options.validate());
  return FrontierBuffer(options);
}

void FrontierBuffer::add_held_out(const std::string& id, const std::string& source) {
  held_out_.push_back({id, source_shingles(source)});
}

void FrontierBuffer::add_held_out(const std::vector<Task>& tasks) {
  for (const auto& task : tasks) add_held_out(task.id, task.source);
}

std::optional<LeakMatch> FrontierBuffer::find_leak(const std::string& source) const {
  if (held_out_.empty()) return std::nullopt;
  auto mine = source_shingles(source);
  std::optional<LeakMatch> best;
  for (const auto& held : held_out_) {
    double similarity = kz::jaccard(mine, held.shingles);
    if (similarity >= options_.leak_threshold && (!best || similarity > best->similarity))
      best = LeakMatch{held.id, similarity};
  }
  return best;
}

Status FrontierBuffer::begin_iteration(int64_t iteration) {
  if (iteration < iteration_)
    return invalid_argument(fmt::format("frontier: begin_iteration({}) after iteration {}: iterations only go forward",
                                        iteration, iteration_));
  iteration_ = iteration;
  apply_limits();
  return Status::ok();
}

void FrontierBuffer::apply_limits() {
  // Entries are in joining order, so the aged and the oldest are at the front.
  while (!entries_.empty() && iteration_ - entries_.front().joined_iteration > options_.max_age) {
    ids_.erase(entries_.front().task.module_id);
    entries_.pop_front();
    ++counters_.aged_out;
  }
  while (entries_.size() > options_.capacity) {
    ids_.erase(entries_.front().task.module_id);
    entries_.pop_front();
    ++counters_.evicted;
  }
}

Result<FrontierOffer> FrontierBuffer::offer(FrontierTask task) {
  if (task.module_id.empty()) return invalid_argument("frontier: offered a module without an id");
  if (!(task.pass_rate >= 0 && task.pass_rate <= 1))
    return invalid_argument(fmt::format("frontier: module {}: pass rate {} is not in [0, 1]", task.module_id,
                                        task.pass_rate));
  if (task.attempts < 1)
    return invalid_argument(fmt::format("frontier: module {}: attempts must be >= 1, got {}", task.module_id,
                                        task.attempts));
  if (ids_.count(task.module_id))
    return invalid_argument(fmt::format("frontier: module {} is already in the buffer", task.module_id));

  FrontierOffer result;
  if (!(options_.band_low <= task.pass_rate && task.pass_rate <= options_.band_high)) {
    result.decision = FrontierDecision::out_of_band;
    result.reason = fmt::format("out_of_band: pass rate {:.3f} ({} attempts) is outside [{}, {}]", task.pass_rate,
                                task.attempts, options_.band_low, options_.band_high);
    ++counters_.rejected_out_of_band;
    return result;
  }
  if (auto leak = find_leak(task.source)) {
    result.decision = FrontierDecision::leak;
    result.held_out_id = leak->held_out_id;
    result.similarity = leak->similarity;
    result.reason = fmt::format("leak: {:.0f}% similar to held-out {} (normalised source; threshold {:.0f}%)",
                                100 * leak->similarity, leak->held_out_id, 100 * options_.leak_threshold);
    ++counters_.rejected_leak;
    return result;
  }
  if (entries_.size() >= options_.capacity) {
    result.evicted = entries_.front().task.module_id;
    ids_.erase(entries_.front().task.module_id);
    entries_.pop_front();
    ++counters_.evicted;
  }
  result.reason = "joined";
  ids_.insert(task.module_id);
  entries_.push_back({std::move(task), iteration_});
  ++counters_.joined;
  return result;
}

std::vector<FrontierEntry> FrontierBuffer::select(size_t n) {
  std::vector<size_t> replay, fresh;  // indices into entries_
  for (size_t i = 0; i < entries_.size(); ++i)
    (entries_[i].joined_iteration < iteration_ ? replay : fresh).push_back(i);
  size_t want_replay = std::min(n, static_cast<size_t>(std::llround(double(n) * options_.replay_share)));
  size_t take_replay = std::min(want_replay, replay.size());
  size_t take_fresh = std::min(n - take_replay, fresh.size());
  take_replay = std::min(n - take_fresh, replay.size());  // fresh ones short: replay fills in

  std::vector<FrontierEntry> chosen;
  auto draw = [&](std::vector<size_t>& pool, size_t count) {  // partial Fisher-Yates
    for (size_t j = 0; j < count; ++j) {
      size_t r = j + static_cast<size_t>(rng_.below(pool.size() - j));
      std::swap(pool[j], pool[r]);
      chosen.push_back(entries_[pool[j]]);
    }
  };
  draw(replay, take_replay);
  draw(fresh, take_fresh);
  return chosen;
}

FrontierStats FrontierBuffer::stats() const {
  FrontierStats s = counters_;
  s.size = entries_.size();
  return s;
}

nlohmann::json FrontierBuffer::to_json() const {
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& e : entries_)
    entries.push_back({{"module_id", e.task.module_id},
                       {"source", e.task.source},
                       {"apis", e.task.apis},
                       {"pass_rate", e.task.pass_rate},
                       {"attempts", e.task.attempts},
                       {"joined_iteration", e.joined_iteration}});
  return {{"iteration", iteration_},
          {"rng", {{"seed", rng_.seed()}, {"calls", rng_.calls()}}},
          {"stats",
           {{"joined", counters_.joined},
            {"rejected_out_of_band", counters_.rejected_out_of_band},
            {"rejected_leak", counters_.rejected_leak},
            {"aged_out", counters_.aged_out},
            {"evicted", counters_.evicted}}},
          {"entries", std::move(entries)}};
}

Result<FrontierBuffer> FrontierBuffer::from_json(const nlohmann::json& json, FrontierOptions options) {
  KZ_RETURN_IF_ERROR(options.validate());
  const std::string where = "frontier";
  FrontierBuffer buffer(options);
  KZ_RETURN_IF_ERROR(detail::read_count(json, "iteration", where, buffer.iteration_));

  auto rng = detail::member(json, "rng", where);
  if (!rng.ok()) return rng.status();
  uint64_t seed = 0, calls = 0;
  KZ_RETURN_IF_ERROR(detail::read_uint64(**rng, "seed", where + ".rng", seed));
  KZ_RETURN_IF_ERROR(detail::read_uint64(**rng, "calls", where + ".rng", calls));

  auto stats = detail::member(json, "stats", where);
  if (!stats.ok()) return stats.status();
  const std::string at_stats = where + ".stats";
  KZ_RETURN_IF_ERROR(detail::read_count(**stats, "joined", at_stats, buffer.counters_.joined));
  KZ_RETURN_IF_ERROR(
      detail::read_count(**stats, "rejected_out_of_band", at_stats, buffer.counters_.rejected_out_of_band));
  KZ_RETURN_IF_ERROR(detail::read_count(**stats, "rejected_leak", at_stats, buffer.counters_.rejected_leak));
  KZ_RETURN_IF_ERROR(detail::read_count(**stats, "aged_out", at_stats, buffer.counters_.aged_out));
  KZ_RETURN_IF_ERROR(detail::read_count(**stats, "evicted", at_stats, buffer.counters_.evicted));

  auto entries = detail::member(json, "entries", where);
  if (!entries.ok()) return entries.status();
  if (!(*entries)->is_array())
    return parse_error(fmt::format("{}.entries: expected an array, got {}", where, detail::shown(**entries)));
  for (size_t i = 0; i < (*entries)->size(); ++i) {
    const auto& item = (**entries)[i];
    std::string at = fmt::format("{}.entries[{}]", where, i);
    FrontierEntry e;
    int64_t attempts = 0;
    KZ_RETURN_IF_ERROR(detail::read_string(item, "module_id", at, e.task.module_id));
    KZ_RETURN_IF_ERROR(detail::read_string(item, "source", at, e.task.source));
    KZ_RETURN_IF_ERROR(detail::read_string_list(item, "apis", at, e.task.apis));
    KZ_RETURN_IF_ERROR(detail::read_number(item, "pass_rate", at, e.task.pass_rate, 0.0, 1.0));
    KZ_RETURN_IF_ERROR(detail::read_count(item, "attempts", at, attempts));
    KZ_RETURN_IF_ERROR(detail::read_count(item, "joined_iteration", at, e.joined_iteration));
    if (e.task.module_id.empty()) return parse_error(at + ".module_id: empty");
    if (attempts < 1 || attempts > std::numeric_limits<int>::max())
      return parse_error(fmt::format("{}.attempts: expected an integer >= 1, got {}", at, attempts));
    e.task.attempts = static_cast<int>(attempts);
    if (e.joined_iteration > buffer.iteration_)
      return parse_error(fmt::format("{}.joined_iteration: {} is after the buffer's iteration {}", at,
                                     e.joined_iteration, buffer.iteration_));
    if (!buffer.entries_.empty() && e.joined_iteration < buffer.entries_.back().joined_iteration)
      return parse_error(fmt::format("{}.joined_iteration: {} is before the previous entry's {} (entries are oldest "
                                     "first)",
                                     at, e.joined_iteration, buffer.entries_.back().joined_iteration));
    if (!buffer.ids_.insert(e.task.module_id).second)
      return parse_error(fmt::format("{}.module_id: {} appears twice", at, e.task.module_id));
    buffer.entries_.push_back(std::move(e));
  }
  if (seed != options.seed)
    return invalid_argument(fmt::format("{}: saved with seed {}, but the options' seed is {}; resume with the "
                                        "same seed",
                                        where, seed, options.seed));
  buffer.rng_ = CountedRng::restored(seed, calls);
  buffer.apply_limits();
  return buffer;
}

}  // namespace kz::curriculum
