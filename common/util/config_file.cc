#include "common/util/config_file.h"

#include <yaml-cpp/yaml.h>

#include <memory>
#include <string>
#include <vector>

namespace fusor {
namespace {

std::string Where(const YAML::Mark& mark) {
  return mark.is_null() ? "--config" : "--config line " + std::to_string(mark.line + 1);
}

class YamlConfig : public CLI::Config {
 public:
  // The options' current values as a config file (what --config reads).
  std::string to_config(const CLI::App* app, bool default_also, bool, std::string) const override {
    YAML::Emitter out;
    out << YAML::BeginMap;
    for (const CLI::Option* opt : app->get_options()) {
      if (!opt->get_configurable() || opt->get_lnames().empty()) continue;
      std::vector<std::string> values = opt->reduced_results();
      if (values.empty() && default_also && !opt->get_default_str().empty()) values = {opt->get_default_str()};
      if (values.empty()) continue;
      out << YAML::Key << opt->get_lnames().front() << YAML::Value;
      if (values.size() == 1) {
        out << values.front();
      } else {
        out << YAML::Flow << values;
      }
    }
    out << YAML::EndMap;
    return std::string(out.c_str()) + "\n";
  }

  std::vector<CLI::ConfigItem> from_config(std::istream& in) const override {
    YAML::Node root;
    try {
      root = YAML::Load(in);
    } catch (const YAML::Exception& e) {
      throw CLI::ConversionError(Where(e.mark) + ": " + e.msg);
    }
    std::vector<CLI::ConfigItem> items;
    if (root.IsNull()) return items;
    if (!root.IsMap()) throw CLI::ConversionError(Where(root.Mark()) + ": expected a map of flag names to values");
    for (const auto& kv : root) {
      CLI::ConfigItem item;
      item.name = kv.first.as<std::string>();
      const YAML::Node& v = kv.second;
      if (v.IsScalar()) {
        item.inputs = {v.as<std::string>()};
      } else if (v.IsSequence()) {
        for (const YAML::Node& e : v) {
          if (!e.IsScalar()) throw CLI::ConversionError(Where(e.Mark()) + ": '" + item.name + "' takes a list of values");
          item.inputs.push_back(e.as<std::string>());
        }
      } else {
        throw CLI::ConversionError(Where(v.Mark()) + ": '" + item.name + "' needs a value or a list of values");
      }
      items.push_back(std::move(item));
    }
    return items;
  }
};

}  // namespace

void AddConfigFile(CLI::App& app) {
  app.config_formatter(std::make_shared<YamlConfig>());
  app.set_config("--config", "", "a YAML file of flag values (name: value, names without --); flags given override it")
      ->check(CLI::ExistingFile);
  app.allow_config_extras(CLI::config_extras_mode::error);
}

}  // namespace fusor
