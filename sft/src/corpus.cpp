// Reading the teacher's corpus (corpus.h): one JSON object per line, each field checked as it is
// read so an error names file:line and the field.
#include "kz/sft/corpus.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <set>

namespace kz::sft {
namespace {

using json = nlohmann::json;

// The field `key` of `object` with the type `kind` ("string", ...): invalid_argument naming it
// when it is missing or of another type. `where` is "" or "candidates[2]." for nested fields.
Result<const json*> field(const json& object, const char* key, json::value_t kind, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end()) return invalid_argument(fmt::format("missing field '{}{}'", where, key));
  bool ok = it->type() == kind || (kind == json::value_t::number_integer && it->is_number_unsigned());
  if (!ok)
    return invalid_argument(fmt::format("field '{}{}' must be a {}, not {}", where, key, json(kind).type_name(),
                                        it->type_name()));
  return &*it;
}

Result<std::string> string_field(const json& object, const char* key, const std::string& where = "") {
  auto f = field(object, key, json::value_t::string, where);
  if (!f.ok()) return f.status();
  return (*f)->get<std::string>();
}

// A string or null; the key itself must be present.
Result<std::optional<std::string>> nullable_string_field(const json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end()) return invalid_argument(fmt::format("missing field '{}{}'", where, key));
  if (it->is_null()) return std::optional<std::string>();
  if (!it->is_string())
    return invalid_argument(fmt::format("field '{}{}' must be a string or null, not {}", where, key, it->type_name()));
  return std::optional<std::string>(it->get<std::string>());
}

Result<CorpusCandidate> parse_candidate(const json& c, const std::string& where) {
  if (!c.is_object()) return invalid_argument(fmt::format("'{}' must be an object", where.substr(0, where.size() - 1)));
  CorpusCandidate candidate;
  auto format = string_field(c, "format", where);
  if (!format.ok()) return format.status();
  candidate.format = *format;
  auto fusion = string_field(c, "fusion", where);
  if (!fusion.ok()) return fusion.status();
  if (*fusion != "unfused" && *fusion != "fused")
    return invalid_argument(fmt::format("field '{}fusion' is \"{}\", not \"unfused\" or \"fused\"", where, *fusion));
  candidate.fusion = *fusion;
  auto source = string_field(c, "source", where);
  if (!source.ok()) return source.status();
  candidate.source = *source;
  auto verdict = nullable_string_field(c, "verdict", where);
  if (!verdict.ok()) return verdict.status();
  candidate.verdict = *verdict;
  if (auto b = c.find("block_size"); b != c.end() && !b->is_null()) {
    if (!b->is_number_integer()) return invalid_argument(fmt::format("field '{}block_size' must be an integer", where));
    candidate.block_size = b->get<int64_t>();
  }
  if (auto s = c.find("speedup"); s != c.end() && !s->is_null()) {
    if (!s->is_number()) return invalid_argument(fmt::format("field '{}speedup' must be a number or null", where));
    candidate.speedup = s->get<double>();
  }
  return candidate;
}

Result<CorpusModule> parse_module(const json& row) {
  if (!row.is_object()) return invalid_argument("not a JSON object");
  CorpusModule m;
  auto id = string_field(row, "id");
  if (!id.ok()) return id.status();
  m.id = *id;
  auto split = string_field(row, "split");
  if (!split.ok()) return split.status();
  if (*split != "train" && *split != "heldout")
    return invalid_argument(fmt::format("field 'split' is \"{}\", not \"train\" or \"heldout\"", *split));
  m.split = *split;
  auto level = field(row, "level", json::value_t::number_integer, "");
  if (!level.ok()) return level.status();
  m.level = (*level)->get<int>();
  auto apis = field(row, "apis", json::value_t::array, "");
  if (!apis.ok()) return apis.status();
  for (const json& api : **apis) {
    if (!api.is_string()) return invalid_argument("field 'apis' must hold strings only");
    m.apis.push_back(api.get<std::string>());
  }
  if (auto ops = row.find("ops"); ops != row.end() && ops->is_string()) m.ops = ops->get<std::string>();
  auto reference = string_field(row, "reference");
  if (!reference.ok()) return reference.status();
  m.reference = *reference;
  auto candidates = field(row, "candidates", json::value_t::array, "");
  if (!candidates.ok()) return candidates.status();
  for (size_t i = 0; i < (*candidates)->size(); ++i) {
    auto c = parse_candidate((**candidates)[i], fmt::format("candidates[{}].", i));
    if (!c.ok()) return c.status();
    m.candidates.push_back(std::move(*c));
  }
  return m;
}

Status read_into(const fs::path& path, std::vector<CorpusModule>& modules, std::set<std::string>& ids) {
  auto text = read_file(path);
  if (!text.ok()) return text.status().with_context("corpus");
  size_t line_no = 0, pos = 0;
  while (pos < text->size()) {
    size_t end = text->find('\n', pos);
    if (end == std::string::npos) end = text->size();
    std::string_view line = std::string_view(*text).substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto where = [&] { return fmt::format("{}:{}", path.string(), line_no); };
    json row = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_discarded()) return invalid_argument(where() + ": not valid JSON");
    auto module = parse_module(row);
    if (!module.ok()) return module.status().with_context(where());
    if (!ids.insert(module->id).second)
      return invalid_argument(fmt::format("{}: id '{}' appears on an earlier line", where(), module->id));
    modules.push_back(std::move(*module));
  }
  return Status::ok();
}

}  // namespace

Result<std::vector<CorpusModule>> load_corpus(const fs::path& path) { return load_corpora({path}); }

Result<std::vector<CorpusModule>> load_corpora(const std::vector<fs::path>& paths) {
  std::vector<CorpusModule> modules;
  std::set<std::string> ids;
  for (const fs::path& path : paths) KZ_RETURN_IF_ERROR(read_into(path, modules, ids));
  return modules;
}

}  // namespace kz::sft
