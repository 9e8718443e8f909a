// Getting the code out of a model's reply.
//
// Models answer in Markdown: reasoning (possibly inside <think>…</think>), then one or more fenced
// code blocks. We take the last block by default (models often sketch before the final answer),
// the first on request; a block with no language tag counts; an unclosed fence runs to the end
// of the reply (a truncated answer still yields its code). No code at all is not an exception:
// the caller turns it into a format_error verdict.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kz {

enum class BlockChoice { last, first };

struct ExtractOptions {
  BlockChoice choice = BlockChoice::last;
  bool prefer_python = true;   // among blocks, prefer ```python (or untagged) ones over ```cuda/```cpp
  bool skip_reasoning = true;  // ignore code inside <think>…</think>
};

// The chosen block's code (without fences), or nullopt when the reply holds no code.
std::optional<std::string> extract_code(std::string_view reply, const ExtractOptions& options = {});

}  // namespace kz
