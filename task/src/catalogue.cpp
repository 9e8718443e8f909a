// Loading the PyTorch API catalogue (TOML), looking APIs up by name and sampling them by weight.
#include "kz/task/catalogue.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include "kz/core/toml.h"

#include "kz/core/files.h"

#ifndef KZ_DEFAULT_API_CATALOGUE
#define KZ_DEFAULT_API_CATALOGUE "task/data/api_catalogue.toml"
#endif

namespace kz {
namespace {

// "file:line" of a TOML node, for error messages.
std::string where(const std::filesystem::path& path, const toml::node& node) {
  return fmt::format("{}:{}", path.string(), node.source().begin.line);
}

Result<ApiEntry> read_entry(const toml::node& node, const std::filesystem::path& path) {
  const auto* table = node.as_table();
  if (!table) return parse_error(where(path, node) + ": [[api]] entry is not a table");
  ApiEntry entry;
  entry.name = (*table)["name"].value_or(std::string());
  entry.category = (*table)["category"].value_or(std::string());
  std::string label = fmt::format("{}: api '{}'", where(path, node), entry.name);
  if (entry.name.empty()) return invalid_argument(where(path, node) + ": [[api]] entry has no string `name`");
  if (entry.category.empty()) return invalid_argument(label + " has no string `category`");
  const auto* aten = (*table)["aten"].as_array();
  if (!aten || aten->empty()) return invalid_argument(label + ": `aten` must be a non-empty list of op names");
  for (const auto& op : *aten) {
    auto name = op.value<std::string>();
    if (!name || name->empty() || name->find("::") != std::string::npos || name->find('.') != std::string::npos)
      return invalid_argument(label + ": `aten` items must be bare op names (\"gelu\", not \"aten::gelu.default\")");
    entry.aten.push_back(*name);
  }
  return entry;
}

// Levenshtein distance, for "did you mean" suggestions.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string last_component(const std::string& name) {
  auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// Up to three catalogue names close to `unknown`: same last component ("gelu" ->
// "torch.nn.functional.gelu"), or a small edit distance (typos).
std::vector<std::string> suggestions(const std::vector<ApiEntry>& catalogue, const std::string& unknown) {
  std::vector<std::pair<size_t, std::string>> scored;
  std::string tail = last_component(unknown);
  for (const auto& entry : catalogue) {
    size_t distance = last_component(entry.name) == tail ? 0 : edit_distance(entry.name, unknown) + 1;
    if (distance <= std::max<size_t>(3, unknown.size() / 5)) scored.emplace_back(distance, entry.name);
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> names;
  for (size_t i = 0; i < scored.size() && i < 3; ++i) names.push_back(scored[i].second);
  return names;
}

double weight_of(const ApiEntry& entry, const std::map<std::string, double>& weights) {
  if (auto it = weights.find(entry.name); it != weights.end()) return it->second;
  if (auto it = weights.find(entry.category); it != weights.end()) return it->second;
  return 1.0;
}

}  // namespace

std::filesystem::path default_api_catalogue_path() { return KZ_DEFAULT_API_CATALOGUE; }

Result<std::vector<ApiEntry>> load_api_catalogue(const std::filesystem::path& path) {
  auto text = read_file(path);
  if (!text.ok()) return text.status().with_context("API catalogue");
  auto parsed = parse_toml(*text, path.string());
  if (!parsed.ok()) return parsed.status();
  const auto* apis = (*parsed)["api"].as_array();
  if (!apis || apis->empty()) return invalid_argument(path.string() + ": no [[api]] entries");
  std::vector<ApiEntry> catalogue;
  std::set<std::string> seen;
  for (const auto& node : *apis) {
    auto entry = read_entry(node, path);
    if (!entry.ok()) return entry.status();
    if (!seen.insert(entry->name).second)
      return invalid_argument(fmt::format("{}: api '{}' appears twice", where(path, node), entry->name));
    catalogue.push_back(std::move(*entry));
  }
  return catalogue;
}

Result<std::vector<ApiEntry>> find_apis(const std::vector<ApiEntry>& catalogue, const std::vector<std::string>& names) {
  std::vector<ApiEntry> found;
  for (const auto& name : names) {
    auto it = std::find_if(catalogue.begin(), catalogue.end(), [&](const ApiEntry& e) { return e.name == name; });
    if (it != catalogue.end()) {
      found.push_back(*it);
      continue;
    }
    auto close = suggestions(catalogue, name);
    std::string hint;
    for (const auto& candidate : close) hint += (hint.empty() ? "; did you mean " : " or ") + candidate;
    return not_found(fmt::format("API '{}' is not in the catalogue{}", name, hint.empty() ? "" : hint + "?"));
  }
  return found;
}

std::vector<ApiEntry> sample_apis(const std::vector<ApiEntry>& catalogue, size_t count, std::mt19937_64& rng,
                                  const std::map<std::string, double>& weights) {
  std::vector<size_t> pool;
  std::vector<double> pool_weights;
  for (size_t i = 0; i < catalogue.size(); ++i) {
    double weight = weight_of(catalogue[i], weights);
    if (weight > 0) {
      pool.push_back(i);
      pool_weights.push_back(weight);
    }
  }
  // One weighted draw at a time, removing the drawn entry: without replacement, and each draw's
  // probability is proportional to the weight among what is left.
  std::vector<ApiEntry> drawn;
  while (drawn.size() < count && !pool.empty()) {
    std::discrete_distribution<size_t> pick(pool_weights.begin(), pool_weights.end());
    size_t k = pick(rng);
    drawn.push_back(catalogue[pool[k]]);
    pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(k));
    pool_weights.erase(pool_weights.begin() + static_cast<std::ptrdiff_t>(k));
  }
  return drawn;
}

}  // namespace kz
