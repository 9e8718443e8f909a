// The frontier buffer: band edges, capacity eviction order, ageing, replay share, leakage
// rejection, JSON round trip and bad JSON.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "kz/curriculum/frontier.h"
#include "similar_modules.h"

namespace kz::curriculum {
namespace {

using test::kConvPool;
using test::kGeluMatmul;
using test::kGeluMatmulRenamed;

FrontierTask task(const std::string& id, double pass_rate = 0.5, const std::string& source = "") {
  return {id, source.empty() ? "# module " + id : source, {"torch.add"}, pass_rate, 8};
}

FrontierBuffer make_buffer(FrontierOptions options = {}) {
  auto buffer = FrontierBuffer::create(options);
  EXPECT_TRUE(buffer.ok()) << buffer.status().to_string();
  return std::move(buffer).value();
}

FrontierDecision offer(FrontierBuffer& buffer, FrontierTask t) {
  auto result = buffer.offer(std::move(t));
  EXPECT_TRUE(result.ok()) << result.status().to_string();
  return result.ok() ? result->decision : FrontierDecision::joined;
}

std::vector<std::string> ids(const std::vector<FrontierEntry>& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e.task.module_id);
  return out;
}

std::vector<std::string> ids(const std::deque<FrontierEntry>& entries) {
  return ids(std::vector<FrontierEntry>(entries.begin(), entries.end()));
}

TEST(Frontier, BandEdgesJoinOutsideDoesNot) {
  FrontierBuffer buffer = make_buffer();
  EXPECT_EQ(offer(buffer, task("low-edge", 1.0 / 8)), FrontierDecision::joined);
  EXPECT_EQ(offer(buffer, task("high-edge", 7.0 / 8)), FrontierDecision::joined);
  EXPECT_EQ(offer(buffer, task("exact-0.125", 0.125)), FrontierDecision::joined);
  EXPECT_EQ(offer(buffer, task("exact-0.875", 0.875)), FrontierDecision::joined);
  auto below = buffer.offer(task("below", 0.1));
  ASSERT_TRUE(below.ok());
  EXPECT_EQ(below->decision, FrontierDecision::out_of_band);
  EXPECT_EQ(below->reason.rfind("out_of_band: pass rate 0.100", 0), 0u) << below->reason;
  EXPECT_EQ(offer(buffer, task("above", 0.9)), FrontierDecision::out_of_band);
  EXPECT_EQ(offer(buffer, task("never", 0.0)), FrontierDecision::out_of_band);
  EXPECT_EQ(offer(buffer, task("always", 1.0)), FrontierDecision::out_of_band);
  FrontierStats stats = buffer.stats();
  EXPECT_EQ(stats.size, 4u);
  EXPECT_EQ(stats.joined, 4);
  EXPECT_EQ(stats.rejected_out_of_band, 4);
  EXPECT_EQ(ids(buffer.entries()), (std::vector<std::string>{"low-edge", "high-edge", "exact-0.125", "exact-0.875"}));
}

TEST(Frontier, FullBufferEvictsTheOldestFirst) {
  FrontierBuffer buffer = make_buffer({.capacity = 3});
  for (const char* id : {"m1", "m2", "m3"}) offer(buffer, task(id));
  ASSERT_TRUE(buffer.begin_iteration(1).is_ok());
  auto fourth = buffer.offer(task("m4"));
  ASSERT_TRUE(fourth.ok());
  EXPECT_EQ(fourth->evicted, std::optional<std::string>("m1"));
  auto fifth = buffer.offer(task("m5"));
  ASSERT_TRUE(fifth.ok());
  EXPECT_EQ(fifth->evicted, std::optional<std::string>("m2"));
  EXPECT_EQ(ids(buffer.entries()), (std::vector<std::string>{"m3", "m4", "m5"}));
  EXPECT_EQ(buffer.stats().evicted, 2);
  EXPECT_EQ(buffer.stats().size, 3u);
  // A rejected module evicts nothing.
  EXPECT_EQ(offer(buffer, task("m6", 0.95)), FrontierDecision::out_of_band);
  EXPECT_EQ(ids(buffer.entries()), (std::vector<std::string>{"m3", "m4", "m5"}));
  // An evicted id may join again.
  EXPECT_EQ(offer(buffer, task("m1")), FrontierDecision::joined);
}

TEST(Frontier, EntriesOlderThanMaxAgeLeave) {
  FrontierBuffer buffer = make_buffer({.max_age = 2});
  offer(buffer, task("born0"));
  ASSERT_TRUE(buffer.begin_iteration(1).is_ok());
  offer(buffer, task("born1"));
  EXPECT_EQ(buffer.entries().back().joined_iteration, 1);
  ASSERT_TRUE(buffer.begin_iteration(2).is_ok());  // born0 is 2 iterations old: stays
  EXPECT_EQ(ids(buffer.entries()), (std::vector<std::string>{"born0", "born1"}));
  ASSERT_TRUE(buffer.begin_iteration(3).is_ok());  // born0 is 3 old: leaves
  EXPECT_EQ(ids(buffer.entries()), (std::vector<std::string>{"born1"}));
  ASSERT_TRUE(buffer.begin_iteration(10).is_ok());
  EXPECT_TRUE(buffer.entries().empty());
  EXPECT_EQ(buffer.stats().aged_out, 2);
  EXPECT_EQ(buffer.stats().evicted, 0);
  EXPECT_EQ(buffer.begin_iteration(9).code(), StatusCode::invalid_argument);  // no going back
  EXPECT_TRUE(buffer.begin_iteration(10).is_ok());                            // the same one again is fine
}

// A buffer with `old` entries from iteration 0 and `fresh` from iteration 1 (the current one).
FrontierBuffer split_buffer(size_t old, size_t fresh, FrontierOptions options = {}) {
  FrontierBuffer buffer = make_buffer(options);
  for (size_t i = 0; i < old; ++i) offer(buffer, task("old" + std::to_string(i)));
  EXPECT_TRUE(buffer.begin_iteration(1).is_ok());
  for (size_t i = 0; i < fresh; ++i) offer(buffer, task("new" + std::to_string(i)));
  return buffer;
}

std::pair<int, int> count_old_new(const std::vector<FrontierEntry>& chosen) {
  int old = 0, fresh = 0;
  for (const auto& e : chosen) (e.joined_iteration < 1 ? old : fresh) += 1;
  return {old, fresh};
}

TEST(Frontier, SelectionTakesTheReplayShareFromEarlierIterations) {
  FrontierBuffer buffer = split_buffer(10, 10, {.seed = 9});
  for (int round = 0; round < 20; ++round) {
    auto chosen = buffer.select(8);
    ASSERT_EQ(chosen.size(), 8u);
    EXPECT_EQ(count_old_new(chosen), std::make_pair(2, 6));  // 0.25 · 8 = 2 replayed
    auto names = ids(chosen);
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), 8u) << "a task repeated";
  }
  EXPECT_EQ(count_old_new(buffer.select(4)), std::make_pair(1, 3));
  EXPECT_EQ(count_old_new(buffer.select(10)), std::make_pair(3, 7));  // 2.5 rounds to 3
  EXPECT_EQ(buffer.stats().size, 20u);                                // selecting removes nothing

  FrontierBuffer no_replay = split_buffer(10, 10, {.replay_share = 0});
  EXPECT_EQ(count_old_new(no_replay.select(8)), std::make_pair(0, 8));
  FrontierBuffer all_replay = split_buffer(10, 10, {.replay_share = 1});
  EXPECT_EQ(count_old_new(all_replay.select(8)), std::make_pair(8, 0));
}

