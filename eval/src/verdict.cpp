// Verdict names and JSON conversion.
#include "kz/eval/verdict.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

namespace kz {
namespace {

constexpr std::array kStatusNames = {
#define KZ_X(name) #name,
    KZ_EVAL_STATUSES(KZ_X)
#undef KZ_X
};
constexpr std::array kCheckNames = {
#define KZ_X(name) #name,
    KZ_EVAL_CHECKS(KZ_X)
#undef KZ_X
};

template <class Enum, size_t N>
std::optional<Enum> find_name(const std::array<const char*, N>& names, std::string_view name) {
  for (size_t i = 0; i < N; ++i)
    if (name == names[i]) return static_cast<Enum>(i);
  return std::nullopt;
}

nlohmann::json timing_json(const TimingStats& t) {
  return {{"median_ms", t.median_ms}, {"mean_ms", t.mean_ms}, {"std_ms", t.std_ms}, {"min_ms", t.min_ms},
          {"max_ms", t.max_ms},       {"p10_ms", t.p10_ms},   {"p90_ms", t.p90_ms}, {"runs", t.runs}};
}

TimingStats timing_from_json(const nlohmann::json& j) {
  TimingStats t;
  t.median_ms = j.value("median_ms", 0.0);
  t.mean_ms = j.value("mean_ms", 0.0);
  t.std_ms = j.value("std_ms", 0.0);
  t.min_ms = j.value("min_ms", 0.0);
  t.max_ms = j.value("max_ms", 0.0);
  t.p10_ms = j.value("p10_ms", 0.0);
  t.p90_ms = j.value("p90_ms", 0.0);
  t.runs = j.value("runs", 0);
  return t;
}

// A JSON number, or 0 for null (NaN/Inf travel as null).
double number_or_zero(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}

// Where a stage comes in a worker's run; unknown names go last.
size_t stage_rank(const std::string& stage) {
  // await_memory: the wait for the GPU memory reservation, entered from load_reference (the reference
  // imported and its need estimated, nothing of it on the device yet), which goes on after it.
  static constexpr std::array kOrder = {"startup", "load_reference", "await_memory", "compile", "correctness", "timing",
                                        "recheck"};
  auto it = std::find(kOrder.begin(), kOrder.end(), stage);
  return static_cast<size_t>(it - kOrder.begin());
}

// A stage's parts (name -> seconds) as a JSON object, written only when there are any.
void write_parts(nlohmann::json& j, const char* key, const std::vector<std::pair<std::string, double>>& parts) {
  if (parts.empty()) return;
  j[key] = nlohmann::json::object();
  for (const auto& [part, seconds] : parts) j[key][part] = seconds;
}

void read_parts(const nlohmann::json& j, const char* key, std::vector<std::pair<std::string, double>>& parts) {
  if (!j.contains(key) || !j[key].is_object()) return;
  for (const auto& [part, seconds] : j[key].items())
    if (seconds.is_number()) parts.emplace_back(part, seconds.get<double>());
}

// The memory report's figures, by key: one table for both directions.
template <class Report>
auto memory_numbers(Report& m) {
  return std::array{std::pair{"reference_peak_mb", &m.reference_peak_mb}, std::pair{"budget_mb", &m.budget_mb},
                    std::pair{"slot_mb", &m.slot_mb},     std::pair{"capacity_mb", &m.capacity_mb},
                    std::pair{"card_mb", &m.card_mb},     std::pair{"peak_mb", &m.peak_mb},
                    std::pair{"wait_s", &m.wait_s}};
}

// Only the fields the worker reported: an absent figure stays absent, not 0.
nlohmann::json memory_json(const MemoryReport& m) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, field] : memory_numbers(m))
    if (*field) j[key] = **field;
  if (m.slots) j["slots"] = *m.slots;
  if (m.alone) j["alone"] = *m.alone;
  if (!m.estimate.empty()) j["estimate"] = m.estimate;
  return j;
}

// Diagnostics: a field of the wrong type is left out, never the verdict's failure.
MemoryReport memory_from_json(const nlohmann::json& j) {
  MemoryReport m;
  for (const auto& [key, field] : memory_numbers(m))
    if (j.contains(key) && j[key].is_number()) *field = j[key].get<double>();
  if (j.contains("slots") && j["slots"].is_number()) m.slots = static_cast<int>(j["slots"].get<double>());
  if (j.contains("alone") && j["alone"].is_boolean()) m.alone = j["alone"].get<bool>();
  if (j.contains("estimate") && j["estimate"].is_string()) m.estimate = j["estimate"].get<std::string>();
  return m;
}

// The profile's optional figures, by key: one table for both directions.
template <class Profile>
auto profile_numbers(Profile& p) {
  return std::array{std::pair{"gpu_wait_s", &p.gpu_wait_s},         std::pair{"gpu_exclusive_s", &p.gpu_exclusive_s},
                    std::pair{"prebuild_s", &p.prebuild_s},         std::pair{"prebuild_cpu_s", &p.prebuild_cpu_s},
                    std::pair{"started_s", &p.started_s},           std::pair{"prebuild_started_s", &p.prebuild_started_s}};
}

