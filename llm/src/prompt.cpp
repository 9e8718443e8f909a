// Prompt templates (prompt.h): loading the TOML files, {{placeholder}} rendering, chat messages.
#include "kz/llm/prompt.h"

#include <fmt/format.h>

#include <cctype>

#include "kz/core/files.h"
#include "kz/core/toml.h"

namespace kz {
namespace {

Result<PromptTemplate> template_from_table(const toml::table& table, const std::filesystem::path& path) {
  PromptTemplate prompt;
  prompt.name = path.stem().string();
  for (const auto& [key, node] : table) {
    auto value = node.value_exact<std::string>();
    if (!value) return invalid_argument(fmt::format("key '{}' must be a string", key.str()));
    if (key == "name") prompt.name = *value;
    else if (key == "description") prompt.description = *value;
    else if (key == "system") prompt.system = *value;
    else if (key == "user") prompt.user = *value;
    else prompt.extras.emplace(std::string(key.str()), *value);
  }
  for (const char* required : {"system", "user"})
    if (!table.contains(required)) return invalid_argument(fmt::format("missing required key '{}'", required));
  return prompt;
}

bool is_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

std::string_view trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

}  // namespace

Result<PromptTemplate> load_prompt_template(const std::filesystem::path& path) {
  auto text = read_file(path);
  if (!text.ok()) return text.status();
  auto table = parse_toml(*text, path.string());
  if (!table.ok()) return table.status();
  auto prompt = template_from_table(*table, path);
  if (!prompt.ok()) return prompt.status().with_context(path.string());
  return prompt;
}

Result<std::string> render(const std::string& text, const std::map<std::string, std::string>& values) {
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t open = text.find("{{", pos);
    out.append(text, pos, open == std::string::npos ? std::string::npos : open - pos);
    if (open == std::string::npos) return out;
    size_t close = text.find("}}", open + 2);
    if (close == std::string::npos) return invalid_argument(fmt::format("unterminated placeholder at offset {}", open));
    std::string_view name = trim(std::string_view(text).substr(open + 2, close - open - 2));
    if (!is_name(name)) return invalid_argument(fmt::format("malformed placeholder '{}'", text.substr(open, close + 2 - open)));
    auto value = values.find(std::string(name));
    if (value == values.end()) return invalid_argument(fmt::format("unknown placeholder {{{{{}}}}}", name));
    out += value->second;  // appended, never scanned again: values may hold "{{"
    pos = close + 2;
  }
}

Result<std::vector<ChatMessage>> build_messages(const PromptTemplate& prompt,
                                                const std::map<std::string, std::string>& values) {
  std::map<std::string, std::string> all = values;
  all.insert(prompt.extras.begin(), prompt.extras.end());  // insert keeps the caller's value on a clash
  auto system = render(prompt.system, all);
  if (!system.ok()) return system.status().with_context(fmt::format("prompt '{}': system", prompt.name));
  auto user = render(prompt.user, all);
  if (!user.ok()) return user.status().with_context(fmt::format("prompt '{}': user", prompt.name));
  return std::vector<ChatMessage>{{"system", std::move(*system)}, {"user", std::move(*user)}};
}

Result<std::filesystem::path> coder_prompt_path(const std::filesystem::path& prompts_dir, const std::string& format) {
  static const std::map<std::string, std::string> files = {
      {"cuda-rtc", "coder_cuda_rtc.toml"}, {"triton", "coder_triton.toml"}, {"cuda", "coder_cuda.toml"}};
  auto it = files.find(format);
  if (it == files.end())
    return invalid_argument(fmt::format("no coder prompt for format '{}' (known: cuda-rtc, triton, cuda)", format));
  std::filesystem::path path = prompts_dir / it->second;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return not_found(fmt::format("coder prompt {} does not exist", path.string()));
  return path;
}

}  // namespace kz
