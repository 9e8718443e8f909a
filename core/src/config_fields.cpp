// ConfigTable: reading TOML onto the fields and printing them (see config_fields.h).
#include "kz/core/config_fields.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <regex>
#include <sstream>
#include <type_traits>
#include <utility>

#include "kz/core/files.h"
#include "kz/core/toml.h"

namespace kz {

ConfigField& ConfigField::at_least(double bound) {
  min = bound;
  min_exclusive = false;
  return *this;
}

ConfigField& ConfigField::above(double bound) {
  min = bound;
  min_exclusive = true;
  return *this;
}

ConfigField& ConfigField::at_most(double bound) {
  max = bound;
  return *this;
}

ConfigField& ConfigField::matching(std::string regex, std::string in_words) {
  pattern = std::move(regex);
  expected = std::move(in_words);
  return *this;
}

namespace {

Status wrong_type(const std::string& key, std::string_view expected) {
  return invalid_argument(fmt::format("config key '{}' must be {}", key, expected));
}

// "> 0 and <= 1"
std::string describe_bounds(const ConfigField& field) {
  std::vector<std::string> parts;
  if (field.min) parts.push_back(fmt::format("{} {}", field.min_exclusive ? ">" : ">=", *field.min));
  if (field.max) parts.push_back(fmt::format("<= {}", *field.max));
  return fmt::format("{}", fmt::join(parts, " and "));
}

// Written so that NaN fails every bound.
Status check_bounds(const ConfigField& field, const std::string& key, double value) {
  bool too_low = field.min && !(field.min_exclusive ? value > *field.min : value >= *field.min);
  bool too_high = field.max && !(value <= *field.max);
  if (too_low || too_high)
    return invalid_argument(fmt::format("config key '{}' must be {}, got {}", key, describe_bounds(field), value));
  return Status::ok();
}

Status read_into(const toml::node& node, const std::string& key, const ConfigField& field, bool& target) {
  if (!node.is_boolean()) return wrong_type(key, "true or false");
  target = *node.value<bool>();
  return Status::ok();
}

// Integers are TOML integers only (never floats or booleans), within the field's type.
template <class T>
  requires std::is_integral_v<T>
Status read_into(const toml::node& node, const std::string& key, const ConfigField& field, T& target) {
  if (!node.is_integer()) return wrong_type(key, "an integer");
  int64_t value = node.as_integer()->get();
  if (!std::in_range<T>(value))
    return invalid_argument(fmt::format("config key '{}' must be between {} and {}, got {}", key,
                                        std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), value));
  KZ_RETURN_IF_ERROR(check_bounds(field, key, static_cast<double>(value)));
  target = static_cast<T>(value);
  return Status::ok();
}

// A float key also takes an integer: `temperature = 0` means 0.0.
Status read_into(const toml::node& node, const std::string& key, const ConfigField& field, double& target) {
  if (!node.is_number()) return wrong_type(key, "a number");
  double value = *node.value<double>();
  KZ_RETURN_IF_ERROR(check_bounds(field, key, value));
  target = value;
  return Status::ok();
}

Status check_pattern(const ConfigField& field, const std::string& key, const std::string& value) {
  if (!field.pattern.empty() && !std::regex_match(value, std::regex(field.pattern)))
    return invalid_argument(fmt::format("config key '{}' must be {}, got \"{}\"", key, field.expected, value));
  return Status::ok();
}

Status read_into(const toml::node& node, const std::string& key, const ConfigField& field, std::string& target) {
  if (!node.is_string()) return wrong_type(key, "a string");
  std::string value = *node.value<std::string>();
  KZ_RETURN_IF_ERROR(check_pattern(field, key, value));
  target = std::move(value);
  return Status::ok();
}

Status read_into(const toml::node& node, const std::string& key, const ConfigField& field,
                 std::filesystem::path& target) {
  std::string text;
  KZ_RETURN_IF_ERROR(read_into(node, key, field, text));
  target = text;
  return Status::ok();
}

Status read_into(const toml::node& node, const std::string& key, const ConfigField& field,
                 std::vector<std::string>& target) {
  const toml::array* array = node.as_array();
  if (!array || !(array->empty() || array->is_homogeneous(toml::node_type::string)))
    return wrong_type(key, "an array of strings");
  target.clear();
  for (const toml::node& item : *array) target.push_back(*item.value<std::string>());
  return Status::ok();
}

Status read_into(const toml::node& node, const std::string& key, const ConfigField& field,
                 std::map<std::string, long long>& target) {
  const toml::table* table = node.as_table();
  if (!table) return wrong_type(key, "a table");
  for (const auto& [name, value] : *table) {
    if (!value.is_integer()) return wrong_type(fmt::format("{}.{}", key, name.str()), "an integer");
    target[std::string(name.str())] = value.as_integer()->get();
  }
  return Status::ok();
}

bool is_section(const ConfigTable& table, const std::string& name) {
  for (const ConfigEntry& entry : table)
    if (entry.key.starts_with(name + ".")) return true;
  return false;
}

Status apply_table(const toml::table& toml_table, const std::string& prefix, const ConfigTable& table) {
  for (const auto& [name, node] : toml_table) {
    std::string key = prefix + std::string(name.str());
    if (const ConfigField* field = find_config_field(table, key)) {
      auto read = [&](auto* target) { return read_into(node, key, *field, *target); };
      KZ_RETURN_IF_ERROR(std::visit(read, field->target));
    } else if (node.is_table() && is_section(table, key)) {
      KZ_RETURN_IF_ERROR(apply_table(*node.as_table(), key + ".", table));
    } else {
      return invalid_argument(fmt::format("unknown config {} '{}'", node.is_table() ? "section" : "key", key));
    }
  }
  return Status::ok();
}

// A basic "..." string with escapes: toml++'s default flags may print a multi-line literal
// ('''...'''), whose first newline TOML drops when reading it back.
std::string toml_quote(const std::string& text) {
  std::ostringstream out;
  out << toml::toml_formatter(toml::value<std::string>(text), toml::format_flags::allow_unicode_strings);
  return out.str();
}

// The shortest text that reads back as the same double, always with a '.' or an exponent so that
// TOML reads a float.
std::string format_float(double value) {
  std::string text = fmt::format("{}", value);
  if (std::isfinite(value) && text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

template <class T>
std::string show(const T& value) {
  if constexpr (std::is_same_v<T, bool>) return value ? "true" : "false";
  else if constexpr (std::is_integral_v<T>) return std::to_string(value);
  else if constexpr (std::is_same_v<T, double>) return format_float(value);
  else if constexpr (std::is_same_v<T, std::string>) return toml_quote(value);
  else if constexpr (std::is_same_v<T, std::filesystem::path>) return toml_quote(value.string());
  else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    std::vector<std::string> quoted;
    for (const auto& item : value) quoted.push_back(toml_quote(item));
    return fmt::format("[{}]", fmt::join(quoted, ", "));
  } else {  // a table of integers: its entries, one per line (the caller prints the [section] line)
    std::string lines;
    for (const auto& [name, number] : value) lines += fmt::format("{} = {}\n", name, number);
    return lines;
  }
}

}  // namespace

Status check_config_value(const ConfigField& field, const std::string& key) {
  return std::visit(
      [&](auto* value) -> Status {
        using T = std::remove_pointer_t<decltype(value)>;
        if constexpr (std::is_same_v<T, bool>) return Status::ok();
        else if constexpr (std::is_arithmetic_v<T>) return check_bounds(field, key, static_cast<double>(*value));
        else if constexpr (std::is_same_v<T, std::string>) return check_pattern(field, key, *value);
        else return Status::ok();  // paths, string lists and integer tables carry no bounds
      },
      field.target);
}

const ConfigField* find_config_field(const ConfigTable& table, std::string_view key) {
  for (const ConfigEntry& entry : table)
    if (entry.key == key) return &entry.field;
  return nullptr;
}

Status apply_config_text(std::string_view text, std::string_view origin, const ConfigTable& table) {
  auto parsed = parse_toml(text, origin);
  if (!parsed.ok()) return parsed.status();
  return apply_table(*parsed, "", table).with_context(std::string(origin));
}

Status apply_config_file(const std::filesystem::path& path, const ConfigTable& table) {
  auto text = read_file(path);
  if (!text.ok()) return text.status();
  return apply_config_text(*text, path.string(), table);
}

Status apply_config_override(std::string_view assignment, const ConfigTable& table) {
  const std::string origin = fmt::format("--set {}", assignment);
  auto eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0)
    return invalid_argument(fmt::format("{}: give section.key=VALUE", origin));
  auto trim = [](std::string_view text) {
    auto first = text.find_first_not_of(" \t"), last = text.find_last_not_of(" \t");
    return first == std::string_view::npos ? std::string() : std::string(text.substr(first, last - first + 1));
  };
  std::string key = trim(assignment.substr(0, eq)), value = trim(assignment.substr(eq + 1));
  if (!find_config_field(table, key)) return invalid_argument(fmt::format("{}: unknown config key '{}'", origin, key));
  std::string text = fmt::format("{} = {}", key, value);
  if (!parse_toml(text, origin).ok()) text = fmt::format("{} = {}", key, toml_quote(value));
  return apply_config_text(text, origin, table);
}

std::string config_to_toml(const ConfigTable& table) {
  std::string out, section;
  for (const ConfigEntry& entry : table) {
    bool is_table = std::holds_alternative<std::map<std::string, long long>*>(entry.field.target);
    auto dot = entry.key.rfind('.');
    bool top_level = dot == std::string::npos;
    std::string entry_section = is_table ? entry.key : top_level ? "" : entry.key.substr(0, dot);
    if (entry_section != section) {
      out += fmt::format("\n[{}]\n", entry_section);
      section = entry_section;
    }
    std::string value = std::visit([](auto* target) { return show(*target); }, entry.field.target);
    if (is_table) out += value;
    else out += fmt::format("{} = {}\n", top_level ? entry.key : entry.key.substr(dot + 1), value);
  }
  return out;
}

}  // namespace kz
