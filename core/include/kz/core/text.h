// Text bound for JSON or HTML. JSON must be valid UTF-8: a worker's stderr, a truncated tail or a
// candidate file can hold arbitrary bytes, and nlohmann::json refuses to serialise those. The
// HTML reports (kz bench, kz report) show names and values a user or a model wrote.
#pragma once

#include <string>
#include <string_view>

namespace kz {

// `text` with every byte that is not part of a well-formed UTF-8 sequence replaced by U+FFFD.
std::string to_valid_utf8(std::string_view text);

// `text` safe inside an HTML element or a double-quoted attribute: < > & " escaped.
std::string html_escape(std::string_view text);

}  // namespace kz