TEST(Frontier, SelectionFallsBackToWhateverExists) {
  FrontierBuffer few_new = split_buffer(10, 1);
  EXPECT_EQ(count_old_new(few_new.select(8)), std::make_pair(7, 1));
  FrontierBuffer no_old = split_buffer(0, 10);
  EXPECT_EQ(count_old_new(no_old.select(8)), std::make_pair(0, 8));
  FrontierBuffer small = split_buffer(2, 3);
  auto all = ids(small.select(8));
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()),
            (std::set<std::string>{"old0", "old1", "new0", "new1", "new2"}));
  EXPECT_TRUE(make_buffer().select(8).empty());
}

TEST(Frontier, SelectionIsSeededAndCoversTheBuffer) {
  FrontierBuffer a = split_buffer(10, 10, {.seed = 4});
  FrontierBuffer b = split_buffer(10, 10, {.seed = 4});
  FrontierBuffer c = split_buffer(10, 10, {.seed = 5});
  std::map<std::string, int> seen;
  int differ = 0;
  for (int round = 0; round < 200; ++round) {
    auto chosen = ids(a.select(8));
    EXPECT_EQ(chosen, ids(b.select(8)));
    differ += chosen != ids(c.select(8));
    for (const auto& id : chosen) ++seen[id];
  }
  EXPECT_GT(differ, 150);
  EXPECT_EQ(seen.size(), 20u);  // every entry gets picked
  // Uniform within each group: each old entry about 200·2/10 = 40 times, each new one 200·6/10 = 120.
  EXPECT_NEAR(seen["old3"], 40, 20);
  EXPECT_NEAR(seen["new7"], 120, 30);
}

