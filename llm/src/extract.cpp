// Code extraction from a model's Markdown reply (extract.h).
//
// The reply is read the way a Markdown renderer would (CommonMark fenced code blocks): a fence is
// 3+ backticks or tildes indented by at most 3 spaces; the block closes on a line of the same
// character, at least as long, with nothing after it but spaces. So a ```` fence can hold ```
// lines, and a python line such as `s = "```"` never closes a block. Reasoning (<think>…</think>)
// is cut out first, so sketches made while thinking are never mistaken for the answer.
#include "kz/llm/extract.h"

#include <algorithm>
#include <cctype>
#include <vector>

namespace kz {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

struct Block {
  std::string lang;  // the info string's first word, lower-cased ("" when untagged)
  std::string code;  // the lines between the fences, each ending in '\n'
};

struct Fence {
  char ch = '`';
  size_t length = 0;  // number of fence characters
  size_t indent = 0;  // spaces before the fence (removed from content lines too, as CommonMark does)
  std::string lang;
};

// Windows line endings would leave a '\r' on every code line and on the fences themselves.
std::string normalize_newlines(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i)
    if (!(text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n')) out += text[i];
  return out;
}

// Removes <think>…</think> spans. A reply that starts inside reasoning (chat templates that open
// <think> in the prompt) has a </think> before any <think>: everything before it is reasoning.
// A <think> that never closes (the model ran out of tokens while thinking) hides the rest.
std::string strip_reasoning(std::string_view text) {
  size_t pos = 0;
  size_t first_close = text.find(kThinkClose);
  if (first_close != std::string_view::npos && first_close < text.find(kThinkOpen))
    pos = first_close + kThinkClose.size();
  std::string out;
  while (pos < text.size()) {
    size_t open = text.find(kThinkOpen, pos);
    out += text.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos);
    if (open == std::string_view::npos) break;
    size_t close = text.find(kThinkClose, open + kThinkOpen.size());
    if (close == std::string_view::npos) break;
    pos = close + kThinkClose.size();
  }
  return out;
}

std::string_view trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

// Parses an opening fence: up to 3 spaces, 3+ '`' or '~', then an optional info string.
std::optional<Fence> parse_fence(std::string_view line) {
  Fence f;
  while (f.indent < line.size() && line[f.indent] == ' ') ++f.indent;
  if (f.indent > 3 || f.indent >= line.size() || (line[f.indent] != '`' && line[f.indent] != '~')) return std::nullopt;
  f.ch = line[f.indent];
  while (f.indent + f.length < line.size() && line[f.indent + f.length] == f.ch) ++f.length;
  if (f.length < 3) return std::nullopt;
  std::string_view info = trim(line.substr(f.indent + f.length));
  // A backtick "fence" whose info string holds a backtick is inline code (```x```), not a fence.
  if (f.ch == '`' && info.find('`') != std::string_view::npos) return std::nullopt;
  f.lang = lower(info.substr(0, info.find_first_of(" \t{")));
  return f;
}

// A closing fence: same character, at least as long, nothing else on the line.
bool closes(const Fence& open, std::string_view line) {
  auto f = parse_fence(line);
  return f && f->ch == open.ch && f->length >= open.length && trim(line).size() == f->length;
}

// Drops up to `indent` leading spaces, so a block fenced inside a list item keeps its own indentation.
std::string_view dedent(std::string_view line, size_t indent) {
  size_t n = 0;
  while (n < indent && n < line.size() && line[n] == ' ') ++n;
  return line.substr(n);
}

// All fenced blocks, in order. An unclosed last fence runs to the end of the text.
std::vector<Block> find_blocks(std::string_view text) {
  std::vector<Block> blocks;
  std::optional<Fence> open;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    std::string_view line = text.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos);
    pos = end == std::string_view::npos ? text.size() : end + 1;
    if (!open) {
      if ((open = parse_fence(line))) blocks.push_back({open->lang, ""});
    } else if (closes(*open, line)) {
      open.reset();
    } else {
      blocks.back().code.append(dedent(line, open->indent)).push_back('\n');
    }
  }
  // A fence with nothing inside (or only blank lines) is not code.
  std::erase_if(blocks, [](const Block& b) { return b.code.find_first_not_of(" \t\n") == std::string::npos; });
  return blocks;
}

bool is_python_tag(const std::string& lang) {
  return lang.empty() || lang == "py" || lang == "py3" || lang.rfind("python", 0) == 0;
}

// A reply with no fences that is plainly Python source (some models skip the Markdown).
std::optional<std::string> bare_python(std::string_view text) {
  size_t start = 0;  // skip leading blank lines (a stripped <think> leaves some)
  for (size_t i = 0; i < text.size() && (text[i] == '\n' || text[i] == ' ' || text[i] == '\t'); ++i)
    if (text[i] == '\n') start = i + 1;
  std::string_view body = text.substr(start);
  size_t last = body.find_last_not_of(" \t\n");
  if (last == std::string_view::npos) return std::nullopt;
  body = body.substr(0, last + 1);
  std::string_view head = body.substr(body.find_first_not_of(" \t"));
  bool looks_python = body.find("class ModelNew") != std::string_view::npos || head.rfind("import ", 0) == 0 ||
                      head.rfind("from ", 0) == 0;
  if (!looks_python) return std::nullopt;
  return std::string(body) + "\n";
}

}  // namespace

std::optional<std::string> extract_code(std::string_view reply, const ExtractOptions& options) {
  std::string text = normalize_newlines(reply);
  if (options.skip_reasoning) text = strip_reasoning(text);
  std::vector<Block> blocks = find_blocks(text);
  if (blocks.empty()) return bare_python(text);
  // prefer_python narrows the choice to python/untagged blocks only when there are some.
  if (options.prefer_python && std::any_of(blocks.begin(), blocks.end(), [](const Block& b) { return is_python_tag(b.lang); }))
    std::erase_if(blocks, [](const Block& b) { return !is_python_tag(b.lang); });
  return options.choice == BlockChoice::first ? blocks.front().code : blocks.back().code;
}

}  // namespace kz
