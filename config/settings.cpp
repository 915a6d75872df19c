// Reading, checking and writing setting values; environment, flags, resolution.
#include "cadeloop/config/settings.hpp"

#include "settings_detail.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <system_error>

namespace cadeloop::config {

namespace {

char lower(char c) noexcept {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

bool equal_nocase(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) {
      return false;
    }
  }
  return true;
}

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

/// Splits "1.5GiB" into the number ("1.5") and the unit ("GiB"); the number
/// is digits with at most one dot, no sign, no exponent.
std::pair<std::string_view, std::string_view> split_number(std::string_view s) noexcept {
  std::size_t i = 0;
  bool dot = false;
  while (i < s.size() && ((s[i] >= '0' && s[i] <= '9') || (s[i] == '.' && !dot))) {
    dot = dot || s[i] == '.';
    ++i;
  }
  return {s.substr(0, i), trim(s.substr(i))};
}

std::optional<double> to_double(std::string_view s) noexcept {
  if (s.empty()) {
    return std::nullopt;
  }
  double d = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
  if (ec != std::errc{} || end != s.data() + s.size() || !std::isfinite(d)) {
    return std::nullopt;
  }
  return d;
}

std::optional<std::int64_t> to_int(std::string_view s) noexcept {
  if (!s.empty() && s.front() == '+') {
    s.remove_prefix(1);
  }
  if (s.empty()) {
    return std::nullopt;
  }
  std::int64_t n = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc{} || end != s.data() + s.size()) {
    return std::nullopt;
  }
  return n;
}

std::string shortest(double d) {
  std::array<char, 32> buf{};
  const auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), d);
  return ec == std::errc{} ? std::string(buf.data(), end) : std::string("?");
}

/// Text as a double-quoted string, the way TOML and Python's users read it.
std::string quote(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      constexpr std::string_view hex = "0123456789abcdef";
      const auto u = static_cast<unsigned char>(c);
      out += "\\x";
      out += hex[u >> 4U];
      out += hex[u & 0xfU];
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

/// The "expected ..." part of an error for a setting of kind `s.type`.
std::string expected(const setting& s) {
  switch (s.type) {
    case kind::integer:
      return "expected an integer";
    case kind::size:
      return "expected a size like \"16MiB\"";
    case kind::duration:
      return "expected a duration like \"30s\"";
    case kind::number:
      return "expected a number";
    case kind::boolean:
      return "expected true or false";
    case kind::string:
      return "expected a string";
    case kind::choice: {
      std::string out = "expected one of ";
      for (std::size_t i = 0; i < s.choices.size(); ++i) {
        if (i != 0) {
          out += i + 1 == s.choices.size() ? " or " : ", ";
        }
        out += quote(s.choices[i]);
      }
      return out;
    }
  }
  return "expected a value";
}

/// uds_mode: permission bits in octal ("660", "0660", "0o660"), at most 07777.
bool octal_mode_text(std::string_view t) {
  if (t.starts_with("0o") || t.starts_with("0O")) {
    t.remove_prefix(2);
  }
  if (t.empty() || t.size() > 5) {
    return false;
  }
  unsigned v = 0;
  for (const char ch : t) {
    if (ch < '0' || ch > '7') {
      return false;
    }
    v = v * 8 + static_cast<unsigned>(ch - '0');
  }
  return v <= 07777;
}

[[noreturn]] void invalid(const setting& s, std::string_view where, std::string_view shown) {
  throw setting_error(error_kind::invalid,
                      std::string(where) + ": " + expected(s) + ", got " + std::string(shown));
}

std::string bound_text(const setting& s, bool high) {
  switch (s.type) {
    case kind::size:
      return format_size(high ? s.max_int : s.min_int);
    case kind::duration:
      return format_duration(high ? s.max_real : s.min_real);
    case kind::number:
      return shortest(high ? s.max_real : s.min_real);
    default:
      return std::to_string(high ? s.max_int : s.min_int);
  }
}

/// `where` for range errors always names the setting, even when the source
/// (a variable, a flag) already does: the bounds belong to the setting.
[[noreturn]] void out_of_range(const setting& s, std::string_view where, std::string_view shown) {
  std::string line(where);
  if (where != s.name && !where.ends_with(": " + std::string(s.name))) {
    line += ": ";
    line += s.name;
  }
  line += ": must be between " + bound_text(s, false) + " and " + bound_text(s, true) + ", got " +
          std::string(shown);
  throw setting_error(error_kind::out_of_range, line);
}

value checked_int(const setting& s, std::int64_t n, std::string_view where,
                  std::string_view shown) {
  if (n < s.min_int || n > s.max_int) {
    out_of_range(s, where, shown);
  }
  return n;
}

value checked_real(const setting& s, double d, std::string_view where, std::string_view shown) {
  if (!(d >= s.min_real && d <= s.max_real)) {
    out_of_range(s, where, shown);
  }
  return d;
}

value checked_choice(const setting& s, std::string_view word, std::string_view where) {
  for (const std::string_view c : s.choices) {
    if (c == word) {
      return std::string(c);
    }
  }
  invalid(s, where, quote(word));
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) {
    row[j] = j;
  }
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      const std::size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + cost});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string suggestion_suffix(const std::string& near) {
  return near.empty() ? std::string() : " (did you mean " + quote(near) + "?)";
}