// The profile's stage parts (name -> seconds), by key: one table for both directions.
template <class Profile>
auto profile_parts(Profile& p) {
  return std::array{std::pair{"startup_s", &p.startup_s},           std::pair{"load_reference_s", &p.load_reference_s},
                    std::pair{"compile_s", &p.compile_s},           std::pair{"correctness_s", &p.correctness_s},
                    std::pair{"timing_s", &p.timing_s},             std::pair{"timing_after_hold_s", &p.timing_after_hold_s},
                    std::pair{"build_s", &p.build_s},               std::pair{"gpu_wait_by_stage_s", &p.gpu_wait_by_stage_s},
                    std::pair{"cpu_s", &p.cpu_s}};
}

// wall_s and stage_s always; every other figure only where it was measured.
nlohmann::json profile_json(const VerdictProfile& p) {
  nlohmann::json j = {{"wall_s", p.wall_s}, {"stage_s", nlohmann::json::object()}};
  for (const auto& [stage, seconds] : p.stage_s) j["stage_s"][stage] = seconds;
  for (const auto& [key, parts] : profile_parts(p)) write_parts(j, key, *parts);
  for (const auto& [key, field] : profile_numbers(p))
    if (*field) j[key] = **field;
  if (!p.timing_end.empty())
    j.update({{"timing_end", p.timing_end},
              {"reference_gap_ms", p.reference_gap_ms},
              {"candidate_gap_ms", p.candidate_gap_ms}});
  if (!p.launch_spin.empty()) j["launch_spin"] = p.launch_spin;
  return j;
}

// Telemetry: a field of the wrong type is left out, never the verdict's failure.
VerdictProfile profile_from_json(const nlohmann::json& j) {
  VerdictProfile p;
  p.wall_s = number_or_zero(j, "wall_s");
  read_parts(j, "stage_s", p.stage_s);
  // A JSON object keeps no order: put the stages back in the order they run.
  std::stable_sort(p.stage_s.begin(), p.stage_s.end(),
                   [](const auto& a, const auto& b) { return stage_rank(a.first) < stage_rank(b.first); });
  for (const auto& [key, parts] : profile_parts(p)) read_parts(j, key, *parts);
  for (const auto& [key, field] : profile_numbers(p))
    if (j.contains(key) && j[key].is_number()) *field = j[key].get<double>();
  p.timing_end = j.contains("timing_end") && j["timing_end"].is_string() ? j["timing_end"].get<std::string>() : "";
  p.reference_gap_ms = number_or_zero(j, "reference_gap_ms");
  p.candidate_gap_ms = number_or_zero(j, "candidate_gap_ms");
  p.launch_spin = j.contains("launch_spin") && j["launch_spin"].is_string() ? j["launch_spin"].get<std::string>() : "";
  return p;
}

}  // namespace

const char* status_name(EvalStatus status) { return kStatusNames[static_cast<size_t>(status)]; }
std::optional<EvalStatus> parse_status(std::string_view name) { return find_name<EvalStatus>(kStatusNames, name); }
const char* check_name(Check check) { return kCheckNames[static_cast<size_t>(check)]; }
std::optional<Check> parse_check(std::string_view name) { return find_name<Check>(kCheckNames, name); }

bool Verdict::has_check(Check check) const {
  return std::find(checks.begin(), checks.end(), check) != checks.end();
}

Verdict make_verdict(EvalStatus status, std::vector<Check> checks, std::string message) {
  Verdict v;
  v.status = status;
  v.checks = std::move(checks);
  v.message = std::move(message);
  return v;
}

nlohmann::json to_json(const Verdict& v) {
  nlohmann::json checks = nlohmann::json::array();
  for (Check c : v.checks) checks.push_back(check_name(c));
  nlohmann::json j = {
      {"task_id", v.task_id},       {"candidate", v.candidate},         {"format", v.format},
      {"device", v.device},         {"policy", v.policy},               {"status", status_name(v.status)},
      {"compiled", v.compiled},
      {"correct", v.correct},       {"stage", v.stage},                 {"checks", checks},
      {"message", v.message},       {"trials", v.trials},               {"trials_passed", v.trials_passed},
      {"max_abs_error", v.max_abs_error}, {"max_rel_norm_error", v.max_rel_norm_error},
      {"seed", v.seed},             {"cached", v.cached}};
  j["speedup"] = v.speedup ? nlohmann::json(*v.speedup) : nlohmann::json(nullptr);
  if (v.compile_speedup) j["compile_speedup"] = *v.compile_speedup;  // optional: [timing] baseline = "compile"
  if (v.custom_kernel_share) j["custom_kernel_share"] = *v.custom_kernel_share;  // optional: profiled audits only
  if (!v.unchecked.empty()) {                                                    // optional: a check could not run
    j["unchecked"] = nlohmann::json::object();
    for (const auto& [check, why] : v.unchecked) j["unchecked"][check_name(check)] = why;
  }
  if (v.memory) j["memory"] = memory_json(*v.memory);                              // optional: GPU memory reserved
  if (v.retried_alone) j["retried_alone"] = true;                                  // optional: out_of_memory_shared, run again alone
  j["runtime_ms"] = v.candidate_timing ? nlohmann::json(v.candidate_timing->median_ms) : nlohmann::json(nullptr);
  j["ref_runtime_ms"] = v.reference_timing ? nlohmann::json(v.reference_timing->median_ms) : nlohmann::json(nullptr);
  if (v.candidate_timing && v.reference_timing) {
    j["timing"] = {{"candidate", timing_json(*v.candidate_timing)}, {"reference", timing_json(*v.reference_timing)}};
    if (v.compiled_reference_timing) j["timing"]["compiled"] = timing_json(*v.compiled_reference_timing);
  } else {
    j["timing"] = nullptr;
  }
  j["profile"] = profile_json(v.profile);
  return j;
}