TEST(Frontier, ModulesResemblingHeldOutSourcesAreRejected) {
  FrontierBuffer buffer = make_buffer();
  buffer.add_held_out(std::vector<Task>{{"07_gelu_matmul", kGeluMatmul, "suite/07.py", 1, {}}});
  EXPECT_EQ(buffer.held_out_size(), 1u);
  auto leak = buffer.offer(task("renamed-copy", 0.5, kGeluMatmulRenamed));
  ASSERT_TRUE(leak.ok());
  EXPECT_EQ(leak->decision, FrontierDecision::leak);
  EXPECT_EQ(leak->held_out_id, "07_gelu_matmul");
  EXPECT_GE(leak->similarity, 0.8);
  EXPECT_EQ(leak->reason.rfind("leak: ", 0), 0u) << leak->reason;
  EXPECT_NE(leak->reason.find("07_gelu_matmul"), std::string::npos) << leak->reason;
  EXPECT_EQ(offer(buffer, task("conv", 0.5, kConvPool)), FrontierDecision::joined);
  // The band is checked first: a leaky module out of band counts as out of band.
  EXPECT_EQ(offer(buffer, task("copy-too-easy", 1.0, kGeluMatmul)), FrontierDecision::out_of_band);
  FrontierStats stats = buffer.stats();
  EXPECT_EQ(stats.rejected_leak, 1);
  EXPECT_EQ(stats.rejected_out_of_band, 1);
  EXPECT_EQ(ids(buffer.entries()), (std::vector<std::string>{"conv"}));

  // Without held-out sources the copy joins; at threshold 1 only an exact copy (once normalised) is a leak.
  FrontierBuffer open = make_buffer();
  EXPECT_EQ(offer(open, task("renamed-copy", 0.5, kGeluMatmulRenamed)), FrontierDecision::joined);
  FrontierBuffer strict = make_buffer({.leak_threshold = 1.0});
  strict.add_held_out("07_gelu_matmul", kGeluMatmul);
  auto exact = strict.find_leak(kGeluMatmul);  // an exact copy is caught at any threshold
  ASSERT_TRUE(exact.has_value());
  EXPECT_EQ(exact->similarity, 1.0);
  EXPECT_EQ(offer(strict, task("exact-copy", 0.5, kGeluMatmul)), FrontierDecision::leak);
}

