// Kernel format names and detection from source text.
#include "kz/eval/format.h"

#include <regex>

namespace kz {

const char* format_name(Format format) {
  switch (format) {
    case Format::cuda: return "cuda";
    case Format::triton: return "triton";
    case Format::cuda_rtc: return "cuda-rtc";
    case Format::torch: return "torch";
  }
  return "?";
}

std::optional<Format> parse_format(std::string_view name) {
  for (Format f : {Format::cuda, Format::triton, Format::cuda_rtc, Format::torch})
    if (name == format_name(f)) return f;
  return std::nullopt;
}

std::optional<Format> detect_format(std::string_view source) {
  const std::string text(source);
  auto has = [&](const char* pattern) { return std::regex_search(text, std::regex(pattern, std::regex::multiline)); };
  // Order matters: a cuda-rtc or cuda file may mention triton in a comment, not the reverse.
  if (has(R"(^\s*(import\s+kz_rtc|from\s+kz_rtc\s+import))")) return Format::cuda_rtc;
  if (has(R"(\bload_inline\s*\()") || has(R"(torch\.utils\.cpp_extension)")) return Format::cuda;
  if (has(R"(@\s*triton\.jit)") || has(R"(^\s*from\s+triton\s+import\s+jit)")) return Format::triton;
  return std::nullopt;
}

}  // namespace kz
