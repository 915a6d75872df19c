// resolved_values: one value per setting, addressed by setting_id, and its
// typed reads (a read of the wrong kind is fatal, naming the setting).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

#include "cadeloop/config/settings.hpp"

namespace cadeloop::config {

namespace {

/// A caller asked a setting for what its row is not: a bug in C++ code, not
/// a bad value from a user (those never get past `accept`).
[[noreturn]] void wrong_kind(setting_id id, const char* asked) {
  std::fprintf(stderr, "cadeloop: config: setting %.*s read as %s, which its row is not\n",
               static_cast<int>(row(id).name.size()), row(id).name.data(), asked);
  std::abort();
}

bool fits_row(const setting& s, const value& v) {
  if (std::holds_alternative<std::monostate>(v)) {
    return s.nullable;
  }
  switch (s.type) {
    case kind::integer:
    case kind::size:
      return std::holds_alternative<std::int64_t>(v);
    case kind::duration:
    case kind::number:
      return std::holds_alternative<double>(v);
    case kind::boolean:
      return std::holds_alternative<bool>(v);
    case kind::string:
    case kind::choice:
      return std::holds_alternative<std::string>(v);
  }
  return false;
}

}  // namespace

resolved_values::resolved_values() {
  for (const setting& s : settings()) {
    values_[static_cast<std::size_t>(id_of(s))] = default_value(s);
  }
}

resolved_values::resolved_values(std::span<const resolved_setting> resolved) : resolved_values() {
  for (const resolved_setting& r : resolved) {
    set(id_of(*r.def), r.v);
  }
}

void resolved_values::set(setting_id id, value v) {
  if (!fits_row(row(id), v)) {
    wrong_kind(id, "a value of another kind");
  }
  values_[static_cast<std::size_t>(id)] = std::move(v);
}

bool resolved_values::is_none(setting_id id) const noexcept {
  return std::holds_alternative<std::monostate>((*this)[id]);
}

std::int64_t resolved_values::whole(setting_id id) const {
  const kind k = row(id).type;
  const auto* n = std::get_if<std::int64_t>(&(*this)[id]);
  if ((k != kind::integer && k != kind::size) || n == nullptr) {
    wrong_kind(id, "a whole number");
  }
  return *n;
}

double resolved_values::real(setting_id id) const {
  const kind k = row(id).type;
  const auto* d = std::get_if<double>(&(*this)[id]);
  if ((k != kind::duration && k != kind::number) || d == nullptr) {
    wrong_kind(id, "a real number");
  }
  return *d;
}

bool resolved_values::flag(setting_id id) const {
  const auto* b = std::get_if<bool>(&(*this)[id]);
  if (row(id).type != kind::boolean || b == nullptr) {
    wrong_kind(id, "a boolean");
  }
  return *b;
}

const std::string& resolved_values::text(setting_id id) const {
  const kind k = row(id).type;
  const auto* t = std::get_if<std::string>(&(*this)[id]);
  if ((k != kind::string && k != kind::choice) || t == nullptr) {
    wrong_kind(id, "text");
  }
  return *t;
}

}  // namespace cadeloop::config
