// Kernel formats a candidate can be written in, and detecting which one a source uses.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kz {

enum class Format { cuda, triton, cuda_rtc, torch };

const char* format_name(Format format);  // "cuda", "triton", "cuda-rtc", "torch"
std::optional<Format> parse_format(std::string_view name);

// Detects cuda (load_inline / cpp_extension), cuda-rtc (kz_rtc) or triton (@triton.jit) from the
// source text. `torch` is never detected: plain PyTorch is only evaluated when asked for.
std::optional<Format> detect_format(std::string_view source);

}  // namespace kz
