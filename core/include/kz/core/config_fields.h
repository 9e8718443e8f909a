// Option structs read from TOML and printed back as TOML through one table of their fields.
//
// A ConfigTable lists every configurable field of an options struct as "section.key" -> a
// reference to the field, in the order the TOML is printed. The same table reads a file and
// prints the resolved values, so the two cannot disagree. Unknown keys, wrong types and values
// outside a field's bounds are errors naming the key. The evaluator (configs/eval.toml) and the
// model commands (configs/model.toml) use it; its users need not include toml++ (kz/core/toml.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "kz/core/status.h"

namespace kz {

// One configurable field: where it lives and which values it accepts.
struct ConfigField {
  using Target = std::variant<bool*, int*, int64_t*, uint64_t*, double*, std::string*, std::filesystem::path*,
                              std::vector<std::string>*,           // a TOML array of strings (replaced whole)
                              std::map<std::string, long long>*>;  // a [table] of integers under any names (merged)

  // Implicit, so that a table reads {"timing.runs", options.timing.runs}. (The constraint keeps
  // copies of a ConfigField on the copy constructor.)
  template <class T>
    requires std::is_constructible_v<Target, T*>
  ConfigField(T& field) : target(&field) {}  // NOLINT(google-explicit-constructor)

  // Bounds on a number, checked as it is read (integers are also checked against their type's range).
  ConfigField& at_least(double bound);
  ConfigField& above(double bound);
  ConfigField& at_most(double bound);
  // A string must match `pattern` (a whole-string ECMAScript regex); `expected` says in words what matches.
  ConfigField& matching(std::string pattern, std::string expected);

  Target target;
  std::optional<double> min, max;
  bool min_exclusive = false;
  std::string pattern, expected;
};

struct ConfigEntry {
  std::string key;  // "section.key"; a key without a dot is top-level (list those first)
  ConfigField field;
};
using ConfigTable = std::vector<ConfigEntry>;

// Sets the fields named by the keys present in `text` ("[timing]\nruns = 3" sets "timing.runs");
// keys left out keep their values. `origin` names the text in errors: "cfg.toml:3:7: <syntax
// error>", "cfg.toml: unknown config key 'timing.runz'".
Status apply_config_text(std::string_view text, std::string_view origin, const ConfigTable& table);
Status apply_config_file(const std::filesystem::path& path, const ConfigTable& table);
// One command-line override "section.key=VALUE" (`--set`): VALUE as TOML ("2", "true", "[\"a\"]",
// "\"text\""), or, where it does not read as TOML, as a plain string (--set reward.mode=ungated).
Status apply_config_override(std::string_view assignment, const ConfigTable& table);

// Checks the value `field` holds now against its bounds or pattern, as reading it from TOML does:
// for values set another way (command-line flags). Errors name `key`.
Status check_config_value(const ConfigField& field, const std::string& key);

// The field of `key` in `table`; nullptr when the table has no such key.
const ConfigField* find_config_field(const ConfigTable& table, std::string_view key);

// Every field as TOML: the top-level keys, then one [section] per prefix, in the table's order.
std::string config_to_toml(const ConfigTable& table);

}  // namespace kz
