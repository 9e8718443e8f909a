// ModelFlags: flags named by their config keys, applied over the --config file.
#include "model_flags.h"

#include <fmt/format.h>

#include <map>
#include <stdexcept>
#include <type_traits>
#include <variant>

namespace kz::cli {
namespace {

// A key missing here is a typo in a command's declarations, found the first time it runs.
ConfigField::Target target_of(const ConfigTable& table, const std::string& key) {
  if (const ConfigField* field = find_config_field(table, key)) return field->target;
  throw std::logic_error(fmt::format("a model flag names config key '{}', which ModelOptions' table lacks", key));
}

void copy_value(const ConfigField::Target& from, const ConfigField::Target& to) {
  std::visit([&](auto* source) { *std::get<decltype(source)>(to) = *source; }, from);
}

}  // namespace

ModelFlags::ModelFlags(CLI::App& command) : command_(command) {
  command.add_option("--config", config_path_,
                     "TOML file overriding the defaults (see configs/model.toml); flags given override it");
}

CLI::Option* ModelFlags::add(const std::string& flag, const std::string& key, const std::string& description) {
  CLI::Option* option = std::visit(
      [&](auto* field) -> CLI::Option* {
        using Field = std::remove_pointer_t<decltype(field)>;
        if constexpr (std::is_same_v<Field, bool>) return command_.add_flag(flag, *field, description);
        // ModelOptions has no table field; this branch keeps CLI11's map parsing (which warns) uninstantiated.
        else if constexpr (std::is_same_v<Field, std::map<std::string, long long>>)
          throw std::logic_error(fmt::format("config key '{}' is a table, which no flag can set", key));
        else return command_.add_option(flag, *field, description);
      },
      target_of(config_table(given_), key));
  overrides_.push_back({option, key});
  return option;
}

Result<ModelOptions> ModelFlags::resolve() const {
  ModelOptions options;
  if (!config_path_.empty()) KZ_RETURN_IF_ERROR(apply_toml_file(config_path_, options));
  ModelOptions given = given_;  // config_table() takes the options by non-const reference
  ConfigTable from = config_table(given), to = config_table(options);
  for (const Override& o : overrides_) {
    if (o.option->count() == 0) continue;
    copy_value(target_of(from, o.key), target_of(to, o.key));
    // The bounds a config file would be held to (`--top-p 0` is refused as `top_p = 0` is).
    if (Status checked = check_config_value(*find_config_field(to, o.key), o.key); !checked.is_ok())
      return invalid_argument(fmt::format("{}: {}", o.option->get_name(), checked.message()));
  }
  return options;
}

}  // namespace kz::cli