std::vector<std::string> names_as(std::string (*spell)(const setting&)) {
  std::vector<std::string> out;
  for (const setting& s : settings()) {
    out.push_back(spell(s));
  }
  return out;
}

std::string plain_name(const setting& s) {
  return std::string(s.name);
}

}  // namespace

// ---------------------------------------------------------------- units

std::optional<std::int64_t> parse_size(std::string_view text) noexcept {
  const auto [number, unit] = split_number(trim(text));
  if (number.empty() || number == ".") {
    return std::nullopt;
  }
  struct unit_factor {
    std::string_view name;
    std::int64_t factor;
  };
  static constexpr std::array<unit_factor, 12> units{{
      {"", 1},
      {"b", 1},
      {"kib", std::int64_t{1} << 10},
      {"mib", std::int64_t{1} << 20},
      {"gib", std::int64_t{1} << 30},
      {"tib", std::int64_t{1} << 40},
      {"pib", std::int64_t{1} << 50},
      {"kb", 1000},
      {"mb", 1000 * 1000},
      {"gb", 1000 * 1000 * 1000},
      {"tb", std::int64_t{1000} * 1000 * 1000 * 1000},
      {"pb", std::int64_t{1000} * 1000 * 1000 * 1000 * 1000},
  }};
  for (const unit_factor& u : units) {
    if (!equal_nocase(unit, u.name)) {
      continue;
    }
    if (number.find('.') == std::string_view::npos) {
      const auto n = to_int(number);
      if (!n || *n > std::numeric_limits<std::int64_t>::max() / u.factor) {
        return std::nullopt;
      }
      return *n * u.factor;
    }
    // "1.5GiB": allowed when it comes to a whole number of bytes.
    const auto d = to_double(number);
    if (!d) {
      return std::nullopt;
    }
    const double bytes = *d * static_cast<double>(u.factor);
    if (bytes != std::floor(bytes) || bytes >= 9.2e18) {
      return std::nullopt;
    }
    return static_cast<std::int64_t>(bytes);
  }
  return std::nullopt;
}

std::optional<double> parse_duration(std::string_view text) noexcept {
  const auto [number, unit] = split_number(trim(text));
  const auto d = to_double(number);
  if (!d) {
    return std::nullopt;
  }
  struct unit_factor {
    std::string_view name;
    double factor;
  };
  static constexpr std::array<unit_factor, 6> units{
      {{"", 1.0}, {"s", 1.0}, {"ms", 1e-3}, {"us", 1e-6}, {"m", 60.0}, {"h", 3600.0}}};
  for (const unit_factor& u : units) {
    if (unit == u.name) {
      return *d * u.factor;
    }
  }
  return std::nullopt;
}

std::optional<bool> parse_bool(std::string_view text) noexcept {
  for (const std::string_view t : {"true", "yes", "on", "1"}) {
    if (equal_nocase(text, t)) {
      return true;
    }
  }
  for (const std::string_view f : {"false", "no", "off", "0"}) {
    if (equal_nocase(text, f)) {
      return false;
    }
  }
  return std::nullopt;
}

