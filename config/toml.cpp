// Reading settings from a TOML file with toml++.
//
// toml++ is used header-only in this one translation unit (see
// CMakeLists.txt), so neither the library nor the Python module needs
// libtomlplusplus.so at run time.
#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <toml++/toml.h>

#include "cadeloop/config/settings.hpp"
#include "settings_detail.hpp"

namespace cadeloop::config {

namespace {

/// A TOML value as a typed input; arrays, tables and dates are "foreign" and
/// always refused, shown the way the user would recognise them.
typed_input to_input(const toml::node& node) {
  if (const auto* i = node.as_integer()) {
    return i->get();
  }
  if (const auto* f = node.as_floating_point()) {
    return f->get();
  }
  if (const auto* b = node.as_boolean()) {
    return b->get();
  }
  if (const auto* s = node.as_string()) {
    return s->get();
  }
  if (node.is_table()) {
    return foreign{"a table"};
  }
  if (node.is_array()) {
    return foreign{"an array"};
  }
  return foreign{"a date or time"};
}

std::string at_line(std::string_view path, toml::source_index line) {
  return std::string(path) + ":" + std::to_string(line);
}

}  // namespace

std::vector<assignment> load_toml(std::string_view text, std::string_view path) {
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw setting_error(error_kind::file,
                        at_line(path, e.source().begin.line) + ": " + std::string(e.description()));
  }
  // toml++ keeps keys sorted; check (and apply) them in file order so the
  // first mistake reported is the first one in the file.
  struct entry {
    toml::source_index line;
    std::string_view key;
    const toml::node* node;
  };
  std::vector<entry> entries;
  for (auto&& [key, node] : root) {
    entries.push_back({key.source().begin.line, key.str(), &node});
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const entry& a, const entry& b) { return a.line < b.line; });
  std::vector<assignment> out;
  for (const entry& e : entries) {
    const setting* s = find_setting(e.key);
    if (s == nullptr) {
      throw setting_error(error_kind::unknown_name,
                          at_line(path, e.line) + ": " + unknown_setting_line(e.key));
    }
    const std::string origin = at_line(path, e.node->source().begin.line);
    out.push_back({s, accept(*s, to_input(*e.node), origin + ": " + std::string(s->name)), origin});
  }
  return out;
}

std::vector<assignment> load_toml_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw setting_error(error_kind::file, path + ": cannot read the settings file: " +
                                              std::generic_category().message(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    throw setting_error(error_kind::file, path + ": cannot read the settings file: " +
                                              std::generic_category().message(errno));
  }
  return load_toml(text.str(), path);
}

}  // namespace cadeloop::config
