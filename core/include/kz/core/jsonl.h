// Append-only JSONL logs (results.jsonl, generations.jsonl, kz propose's output): one JSON object
// per line, written with append_line (files.h) as each record is ready, read back to resume.
#pragma once

#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "kz/core/status.h"

namespace kz {

// The objects of an append-only JSONL file; a missing file has none, blank lines are skipped. A
// last line without its newline that does not parse is the record a crash cut short: skipped (it
// is written again on resume). Any other line that is not a JSON object is an error naming
// file:line, since skipping it would silently drop a finished record.
Result<std::vector<nlohmann::json>> read_jsonl_log(const std::filesystem::path& path);

}  // namespace kz
