// Reading the curriculum's checkpoint JSON with errors that say where: every failure is a
// parse_error "<where>.<key>: expected <what>, got <the value, shortened>".
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kz/core/status.h"

namespace kz::curriculum::detail {

using nlohmann::json;

inline std::string shown(const json& value) {
  std::string text = value.dump();
  return text.size() <= 60 ? text : text.substr(0, 57) + "...";
}

inline Status expect_object(const json& value, const std::string& where) {
  if (value.is_object()) return Status::ok();
  return parse_error(fmt::format("{}: expected a JSON object, got {} {}", where, value.type_name(), shown(value)));
}

// The member `key` of `object` (which must be an object); parse_error when it is missing.
inline Result<const json*> member(const json& object, const std::string& key, const std::string& where) {
  KZ_RETURN_IF_ERROR(expect_object(object, where));
  auto it = object.find(key);
  if (it == object.end()) return parse_error(fmt::format("{}: missing key '{}'", where, key));
  return &*it;
}

inline Status wrong(const std::string& where, const std::string& key, const std::string& expected,
                    const json& value) {
  return parse_error(fmt::format("{}.{}: expected {}, got {}", where, key, expected, shown(value)));
}

// A finite number in [min, max].
inline Status read_number(const json& object, const std::string& key, const std::string& where, double& out,
                          double min = -std::numeric_limits<double>::infinity(),
                          double max = std::numeric_limits<double>::infinity()) {
  auto value = member(object, key, where);
  if (!value.ok()) return value.status();
  const json& v = **value;
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < min || v.get<double>() > max)
    return wrong(where, key,
                 std::isfinite(min) || std::isfinite(max) ? fmt::format("a number in [{}, {}]", min, max)
                                                          : std::string("a finite number"),
                 v);
  out = v.get<double>();
  return Status::ok();
}

// A non-negative integer (that fits an int64_t).
inline Status read_count(const json& object, const std::string& key, const std::string& where, int64_t& out) {
  auto value = member(object, key, where);
  if (!value.ok()) return value.status();
  const json& v = **value;
  bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max())
                                     : v.is_number_integer() && v.get<int64_t>() >= 0;
  if (!fits) return wrong(where, key, "a non-negative integer", v);
  out = v.get<int64_t>();
  return Status::ok();
}

inline Status read_uint64(const json& object, const std::string& key, const std::string& where, uint64_t& out) {
  auto value = member(object, key, where);
  if (!value.ok()) return value.status();
  const json& v = **value;
  if (v.is_number_unsigned()) out = v.get<uint64_t>();
  else if (v.is_number_integer() && v.get<int64_t>() >= 0) out = uint64_t(v.get<int64_t>());
  else return wrong(where, key, "a non-negative integer", v);
  return Status::ok();
}

inline Status read_string(const json& object, const std::string& key, const std::string& where, std::string& out) {
  auto value = member(object, key, where);
  if (!value.ok()) return value.status();
  if (!(*value)->is_string()) return wrong(where, key, "a string", **value);
  out = (*value)->get<std::string>();
  return Status::ok();
}

inline Status read_string_list(const json& object, const std::string& key, const std::string& where,
                               std::vector<std::string>& out) {
  auto value = member(object, key, where);
  if (!value.ok()) return value.status();
  const json& v = **value;
  if (!v.is_array()) return wrong(where, key, "an array of strings", v);
  out.clear();
  for (const auto& item : v) {
    if (!item.is_string()) return wrong(where, key, "an array of strings", v);
    out.push_back(item.get<std::string>());
  }
  return Status::ok();
}

}  // namespace kz::curriculum::detail