TEST(Frontier, BadOffersAndOptionsAreErrors) {
  FrontierBuffer buffer = make_buffer();
  offer(buffer, task("m1"));
  EXPECT_EQ(buffer.offer(task("m1")).status().code(), StatusCode::invalid_argument);  // already in
  EXPECT_EQ(buffer.offer(task("")).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(buffer.offer(task("m2", 1.5)).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(buffer.offer(task("m2", std::nan(""))).status().code(), StatusCode::invalid_argument);
  FrontierTask no_attempts = task("m2");
  no_attempts.attempts = 0;
  EXPECT_EQ(buffer.offer(no_attempts).status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(buffer.stats().joined, 1);

  EXPECT_TRUE(FrontierOptions{}.validate().is_ok());
  EXPECT_EQ((FrontierOptions{.band_low = 0.6, .band_high = 0.4}.validate().code()), StatusCode::invalid_argument);
  EXPECT_EQ(FrontierOptions{.band_high = 1.2}.validate().code(), StatusCode::invalid_argument);
  EXPECT_EQ(FrontierOptions{.capacity = 0}.validate().code(), StatusCode::invalid_argument);
  EXPECT_EQ(FrontierOptions{.max_age = -1}.validate().code(), StatusCode::invalid_argument);
  EXPECT_EQ(FrontierOptions{.replay_share = -0.1}.validate().code(), StatusCode::invalid_argument);
  EXPECT_EQ(FrontierOptions{.leak_threshold = 0}.validate().code(), StatusCode::invalid_argument);
  EXPECT_EQ(FrontierBuffer::create({.capacity = 0}).status().code(), StatusCode::invalid_argument);
}

TEST(Frontier, JsonRoundTripContinuesTheSameSelections) {
  const FrontierOptions options{.capacity = 5, .max_age = 3, .seed = 77};
  FrontierBuffer buffer = make_buffer(options);
  buffer.add_held_out("held", kGeluMatmul);
  for (int it = 0; it < 4; ++it) {
    ASSERT_TRUE(buffer.begin_iteration(it).is_ok());
    for (int j = 0; j < 3; ++j) {
      std::string id = "m";  // (not "m" + to_string: gcc 12 warns falsely, -Wrestrict)
      id += std::to_string(it) + "-" + std::to_string(j);
      offer(buffer, task(id, 0.25 + 0.125 * j));
    }
    offer(buffer, task("easy" + std::to_string(it), 1.0));
    buffer.select(4);
  }
  offer(buffer, task("leaky", 0.5, kGeluMatmulRenamed));
  nlohmann::json json = buffer.to_json();
  auto back = FrontierBuffer::from_json(nlohmann::json::parse(json.dump()), options);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->to_json(), json);
  EXPECT_EQ(back->iteration(), 3);
  EXPECT_EQ(ids(back->entries()), ids(buffer.entries()));
  EXPECT_EQ(back->entries().front().task.source, buffer.entries().front().task.source);
  EXPECT_EQ(back->entries().front().task.apis, buffer.entries().front().task.apis);
  EXPECT_DOUBLE_EQ(back->entries().back().task.pass_rate, buffer.entries().back().task.pass_rate);
  FrontierStats a = buffer.stats(), b = back->stats();
  EXPECT_EQ(std::tie(a.size, a.joined, a.rejected_out_of_band, a.rejected_leak, a.aged_out, a.evicted),
            std::tie(b.size, b.joined, b.rejected_out_of_band, b.rejected_leak, b.aged_out, b.evicted));
  EXPECT_EQ(a.rejected_leak, 1);
  EXPECT_GT(a.evicted, 0);
  for (int round = 0; round < 5; ++round) EXPECT_EQ(ids(back->select(4)), ids(buffer.select(4)));
  // The held-out sources are the caller's to give again.
  EXPECT_EQ(back->held_out_size(), 0u);

  // Tighter options on restore apply at once, and are counted.
  auto smaller = FrontierBuffer::from_json(json, {.capacity = 2, .max_age = 3, .seed = 77});
  ASSERT_TRUE(smaller.ok());
  EXPECT_EQ(smaller->stats().size, 2u);
  EXPECT_EQ(smaller->stats().evicted, a.evicted + int64_t(a.size) - 2);
  auto kept = ids(buffer.entries());
  EXPECT_EQ(ids(smaller->entries()), (std::vector<std::string>(kept.end() - 2, kept.end())));  // the newest two
}

TEST(Frontier, MalformedJsonIsAParseErrorNamingTheKey) {
  FrontierBuffer buffer = make_buffer({.seed = 3});
  offer(buffer, task("m1"));
  ASSERT_TRUE(buffer.begin_iteration(2).is_ok());
  offer(buffer, task("m2"));
  const nlohmann::json good = buffer.to_json();
  ASSERT_TRUE(FrontierBuffer::from_json(good, {.seed = 3}).ok());

  struct Case {
    std::string what;
    nlohmann::json json;
    std::string mentions;
  };
  std::vector<Case> cases;
  auto edit = [&](std::string what, auto change, std::string mentions) {
    nlohmann::json j = good;
    change(j);
    cases.push_back({std::move(what), std::move(j), std::move(mentions)});
  };
  cases.push_back({"not an object", nlohmann::json::array(), "expected a JSON object"});
  edit("no entries", [](auto& j) { j.erase("entries"); }, "missing key 'entries'");
  edit("entries not an array", [](auto& j) { j["entries"] = nlohmann::json::object(); }, "entries");
  edit("no iteration", [](auto& j) { j.erase("iteration"); }, "iteration");
  edit("rng seed text", [](auto& j) { j["rng"]["seed"] = "3"; }, "rng.seed");
  edit("stats count negative", [](auto& j) { j["stats"]["evicted"] = -1; }, "stats.evicted");
  edit("pass rate above 1", [](auto& j) { j["entries"][0]["pass_rate"] = 1.5; }, "entries[0].pass_rate");
  edit("pass rate text", [](auto& j) { j["entries"][1]["pass_rate"] = "0.5"; }, "entries[1].pass_rate");
  edit("no attempts", [](auto& j) { j["entries"][0]["attempts"] = 0; }, "entries[0].attempts");
  edit("apis not strings", [](auto& j) { j["entries"][0]["apis"] = {1, 2}; }, "entries[0].apis");
  edit("no source", [](auto& j) { j["entries"][0].erase("source"); }, "missing key 'source'");
  edit("empty id", [](auto& j) { j["entries"][0]["module_id"] = ""; }, "module_id");
  edit("repeated id", [](auto& j) { j["entries"][1]["module_id"] = "m1"; }, "appears twice");
  edit("newest first", [](auto& j) { std::swap(j["entries"][0], j["entries"][1]); }, "oldest first");
  edit("joined in the future", [](auto& j) { j["entries"][1]["joined_iteration"] = 5; },
       "after the buffer's iteration");
  for (const auto& c : cases) {
    auto result = FrontierBuffer::from_json(c.json, {.seed = 3});
    ASSERT_FALSE(result.ok()) << c.what;
    EXPECT_EQ(result.status().code(), StatusCode::parse_error) << c.what << ": " << result.status().to_string();
    EXPECT_NE(result.status().message().find(c.mentions), std::string::npos)
        << c.what << ": " << result.status().message();
  }
  auto other_seed = FrontierBuffer::from_json(good, {.seed = 4});
  EXPECT_EQ(other_seed.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(other_seed.status().message().find("seed"), std::string::npos);
  EXPECT_EQ(FrontierBuffer::from_json(good, {.capacity = 0}).status().code(), StatusCode::invalid_argument);
}

}  // namespace
}  // namespace kz::curriculum
