// The PyTorch API catalogue: which APIs a Proposer may be asked to build a module from, and the
// ATen ops whose execution proves each one ran.
//
// The catalogue is task/data/api_catalogue.toml, one [[api]] table per API (name, category, aten).
// `aten` has "any of" semantics: a module proves it used the API when its forward executes at
// least one of the listed ops (torch.matmul may lower to mm, bmm, mv or dot). kz propose picks the
// APIs (by name, or sampled), and the worker's validator checks the proof.
#pragma once

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kz/core/status.h"

namespace kz {

struct ApiEntry {
  std::string name;               // "torch.nn.functional.gelu"
  std::string category;           // "activation", "reduction", ...
  std::vector<std::string> aten;  // ATen op names without "aten::" and overload; any of them proves the API
};

// Reads and checks the catalogue: every entry has a name, a category and a non-empty aten list,
// and names are unique. Errors name the file and the entry (parse_error with file:line:col for TOML).
Result<std::vector<ApiEntry>> load_api_catalogue(const std::filesystem::path& path);

// The catalogue shipped with the source tree (task/data/api_catalogue.toml; the path is compiled in).
std::filesystem::path default_api_catalogue_path();

// The entries for `names`, in that order. An unknown name is a not_found error naming it and
// suggesting close catalogue names ("did you mean torch.nn.functional.gelu?").
Result<std::vector<ApiEntry>> find_apis(const std::vector<ApiEntry>& catalogue, const std::vector<std::string>& names);

// Draws up to `count` distinct entries, weighted, without replacement. A weight is looked up by
// the API's name, then by its category, else it is 1; an entry of weight <= 0 is never drawn.
// Fewer than `count` come back only when fewer entries have a positive weight.
std::vector<ApiEntry> sample_apis(const std::vector<ApiEntry>& catalogue, size_t count, std::mt19937_64& rng,
                                  const std::map<std::string, double>& weights = {});

}  // namespace kz
