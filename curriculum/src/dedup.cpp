// Source normalisation, shingles and the near-duplicate index.
#include "kz/curriculum/dedup.h"

#include <cctype>
#include <map>
#include <string_view>

#include "kz/core/hash.h"

namespace kz {
namespace {

// Identifiers kept as they are: Python keywords and common builtins, the usual PyTorch module
// roots, and the names the KernelBench format fixes. Everything else is the author's choice.
const std::set<std::string, std::less<>>& kept_names() {
  static const std::set<std::string, std::less<>> names{
      "False", "None", "True", "and", "as", "assert", "break", "class", "continue", "def", "del", "elif", "else",
      "except", "finally", "for", "from", "global", "if", "import", "in", "is", "lambda", "nonlocal", "not", "or",
      "pass", "raise", "return", "try", "while", "with", "yield", "range", "len", "int", "float", "list", "tuple",
      "dict", "super", "isinstance", "min", "max", "sum", "abs", "zip", "enumerate", "torch", "nn", "F", "functional",
      "math", "Model", "forward", "__init__", "get_inputs", "get_init_inputs", "self", "cpu_sizes"};
  return names;
}

bool is_identifier_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_identifier_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Skips a string literal starting at `i` (at its opening quote); returns the index after it.
size_t skip_string(std::string_view s, size_t i, bool& triple) {
  char quote = s[i];
  triple = s.substr(i, 3) == std::string(3, quote);
  size_t j = i + (triple ? 3 : 1);
  while (j < s.size()) {
    if (s[j] == '\\') {
      j += 2;
    } else if (triple ? s.substr(j, 3) == std::string(3, quote) : s[j] == quote) {
      return j + (triple ? 3 : 1);
    } else if (!triple && s[j] == '\n') {
      return j;  // unterminated: stop at the line's end
    } else {
      ++j;
    }
  }
  return s.size();
}

size_t skip_number(std::string_view s, size_t i) {
  size_t j = i;
  while (j < s.size() && (is_identifier_char(s[j]) || s[j] == '.' ||
                          ((s[j] == '+' || s[j] == '-') && (s[j - 1] == 'e' || s[j - 1] == 'E'))))
    ++j;
  return j;
}

// The raw token stream: identifiers as written, "S" for strings (docstrings and other
// triple-quoted strings are dropped), "N" for numbers, one token per punctuation character.
std::vector<std::string> raw_tokens(std::string_view s) {
  std::vector<std::string> tokens;
  size_t i = 0;
  while (i < s.size()) {
    char c = s[i];
    if (c == '#') {
      while (i < s.size() && s[i] != '\n') ++i;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (c == '"' || c == '\'') {
      bool triple = false;
      i = skip_string(s, i, triple);
      if (!triple) tokens.emplace_back("S");
    } else if (is_identifier_start(c)) {
      size_t j = i;
      while (j < s.size() && is_identifier_char(s[j])) ++j;
      std::string_view word = s.substr(i, j - i);
      bool prefix = word.size() <= 2 && word.find_first_not_of("rRbBfFuU") == std::string_view::npos;
      if (prefix && j < s.size() && (s[j] == '"' || s[j] == '\'')) {
        i = j;  // a string prefix (r"", f'', b""): the literal follows
        continue;
      }
      tokens.emplace_back(word);
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c)) ||
               (c == '.' && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1])))) {
      i = skip_number(s, i);
      tokens.emplace_back("N");
    } else {
      tokens.emplace_back(1, c);
      ++i;
    }
  }
  return tokens;
}

}  // namespace

std::vector<std::string> normalize_source_tokens(const std::string& source) {
  std::vector<std::string> tokens = raw_tokens(source);
  std::map<std::string, std::string> placeholders;
  std::string chain_root;  // the first name of the current a.b.c chain
  for (size_t k = 0; k < tokens.size(); ++k) {
    std::string& token = tokens[k];
    if (!is_identifier_start(token[0]) || token == "S" || token == "N") continue;
    bool attribute = k > 0 && tokens[k - 1] == ".";
    if (!attribute) chain_root = token;
    // torch.nn.functional.gelu, x.sum, y.view are APIs: kept. self.<name> and free names other
    // than the kept ones are the author's: renamed.
    bool keep = attribute ? chain_root != "self" : kept_names().count(token) > 0;
    if (keep) continue;
    std::string placeholder = "v";  // (not "v" + to_string: gcc 12 warns falsely, -Wrestrict)
    placeholder += std::to_string(placeholders.size());
    token = placeholders.try_emplace(token, std::move(placeholder)).first->second;
  }
  return tokens;
}

std::set<uint64_t> shingles(const std::vector<std::string>& tokens, size_t n) {
  std::set<uint64_t> result;
  if (tokens.empty() || n == 0) return result;
  size_t width = std::min(n, tokens.size());
  for (size_t start = 0; start + width <= tokens.size(); ++start) {
    std::string joined;
    for (size_t k = start; k < start + width; ++k) joined.append(tokens[k]).push_back('\x1f');
    result.insert(hash64(joined));
  }
  return result;
}

double jaccard(const std::set<uint64_t>& a, const std::set<uint64_t>& b) {
  if (a.empty() && b.empty()) return 1.0;
  size_t common = 0;
  for (uint64_t h : a) common += b.count(h);
  return double(common) / double(a.size() + b.size() - common);
}

std::optional<DuplicateMatch> NearDuplicateIndex::match(const std::string& source,
                                                        const std::string& fingerprint) const {
  auto mine = shingles(normalize_source_tokens(source));
  std::optional<DuplicateMatch> best;
  for (const auto& entry : entries_) {
    bool same = !fingerprint.empty() && entry.fingerprint == fingerprint;
    double similarity = same ? 1.0 : jaccard(mine, entry.shingles);
    if ((same || similarity >= threshold_) && (!best || similarity > best->similarity))
      best = DuplicateMatch{entry.id, similarity, same};
  }
  return best;
}

std::optional<std::string> NearDuplicateIndex::find_duplicate(const std::string& source,
                                                              const std::string& fingerprint) const {
  auto found = match(source, fingerprint);
  if (!found) return std::nullopt;
  return found->id;
}

void NearDuplicateIndex::add(std::string id, const std::string& source, std::string fingerprint) {
  entries_.push_back({std::move(id), std::move(fingerprint), shingles(normalize_source_tokens(source))});
}

}  // namespace kz
