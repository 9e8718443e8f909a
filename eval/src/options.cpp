// EvalOptions: validation and the TOML mapping (one table of keys, used both ways).
#include "kz/eval/options.h"

#include <fmt/format.h>

#include <functional>
#include <sstream>
#include <toml++/toml.h>

#include "kz/core/files.h"
#include "kz/eval/format.h"

namespace kz {
namespace {

// Reads one TOML value into a field, checking its type.
template <class T>
Status read_value(const toml::node& node, const std::string& key, T& field) {
  if constexpr (std::is_same_v<T, bool>) {
    if (auto v = node.value<bool>()) { field = *v; return Status::ok(); }
  } else if constexpr (std::is_integral_v<T>) {
    if (auto v = node.value<int64_t>()) { field = static_cast<T>(*v); return Status::ok(); }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (auto v = node.value<double>()) { field = *v; return Status::ok(); }
  } else if constexpr (std::is_same_v<T, std::filesystem::path>) {
    if (auto v = node.value<std::string>()) { field = *v; return Status::ok(); }
  } else {
    if (auto v = node.value<std::string>()) { field = *v; return Status::ok(); }
  }
  return invalid_argument(fmt::format("config key '{}' has the wrong type", key));
}

std::string toml_quote(const std::string& text) {
  std::ostringstream out;
  out << toml::value<std::string>(text);
  return out.str();
}

// One entry per configurable field: "section.key" -> how to read it and how to print it.
struct Field {
  std::function<Status(const toml::node&, const std::string&)> read;
  std::function<std::string()> show;
};

template <class T>
Field field(T& target) {
  return {[&target](const toml::node& n, const std::string& k) { return read_value(n, k, target); },
          [&target]() -> std::string {
            if constexpr (std::is_same_v<T, bool>) return target ? "true" : "false";
            else if constexpr (std::is_same_v<T, std::string>) return toml_quote(target);
            else if constexpr (std::is_same_v<T, std::filesystem::path>) return toml_quote(target.string());
            else if constexpr (std::is_floating_point_v<T>) return fmt::format("{:g}", target) +
                (fmt::format("{:g}", target).find_first_of(".e") == std::string::npos ? ".0" : "");
            else return std::to_string(target);
          }};
}

// The field table, in the order `kz config show` prints it. Sections are the prefixes.
std::vector<std::pair<std::string, Field>> fields(EvalOptions& o) {
  return {
      {"device", field(o.device)},
      {"format", field(o.format)},
      {"trials", field(o.trials)},
      {"seed", field(o.seed)},
      {"use_cpu_sizes", field(o.use_cpu_sizes)},
      {"jobs", field(o.jobs)},
      {"tolerance.atol_fp32", field(o.tolerance.atol_fp32)},
      {"tolerance.rtol_fp32", field(o.tolerance.rtol_fp32)},
      {"tolerance.norm_tol_fp32", field(o.tolerance.norm_tol_fp32)},
      {"tolerance.atol_half", field(o.tolerance.atol_half)},
      {"tolerance.rtol_half", field(o.tolerance.rtol_half)},
      {"tolerance.norm_tol_half", field(o.tolerance.norm_tol_half)},
      {"timing.enabled", field(o.timing.enabled)},
      {"timing.warmup_runs", field(o.timing.warmup_runs)},
      {"timing.runs", field(o.timing.runs)},
      {"timing.input_sets", field(o.timing.input_sets)},
      {"timing.l2_flush_mb", field(o.timing.l2_flush_mb)},
      {"timing.exclusive", field(o.timing.exclusive)},
      {"timing.gpu_jobs", field(o.timing.gpu_jobs)},
      {"timeouts.startup_s", field(o.timeouts.startup_s)},
      {"timeouts.load_reference_s", field(o.timeouts.load_reference_s)},
      {"timeouts.compile_s", field(o.timeouts.compile_s)},
      {"timeouts.correctness_s", field(o.timeouts.correctness_s)},
      {"timeouts.timing_s", field(o.timeouts.timing_s)},
      {"timeouts.recheck_s", field(o.timeouts.recheck_s)},
      {"worker.python", field(o.worker.python)},
      {"worker.worker_dir", field(o.worker.worker_dir)},
      {"worker.cache_dir", field(o.worker.cache_dir)},
      {"worker.scratch_root", field(o.worker.scratch_root)},
      {"worker.keep_scratch", field(o.worker.keep_scratch)},
      {"worker.prestart", field(o.worker.prestart)},
      {"cache.enabled", field(o.cache.enabled)},
      {"cache.path", field(o.cache.path)},
      {"sandbox.enabled", field(o.sandbox.enabled)},
      {"sandbox.cpu_time_s", field(o.sandbox.cpu_time_s)},
      {"sandbox.file_size_mb", field(o.sandbox.file_size_mb)},
      {"sandbox.max_processes", field(o.sandbox.max_processes)},
      {"sandbox.memory_mb", field(o.sandbox.memory_mb)},
      {"sandbox.open_files", field(o.sandbox.open_files)},
      {"sandbox.network", field(o.sandbox.network)},
      {"sandbox.read_only_filesystem", field(o.sandbox.read_only_filesystem)},
      {"sandbox.gpu_memory_fraction", field(o.sandbox.gpu_memory_fraction)},
  };
}

Status apply_table(const toml::table& table, const std::string& prefix, EvalOptions& options,
                   const std::vector<std::pair<std::string, Field>>& known) {
  for (const auto& [key, node] : table) {
    std::string name = prefix + std::string(key.str());
    if (name == "size_overrides") {
      if (!node.is_table()) return invalid_argument("config key 'size_overrides' must be a table");
      for (const auto& [size_name, value] : *node.as_table()) {
        auto number = value.value<int64_t>();
        if (!number) return invalid_argument(fmt::format("size_overrides.{} must be an integer", size_name.str()));
        options.size_overrides[std::string(size_name.str())] = *number;
      }
      continue;
    }
    if (node.is_table()) {
      KZ_RETURN_IF_ERROR(apply_table(*node.as_table(), name + ".", options, known));
      continue;
    }
    auto it = std::find_if(known.begin(), known.end(), [&](const auto& f) { return f.first == name; });
    if (it == known.end()) return invalid_argument(fmt::format("unknown config key '{}'", name));
    KZ_RETURN_IF_ERROR(it->second.read(node, name));
  }
  return Status::ok();
}

}  // namespace

Status EvalOptions::validate() const {
  if (device != "cpu" && device.rfind("cuda", 0) != 0)
    return invalid_argument(fmt::format("device '{}' is neither 'cpu' nor 'cuda:N'", device));
  if (format != "auto" && !parse_format(format))
    return invalid_argument(fmt::format("format '{}' is not one of auto, cuda, triton, cuda-rtc, torch", format));
  if (trials < 1) return invalid_argument("trials must be at least 1");
  if (jobs < 0) return invalid_argument("jobs must be 0 (automatic) or positive");
  if (timing.runs < 1 || timing.input_sets < 1 || timing.warmup_runs < 0 || timing.l2_flush_mb < 0 ||
      timing.gpu_jobs < 1)
    return invalid_argument("timing: runs, input_sets and gpu_jobs must be >= 1, warmup_runs and l2_flush_mb >= 0");
  for (double t : {timeouts.startup_s, timeouts.load_reference_s, timeouts.compile_s, timeouts.correctness_s,
                   timeouts.timing_s, timeouts.recheck_s})
    if (t <= 0) return invalid_argument("every stage timeout must be positive");
  for (double t : {tolerance.atol_fp32, tolerance.rtol_fp32, tolerance.norm_tol_fp32, tolerance.atol_half,
                   tolerance.rtol_half, tolerance.norm_tol_half})
    if (t < 0) return invalid_argument("tolerances must be non-negative");
  if (sandbox.cpu_time_s < 0 || sandbox.file_size_mb < 0 || sandbox.max_processes < 0 || sandbox.memory_mb < 0 ||
      sandbox.open_files < 0)
    return invalid_argument("sandbox limits must be non-negative (0: no limit)");
  if (worker.prestart != "gpu" && worker.prestart != "always" && worker.prestart != "never")
    return invalid_argument(fmt::format("worker.prestart '{}' is not one of gpu, always, never", worker.prestart));
  if (sandbox.gpu_memory_fraction < 0 || sandbox.gpu_memory_fraction > 1)
    return invalid_argument("sandbox.gpu_memory_fraction must be within [0, 1] (0: no limit)");
  return Status::ok();
}

Status apply_toml_text(std::string_view text, std::string_view origin, EvalOptions& options) {
  toml::table parsed;
  try {
    parsed = toml::parse(text, origin);
  } catch (const toml::parse_error& error) {
    return parse_error(fmt::format("{}:{}:{}: {}", origin, error.source().begin.line, error.source().begin.column,
                                   error.description()));
  }
  auto known = fields(options);
  KZ_RETURN_IF_ERROR(apply_table(parsed, "", options, known).with_context(std::string(origin)));
  return options.validate().with_context(std::string(origin));
}

Status apply_toml_file(const std::filesystem::path& path, EvalOptions& options) {
  auto text = read_file(path);
  if (!text.ok()) return text.status();
  return apply_toml_text(*text, path.string(), options);
}

std::string to_toml(const EvalOptions& options) {
  EvalOptions copy = options;
  std::string out, section;
  for (const auto& [name, f] : fields(copy)) {
    auto dot = name.find('.');
    std::string this_section = dot == std::string::npos ? "" : name.substr(0, dot);
    if (this_section != section) {
      out += fmt::format("\n[{}]\n", this_section);
      section = this_section;
    }
    out += fmt::format("{} = {}\n", dot == std::string::npos ? name : name.substr(dot + 1), f.show());
  }
  std::string sizes = "\n[size_overrides]\n";
  for (const auto& [k, v] : options.size_overrides) sizes += fmt::format("{} = {}\n", k, v);
  // Top-level keys must come before any table in TOML.
  auto first_table = out.find("\n[");
  return out.substr(0, first_table) + sizes + out.substr(first_table);
}

}  // namespace kz
