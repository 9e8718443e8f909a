#include "kz/core/toml.h"

#include <fmt/format.h>

#include <string>

namespace kz {

Result<toml::table> parse_toml(std::string_view text, std::string_view origin) {
  try {
    return toml::parse(text, std::string(origin));
  } catch (const toml::parse_error& error) {
    return parse_error(fmt::format("{}:{}:{}: {}", origin, error.source().begin.line, error.source().begin.column,
                                   error.description()));
  }
}

}  // namespace kz
