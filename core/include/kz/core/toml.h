// Parsing TOML text into a toml++ table, with the error as "origin:line:column: what".
#pragma once

#include <toml++/toml.h>

#include <string_view>

#include "kz/core/status.h"

namespace kz {

// `origin` names the text in the error (a file path, or "--config" for a flag's value).
Result<toml::table> parse_toml(std::string_view text, std::string_view origin);

}  // namespace kz
