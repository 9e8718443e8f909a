#include "kz/core/jsonl.h"

#include <fmt/format.h>

#include "kz/core/files.h"

namespace kz {

Result<std::vector<nlohmann::json>> read_jsonl_log(const std::filesystem::path& path) {
  std::vector<nlohmann::json> rows;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return rows;
  auto text = read_file(path);
  if (!text.ok()) return text.status();
  size_t start = 0, number = 0;
  while (start < text->size()) {
    size_t end = text->find('\n', start);
    bool torn = end == std::string::npos;  // no newline: the writer may have died mid-line
    std::string_view line(text->data() + start, (torn ? text->size() : end) - start);
    start = torn ? text->size() : end + 1;
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object()) {
      rows.push_back(std::move(row));
    } else if (!torn) {
      return parse_error(fmt::format("{}:{}: not a JSON object (a record of this append-only log)", path.string(),
                                     number));
    }
  }
  return rows;
}

}  // namespace kz
