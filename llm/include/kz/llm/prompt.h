// Prompt templates: TOML files under prompts/ that turn a task into chat messages.
//
// A template file holds `name`, `description`, `system` and `user` strings, plus any other string
// keys (the coders' one-shot `example_reference` / `example_candidate`), kept as `extras`.
// Placeholders are written {{name}}; rendering is one pass, so a value that itself contains
// "{{" (a reference module, a CUDA source) is inserted verbatim, never expanded again.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kz/core/status.h"
#include "kz/llm/generator.h"

namespace kz {

struct PromptTemplate {
  std::string name;                           // `name` in the file; the file stem when absent
  std::string description;                    // one line for people; optional
  std::string system;                         // the system message template (required)
  std::string user;                           // the user message template (required)
  std::map<std::string, std::string> extras;  // every other string key of the file
};

// Reads and checks a template file. Errors: not_found / io_error for the file, parse_error with
// "file:line:col" for bad TOML, invalid_argument naming the key for a missing `system`/`user` or a
// non-string value.
Result<PromptTemplate> load_prompt_template(const std::filesystem::path& path);

// Replaces every {{name}} (spaces inside the braces allowed) with values.at(name), in one pass.
// Every "{{" in `text` must open a placeholder: an unknown name, a malformed or an unterminated
// placeholder is an invalid_argument error naming it.
Result<std::string> render(const std::string& text, const std::map<std::string, std::string>& values);

// The system and user messages, rendered with the template's extras overlaid by `values` (the
// caller's values win on a shared name).
Result<std::vector<ChatMessage>> build_messages(const PromptTemplate& prompt,
                                                const std::map<std::string, std::string>& values);

// The coder template for a candidate format: "cuda-rtc" -> prompts_dir/coder_cuda_rtc.toml,
// "triton" -> coder_triton.toml, "cuda" -> coder_cuda.toml. Errors: invalid_argument for another
// format, not_found when the file is missing.
Result<std::filesystem::path> coder_prompt_path(const std::filesystem::path& prompts_dir, const std::string& format);

}  // namespace kz
