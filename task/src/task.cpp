// Loading reference tasks from files, directories and JSONL datasets.
#include "kz/task/task.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <regex>
#include <set>
#include <sstream>

#include "kz/core/files.h"

namespace kz {
namespace {

bool defines(const std::string& source, const std::string& pattern) {
  return std::regex_search(source, std::regex(pattern, std::regex::multiline));
}

// `ops` appears as a JSON list, or as a string holding a Python-style list or comma list.
std::vector<std::string> parse_ops(const nlohmann::json& value) {
  std::vector<std::string> ops;
  if (value.is_array()) {
    for (const auto& op : value)
      if (op.is_string()) ops.push_back(op.get<std::string>());
    return ops;
  }
  if (!value.is_string()) return ops;
  std::string text = value.get<std::string>();
  std::replace_if(text.begin(), text.end(), [](char c) { return c == '[' || c == ']' || c == '\'' || c == '"'; }, ' ');
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) {
    auto begin = item.find_first_not_of(" \t");
    auto end = item.find_last_not_of(" \t");
    if (begin != std::string::npos) ops.push_back(item.substr(begin, end - begin + 1));
  }
  return ops;
}

int parse_level(const nlohmann::json& value) {
  if (value.is_number_integer()) return value.get<int>();
  if (value.is_string()) {
    std::smatch match;
    std::string text = value.get<std::string>();
    if (std::regex_search(text, match, std::regex(R"((\d+))"))) return std::stoi(match[1]);
  }
  return 0;
}

Result<Task> task_from_row(const nlohmann::json& row, const std::filesystem::path& path, size_t line_number) {
  std::string where = fmt::format("{}:{}", path.string(), line_number);
  if (!row.is_object() || !row.contains("py_code") || !row["py_code"].is_string())
    return parse_error(fmt::format("{}: row has no string field `py_code`", where));
  Task task;
  task.source = row["py_code"].get<std::string>();
  task.origin = where;
  if (row.contains("id") && (row["id"].is_string() || row["id"].is_number()))
    task.id = row["id"].is_string() ? row["id"].get<std::string>() : row["id"].dump();
  else
    task.id = fmt::format("{}-{}", path.stem().string(), line_number);
  if (row.contains("ops")) task.ops = parse_ops(row["ops"]);
  if (row.contains("level")) task.level = parse_level(row["level"]);
  return task;
}

Status check_unique_ids(const std::vector<Task>& tasks) {
  std::set<std::string> seen;
  for (const auto& task : tasks)
    if (!seen.insert(task.id).second)
      return invalid_argument(fmt::format("duplicate task id '{}' (second at {})", task.id, task.origin));
  return Status::ok();
}

}  // namespace

int level_from_path(const std::filesystem::path& path) {
  static const std::regex level_dir(R"(level_?(\d+))", std::regex::icase);
  int level = 0;
  for (const auto& part : path) {
    std::smatch match;
    std::string name = part.string();
    if (std::regex_match(name, match, level_dir)) level = std::stoi(match[1]);
  }
  return level;
}

Status check_reference_source(const Task& task) {
  std::vector<std::string> missing;
  if (!defines(task.source, R"(^class\s+Model\b)")) missing.push_back("class Model");
  if (!defines(task.source, R"(^def\s+get_inputs\s*\()")) missing.push_back("def get_inputs()");
  if (!defines(task.source, R"(^def\s+get_init_inputs\s*\()")) missing.push_back("def get_init_inputs()");
  if (missing.empty()) return Status::ok();
  std::string list;
  for (const auto& item : missing) list += (list.empty() ? "" : ", ") + item;
  return parse_error(fmt::format("task {} ({}): not a KernelBench reference module, missing {}", task.id,
                                 task.origin, list));
}

Result<Task> load_task_file(const std::filesystem::path& path) {
  auto source = read_file(path);
  if (!source.ok()) return source.status();
  Task task{path.stem().string(), std::move(*source), path.string(), level_from_path(path), {}};
  KZ_RETURN_IF_ERROR(check_reference_source(task));
  return task;
}

Result<std::vector<Task>> load_task_directory(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec); !ec && it != std::filesystem::end(it);
       it.increment(ec)) {
    if (it->is_regular_file() && it->path().extension() == ".py" && it->path().filename() != "__init__.py")
      files.push_back(it->path());
  }
  if (ec) return io_error(fmt::format("listing {}: {}", dir.string(), ec.message()));
  std::sort(files.begin(), files.end());
  std::vector<Task> tasks;
  for (const auto& file : files) {
    auto task = load_task_file(file);
    if (!task.ok()) return task.status();
    tasks.push_back(std::move(*task));
  }
  if (tasks.empty()) return not_found(fmt::format("no reference modules (*.py) under {}", dir.string()));
  return tasks;
}

Result<std::vector<Task>> load_task_jsonl(const std::filesystem::path& path) {
  auto text = read_file(path);
  if (!text.ok()) return text.status();
  std::vector<Task> tasks;
  std::stringstream lines(*text);
  size_t line_number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_discarded())
      return parse_error(fmt::format("{}:{}: not valid JSON", path.string(), line_number));
    // `kz propose` keeps rejected modules in its output, marked so; they are not tasks.
    if (row.is_object() && row.value("status", "") == "rejected") continue;
    auto task = task_from_row(row, path, line_number);
    if (!task.ok()) return task.status();
    KZ_RETURN_IF_ERROR(check_reference_source(*task));
    tasks.push_back(std::move(*task));
  }
  if (tasks.empty()) return not_found(fmt::format("{}: no rows", path.string()));
  return tasks;
}

Result<std::vector<Task>> load_tasks(const std::filesystem::path& path) {
  std::error_code ec;
  Result<std::vector<Task>> tasks = not_found(fmt::format("no such file or directory: {}", path.string()));
  if (std::filesystem::is_directory(path, ec)) {
    tasks = load_task_directory(path);
  } else if (std::filesystem::is_regular_file(path, ec)) {
    if (path.extension() == ".jsonl") {
      tasks = load_task_jsonl(path);
    } else {
      auto task = load_task_file(path);
      if (!task.ok()) return task.status();
      tasks = std::vector<Task>{std::move(*task)};
    }
  }
  if (!tasks.ok()) return tasks.status();
  KZ_RETURN_IF_ERROR(check_unique_ids(*tasks));
  return tasks;
}

}  // namespace kz
