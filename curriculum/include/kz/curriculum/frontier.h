// The frontier buffer: the Proposer's modules the Coder solves sometimes, not always, kept as the
// Coder's training tasks.
//
// A module is offered with its p̂ (the Coder's pass rate over m attempts) and joins iff
//   - band_low <= p̂ <= band_high (default 0.125..0.875: with m = 8, 1 to 7 correct), and
//   - it is not a leak: its source's similarity to every held-out source is below leak_threshold.
// Held-out sources are those the model is measured on (e.g. a suite's references, loaded by the
// caller with kz::load_tasks); similarity is dedup.h's: the Jaccard similarity of the sets of
// normalised token 5-grams (names renamed to placeholders, comments, docstrings and literals
// dropped), so a renamed copy of a held-out module is caught. The band is checked first: a
// module outside it is counted as out of band whatever its similarity.
//
// The buffer lives through iterations of the co-evolution loop. begin_iteration(i) starts
// iteration i: entries that joined more than max_age iterations before leave (aged out). Modules
// join at the current iteration; when the buffer is full, the oldest entry leaves first (evicted).
// select(N) picks the tasks of a Coder phase: round(N·replay_share) of them from entries that
// joined before the current iteration (replay), the rest from those that joined in it (the
// newest); when one group is short, the other fills in, and fewer than N come back only when the
// buffer holds fewer than N. Within each group the choice is uniform without repetition, from a
// seeded RNG (random.h). Selecting removes nothing.
//
// Checkpoints: to_json/from_json hold the entries, the iteration, the counters and the RNG state.
// The held-out sources are not part of it: the caller gives them again after from_json.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kz/core/status.h"
#include "kz/curriculum/random.h"
#include "kz/task/task.h"

namespace kz::curriculum {

struct FrontierOptions {
  double band_low = 0.125;      // lowest p̂ that joins, in [0, 1]
  double band_high = 0.875;     // highest p̂ that joins, in [band_low, 1]
  size_t capacity = 256;        // most entries held, >= 1; when full, the oldest leaves first
  int64_t max_age = 8;          // iterations an entry stays after the one it joined in, >= 0
  double replay_share = 0.25;   // in [0, 1]: share of a selection taken from entries of earlier iterations
  double leak_threshold = 0.8;  // in (0, 1]: similarity to a held-out source at which a module is rejected
  uint64_t seed = 0;            // the selection RNG's seed
  // invalid_argument naming the field out of range.
  Status validate() const;
};

// A module offered to the frontier: a Coder task.
struct FrontierTask {
  std::string module_id;
  std::string source;             // the reference module (Python)
  std::vector<std::string> apis;  // the PyTorch APIs it was asked to use
  double pass_rate = 0;           // p̂ in [0, 1]
  int attempts = 0;               // m >= 1: the Coder samples p̂ was measured over
};

struct FrontierEntry {
  FrontierTask task;
  int64_t joined_iteration = 0;
};

enum class FrontierDecision { joined, out_of_band, leak };
const char* frontier_decision_name(FrontierDecision decision);  // "joined", "out_of_band", "leak"

// What became of an offered module.
struct FrontierOffer {
  FrontierDecision decision = FrontierDecision::joined;
  // "joined", "out_of_band: p̂ 0.900 is outside [0.125, 0.875]", or
  // "leak: 93% similar to held-out 07_softmax (normalised source)".
  std::string reason;
  std::string held_out_id;               // leak: the held-out source it resembles most
  double similarity = 0;                 // leak: that similarity
  std::optional<std::string> evicted;    // joined into a full buffer: the id of the entry that left
};

// A held-out source a module resembles.
struct LeakMatch {
  std::string held_out_id;
  double similarity = 0;
};

// Cumulative counters (size is the current one).
struct FrontierStats {
  size_t size = 0;
  int64_t joined = 0;
  int64_t rejected_out_of_band = 0;
  int64_t rejected_leak = 0;
  int64_t aged_out = 0;
  int64_t evicted = 0;
};

class FrontierBuffer {
 public:
  // invalid_argument when the options fail validate().
  static Result<FrontierBuffer> create(FrontierOptions options);

  // Sources modules must not resemble (ids for the reasons). Adds to those given before.
  void add_held_out(const std::string& id, const std::string& source);
  void add_held_out(const std::vector<Task>& tasks);
  size_t held_out_size() const { return held_out_.size(); }
  // The held-out source `source` resembles most, when the similarity reaches leak_threshold.
  std::optional<LeakMatch> find_leak(const std::string& source) const;

  // Starts iteration `iteration` (>= the current one; the buffer starts at 0) and ages out the
  // entries that joined more than max_age iterations before it. invalid_argument when it goes back.
  Status begin_iteration(int64_t iteration);
  int64_t iteration() const { return iteration_; }

  // Offers a module at the current iteration. A rejection is a decision, not an error;
  // invalid_argument for an empty module id, p̂ outside [0, 1], attempts < 1, or a module id
  // already in the buffer.
  Result<FrontierOffer> offer(FrontierTask task);

  // The tasks of a Coder phase of size n (see above), replay first, each group in draw order.
  std::vector<FrontierEntry> select(size_t n);

  // Oldest first.
  const std::deque<FrontierEntry>& entries() const { return entries_; }
  FrontierStats stats() const;
  const FrontierOptions& options() const { return options_; }

  // {"iteration", "rng": {"seed", "calls"}, "stats": {...}, "entries": [{"module_id", "source",
  // "apis", "pass_rate", "attempts", "joined_iteration"}, ...]}
  nlohmann::json to_json() const;
  // A buffer with `options` and the state of `json`, then the options' limits applied (entries
  // past capacity are evicted, entries past max_age aged out, and counted). parse_error naming the
  // key for malformed JSON (a missing or mistyped field, p̂ outside [0, 1], a repeated module id,
  // entries not oldest first or joined after the iteration); invalid_argument when it was saved
  // with another seed.
  static Result<FrontierBuffer> from_json(const nlohmann::json& json, FrontierOptions options);

 private:
  explicit FrontierBuffer(FrontierOptions options) : options_(options), rng_(options.seed) {}
  void apply_limits();

  struct HeldOut {
    std::string id;
    std::set<uint64_t> shingles;
  };

  FrontierOptions options_;
  CountedRng rng_;
  int64_t iteration_ = 0;
  std::deque<FrontierEntry> entries_;  // in joining order: oldest first
  std::set<std::string> ids_;          // module ids in entries_
  std::vector<HeldOut> held_out_;
  FrontierStats counters_;             // size unused: stats() fills it
};

}  // namespace kz::curriculum
