// Text that crosses into JSON must be valid UTF-8: a worker's stderr, a truncated tail or a
// candidate file can hold arbitrary bytes, and nlohmann::json refuses to serialise those.
#pragma once

#include <string>
#include <string_view>

namespace kz {

// `text` with every byte that is not part of a well-formed UTF-8 sequence replaced by U+FFFD.
std::string to_valid_utf8(std::string_view text);

}  // namespace kz
