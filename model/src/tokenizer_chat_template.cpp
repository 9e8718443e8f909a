// ChatML rendering (chat_template.h) and reading the default system message out of a Qwen-style
// Jinja template.
#include <optional>
#include <string>

#include "kz/model/chat_template.h"

namespace kz {
namespace {

constexpr std::string_view kSystemStart = "<|im_start|>system";
constexpr std::string_view kEnd = "<|im_end|>";

// The Jinja string-literal text starting at jinja[pos] up to "<|im_end|>", unescaped; nullopt
// when the literal ends first (the system text is an expression, not a constant). `quote` is the
// literal's delimiter (0 when unknown: then either quote ends it).
std::optional<std::string> literal_until_end(std::string_view jinja, size_t pos, char quote) {
  std::string text;
  while (pos < jinja.size()) {
    if (jinja.substr(pos).starts_with(kEnd)) return text;
    char c = jinja[pos];
    bool closes = quote ? c == quote : (c == '\'' || c == '"');
    if (closes || c == '{' || c == '}') return std::nullopt;
    if (c == '\\' && pos + 1 < jinja.size()) {
      char e = jinja[pos + 1];
      text += e == 'n' ? '\n' : e == 't' ? '\t' : e;
      pos += 2;
      continue;
    }
    text += c;
    ++pos;
  }
  return std::nullopt;
}

// Escapes text for a single-quoted Jinja string literal.
std::string jinja_literal(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '\'') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void append_turn(std::string& out, std::string_view role, std::string_view content) {
  out += "<|im_start|>";
  out += role;
  out += '\n';
  out += content;
  out += "<|im_end|>\n";
}

}  // namespace

std::string default_system_from_jinja(std::string_view jinja) {
  for (size_t pos = jinja.find(kSystemStart); pos != std::string_view::npos; pos = jinja.find(kSystemStart, pos + 1)) {
    size_t after = pos + kSystemStart.size();
    if (jinja.substr(after).starts_with("\\n")) after += 2;  // an escape inside the Jinja literal
    else if (jinja.substr(after).starts_with("\n")) after += 1;
    else continue;
    char quote = pos > 0 && (jinja[pos - 1] == '\'' || jinja[pos - 1] == '"') ? jinja[pos - 1] : 0;
    std::optional<std::string> text = literal_until_end(jinja, after, quote);
    if (text && !text->empty()) return *text;
  }
  return {};
}

std::string render_chatml(const std::vector<ChatTurn>& turns, bool add_generation_prompt, const ChatTemplate& chat_template) {
  std::string out;
  if (!turns.empty() && turns.front().role != "system" && !chat_template.default_system.empty())
    append_turn(out, "system", chat_template.default_system);
  for (const ChatTurn& turn : turns) append_turn(out, turn.role, turn.content);
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string chatml_jinja(std::string_view default_system) {
  std::string out = "{%- for message in messages %}";
  if (!default_system.empty())
    out += "{%- if loop.first and message['role'] != 'system' %}{{- '<|im_start|>system\\n" +
           jinja_literal(default_system) + "<|im_end|>\\n' }}{%- endif %}";
  out +=
      "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
      "{%- endfor %}"
      "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
  return out;
}

}  // namespace kz