Result<Verdict> verdict_from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("status") || !j["status"].is_string())
    return parse_error("verdict has no string `status`");
  Verdict v;
  auto status = parse_status(j["status"].get<std::string>());
  if (!status) return parse_error(fmt::format("unknown verdict status '{}'", j["status"].get<std::string>()));
  v.status = *status;
  for (const auto& name : j.value("checks", nlohmann::json::array())) {
    auto check = name.is_string() ? parse_check(name.get<std::string>()) : std::nullopt;
    if (!check) return parse_error(fmt::format("unknown check name {}", name.dump()));
    v.checks.push_back(*check);
  }
  v.task_id = j.value("task_id", "");
  v.candidate = j.value("candidate", "");
  v.format = j.value("format", "");
  v.device = j.value("device", "");
  v.policy = j.value("policy", "");
  v.compiled = j.value("compiled", false);
  v.correct = j.value("correct", false);
  v.stage = j.value("stage", "");
  v.message = j.value("message", "");
  v.trials = j.value("trials", 0);
  v.trials_passed = j.value("trials_passed", 0);
  v.max_abs_error = number_or_zero(j, "max_abs_error");
  v.max_rel_norm_error = number_or_zero(j, "max_rel_norm_error");
  v.seed = j.value("seed", uint64_t{0});
  v.cached = j.value("cached", false);
  if (j.contains("speedup") && j["speedup"].is_number()) v.speedup = j["speedup"].get<double>();
  if (j.contains("compile_speedup") && j["compile_speedup"].is_number())
    v.compile_speedup = j["compile_speedup"].get<double>();
  if (j.contains("custom_kernel_share") && j["custom_kernel_share"].is_number())
    v.custom_kernel_share = j["custom_kernel_share"].get<double>();
  if (j.contains("unchecked")) {
    if (!j["unchecked"].is_object()) return parse_error("unchecked: not an object of check name -> reason");
    for (const auto& [name, why] : j["unchecked"].items()) {
      auto check = parse_check(name);
      if (!check || !why.is_string()) return parse_error(fmt::format("unchecked: unknown check or no reason: {}", name));
      v.unchecked.emplace_back(*check, why.get<std::string>());
    }
  }
  if (j.contains("memory") && j["memory"].is_object()) v.memory = memory_from_json(j["memory"]);
  v.retried_alone = j.contains("retried_alone") && j["retried_alone"].is_boolean() && j["retried_alone"].get<bool>();
  if (j.contains("timing") && j["timing"].is_object()) {
    const auto& t = j["timing"];
    if (t.contains("candidate")) v.candidate_timing = timing_from_json(t["candidate"]);
    if (t.contains("reference")) v.reference_timing = timing_from_json(t["reference"]);
    if (t.contains("compiled") && t["compiled"].is_object()) v.compiled_reference_timing = timing_from_json(t["compiled"]);
  }
  if (j.contains("profile") && j["profile"].is_object()) v.profile = profile_from_json(j["profile"]);
  return v;
}

PreBuild prebuild_of(const Verdict& build_verdict, double started_s) {
  const VerdictProfile& built = build_verdict.profile;
  PreBuild prebuild{started_s, built.wall_s, built.build_s, std::nullopt};
  double worker_start = 0;
  for (const auto& [stage, seconds] : built.stage_s)
    if (stage == "startup" || stage == "load_reference") worker_start += seconds;
  if (!prebuild.build_s.empty()) prebuild.build_s.emplace_back("worker_start", worker_start);
  if (!built.cpu_s.empty()) {
    prebuild.cpu_s = 0.0;
    for (const auto& [part, seconds] : built.cpu_s) *prebuild.cpu_s += seconds;
  }
  return prebuild;
}

void attach_prebuild(Verdict& verdict, const PreBuild& prebuild) {
  VerdictProfile& profile = verdict.profile;
  profile.prebuild_started_s = prebuild.started_s;
  profile.prebuild_s = prebuild.seconds;
  profile.prebuild_cpu_s = prebuild.cpu_s;
  if (profile.build_s.empty()) profile.build_s = prebuild.build_s;  // the evaluation loaded the build
}

}  // namespace kz