std::string format_size(std::int64_t bytes) {
  static constexpr std::array<std::pair<std::string_view, int>, 5> units{
      {{"PiB", 50}, {"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}}};
  if (bytes > 0) {
    for (const auto& [name, shift] : units) {
      const std::int64_t factor = std::int64_t{1} << shift;
      if (bytes % factor == 0) {
        return std::to_string(bytes / factor) + std::string(name);
      }
    }
  }
  return std::to_string(bytes);
}

std::string format_duration(double seconds) {
  if (seconds != 0 && std::fmod(seconds, 3600.0) == 0) {
    return shortest(seconds / 3600.0) + "h";
  }
  if (seconds != 0 && std::fmod(seconds, 60.0) == 0) {
    return shortest(seconds / 60.0) + "m";
  }
  if (seconds != std::floor(seconds) && std::fabs(seconds) < 1.0) {
    const double ms = seconds * 1000.0;
    if (std::fabs(ms - std::round(ms)) < 1e-9) {
      return shortest(std::round(ms)) + "ms";
    }
  }
  return shortest(seconds) + "s";
}

std::string format_value(const setting& s, const value& v) {
  if (std::holds_alternative<std::monostate>(v)) {
    return "none";
  }
  switch (s.type) {
    case kind::size:
      return format_size(std::get<std::int64_t>(v));
    case kind::integer:
      return std::to_string(std::get<std::int64_t>(v));
    case kind::duration:
      return format_duration(std::get<double>(v));
    case kind::number:
      return shortest(std::get<double>(v));
    case kind::boolean:
      return std::get<bool>(v) ? "true" : "false";
    case kind::string:
    case kind::choice:
      return std::get<std::string>(v);
  }
  return "";
}

namespace {

/// `text` as a TOML basic string: TOML has \n and \t but no \x escape
/// (the headers setting holds lines).
std::string toml_quote(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      constexpr std::string_view hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[u >> 4U];
      out += hex[u & 0xfU];
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

}  // namespace

std::string format_toml(const setting& s, const value& v) {
  if (std::holds_alternative<std::monostate>(v)) {
    return "\"none\"";
  }
  switch (s.type) {
    case kind::integer:
    case kind::boolean:
    case kind::number:
      return format_value(s, v);
    case kind::size: {
      const std::string text = format_size(std::get<std::int64_t>(v));
      return text.back() == 'B' ? quote(text) : text;
    }
    default:
      return toml_quote(format_value(s, v));
  }
}

value default_value(const setting& s) {
  return parse_text(s, s.default_text, s.name);
}

std::string flag_name(const setting& s) {
  std::string out = "--";
  for (const char c : s.name) {
    out += c == '_' ? '-' : c;
  }
  return out;
}

std::string env_name(const setting& s, std::string_view prefix) {
  std::string out(prefix);
  for (const char c : s.name) {
    out += (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c;
  }
  return out;
}

std::string nearest(std::string_view wrong, std::span<const std::string> candidates) {
  std::string best;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  for (const std::string& c : candidates) {
    const std::size_t d = edit_distance(wrong, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  // Near enough to be a typo: a third of the name, at least two edits.
  const std::size_t allowed = std::max<std::size_t>(2, wrong.size() / 3);
  return best_distance <= allowed ? best : std::string();
}

// ---------------------------------------------------------------- one value

value parse_text(const setting& s, std::string_view text, std::string_view where) {
  if (s.nullable && equal_nocase(trim(text), "none")) {
    return std::monostate{};
  }
  switch (s.type) {
    case kind::integer: {
      const auto n = to_int(trim(text));
      if (!n) {
        invalid(s, where, quote(text));
      }
      return checked_int(s, *n, where, trim(text));
    }
    case kind::size: {
      const auto n = parse_size(text);
      if (!n) {
        invalid(s, where, quote(text));
      }
      return checked_int(s, *n, where, trim(text));
    }
    case kind::duration: {
      const auto d = parse_duration(text);
      if (!d) {
        invalid(s, where, quote(text));
      }
      return checked_real(s, *d, where, trim(text));
    }
    case kind::number: {
      const auto d = to_double(trim(text));
      if (!d) {
        invalid(s, where, quote(text));
      }
      return checked_real(s, *d, where, trim(text));
    }
    case kind::boolean: {
      const auto b = parse_bool(trim(text));
      if (!b) {
        invalid(s, where, quote(text));
      }
      return *b;
    }
    case kind::string:
      if (s.name == "uds_mode" && !octal_mode_text(trim(text))) {
        throw setting_error(
            error_kind::invalid,
            std::string(where) + ": expected an octal mode such as 0660, got " + quote(text));
      }
      return std::string(text);
    case kind::choice:
      return checked_choice(s, trim(text), where);
  }
  invalid(s, where, quote(text));
}

value accept(const setting& s, const typed_input& in, std::string_view where) {
  if (const auto* text = std::get_if<std::string>(&in)) {
    switch (s.type) {
      case kind::size:
      case kind::duration:
      case kind::string:
      case kind::choice:
        return parse_text(s, *text, where);
      default:
        if (s.nullable && equal_nocase(*text, "none")) {
          return std::monostate{};
        }
        invalid(s, where, quote(*text));
    }
  }
  if (std::holds_alternative<std::monostate>(in)) {
    if (s.nullable) {
      return std::monostate{};
    }
    invalid(s, where, "None");
  }
  if (const auto* b = std::get_if<bool>(&in)) {
    if (s.type == kind::boolean) {
      return *b;
    }
    invalid(s, where, *b ? "true" : "false");
  }
  if (const auto* n = std::get_if<std::int64_t>(&in)) {
    const std::string shown = std::to_string(*n);
    switch (s.type) {
      case kind::integer:
        return checked_int(s, *n, where, shown);
      case kind::size:
        // A negative number of bytes is not a size at all, not a small one.
        if (*n < 0) {
          invalid(s, where, shown);
        }
        return checked_int(s, *n, where, shown);
      case kind::duration:
      case kind::number:
        return checked_real(s, static_cast<double>(*n), where, shown);
      default:
        invalid(s, where, shown);
    }
  }
  if (const auto* d = std::get_if<double>(&in)) {
    const std::string shown = shortest(*d);
    if ((s.type == kind::duration || s.type == kind::number) && std::isfinite(*d)) {
      return checked_real(s, *d, where, shown);
    }
    invalid(s, where, shown);
  }
  invalid(s, where, std::get<foreign>(in).shown);
}

// ---------------------------------------------------------------- sources

std::vector<assignment> read_environment(
    std::span<const std::pair<std::string, std::string>> variables, std::string_view prefix) {
  std::vector<assignment> out;
  const auto ignored = environment_names_not_settings();
  for (const auto& [name, text] : variables) {
    if (!std::string_view(name).starts_with(prefix)) {
      continue;
    }
    const std::string_view rest = std::string_view(name).substr(prefix.size());
    if (std::find(ignored.begin(), ignored.end(), rest) != ignored.end()) {
      continue;
    }
    const setting* s = nullptr;
    for (const setting& candidate : settings()) {
      if (env_name(candidate, prefix) == name) {
        s = &candidate;
      }
    }
    if (s == nullptr) {
      // Compare without the prefix every candidate shares, so the distance
      // allowed is a fraction of the part the user typed differently.
      std::string lowered;
      for (const char c : rest) {
        lowered += lower(c);
      }
      const std::string near = nearest(lowered, names_as(plain_name));
      const setting* guess = near.empty() ? nullptr : find_setting(near);
      throw setting_error(error_kind::unknown_name,
                          "unknown setting " + quote(name) +
                              suggestion_suffix(guess ? env_name(*guess, prefix) : std::string()));
    }
    out.push_back({s, parse_text(*s, text, name), "env " + name});
  }
  return out;
}

namespace {

/// Whether `flag` is one of the space-separated `aliases`.
bool is_alias(std::string_view aliases, std::string_view flag) {
  while (!aliases.empty()) {
    const std::size_t end = std::min(aliases.find(' '), aliases.size());
    if (aliases.substr(0, end) == flag) {
      return true;
    }
    aliases.remove_prefix(std::min(end + 1, aliases.size()));
  }
  return false;
}

}  // namespace

assignment read_flag(std::string_view flag, std::string_view text) {
  for (const setting& s : settings()) {
    if (!s.off_flag.empty() && flag == s.off_flag) {
      return {&s, std::string(), "flag " + std::string(flag)};
    }
    if (is_alias(s.flag_aliases, flag)) {
      return {&s, parse_text(s, text, flag), "flag " + std::string(flag)};
    }
    const std::string name = flag_name(s);
    if (s.type == kind::boolean && flag == "--no-" + name.substr(2)) {
      return {&s, false, "flag " + std::string(flag)};
    }
    if (name != flag) {
      continue;
    }
    if (s.type == kind::boolean && text.empty()) {
      return {&s, true, "flag " + name};
    }
    return {&s, parse_text(s, text, flag), "flag " + name};
  }
  std::vector<std::string> flags = names_as(flag_name);
  for (std::string& f : flags) {
    f.erase(0, 2);
  }
  if (const std::string_view hint = foreign_flag_hint(flag); !hint.empty()) {
    throw setting_error(error_kind::unknown_name,
                        "unknown flag " + quote(flag) + " (" + std::string(hint) + ")");
  }
  const std::string_view bare = flag.starts_with("--") ? flag.substr(2) : flag;
  const std::string near = nearest(bare, flags);
  throw setting_error(
      error_kind::unknown_name,
      "unknown flag " + quote(flag) + suggestion_suffix(near.empty() ? near : "--" + near));
}

std::vector<resolved_setting> resolve(std::span<const std::vector<assignment>> layers) {
  std::vector<resolved_setting> out;
  for (const setting& s : settings()) {
    resolved_setting r{&s, default_value(s), "default"};
    for (const auto& layer : layers) {
      for (const assignment& a : layer) {
        if (a.target == &s) {
          r.v = a.v;
          r.origin = a.origin;
        }
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

/// Shared with toml.cpp: the unknown-key line for a file or a keyword.
std::string unknown_setting_line(std::string_view name) {
  return "unknown setting " + quote(name) + suggestion_suffix(nearest(name, names_as(plain_name)));
}

const setting& require_setting(std::string_view name) {
  const setting* s = find_setting(name);
  if (s == nullptr) {
    throw setting_error(error_kind::unknown_name, unknown_setting_line(name));
  }
  return *s;
}

}  // namespace cadeloop::config
