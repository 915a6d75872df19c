#pragma once

// The one table of settings and every way a value reaches it.
//
// Each setting is declared once, as a row of table.def: name, kind, default,
// bounds, unit, one line of doc. From that table come the TOML keys, the
// `CADELOOP_*` environment variables, the command-line flags, the `serve()` /
// `Config` keyword arguments, validation, and docs/configuration.md.
// Precedence, lowest first: default < TOML file < environment < command line
// < `serve()` arguments. A bad value from any source is one line naming where
// it came from (file and line, variable, or flag), thrown as `setting_error`.
//
// The resolved values reach C++ code as `resolved_values`, addressed by
// `setting_id` (an enum made from table.def's rows), never by a name.
//
// Everything here is plain data and pure functions: any thread may call them;
// nothing is shared or cached.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace cadeloop::config {

/// What a setting's value is, and so how it is written and checked.
enum class kind : std::uint8_t {
  integer,   ///< a whole number ("16")
  size,      ///< bytes: "16MiB", "64KiB", "10MB", or a bare number of bytes
  duration,  ///< seconds: "30s", "500ms", "2m", "1h", or a bare number of seconds
  number,    ///< a real number ("1.5")
  boolean,   ///< true or false
  string,    ///< any text
  choice,    ///< one of a fixed list of words
};

/// A setting's value once read: `std::monostate` is "none" (only for settings
/// that are `nullable`); sizes and integers are `int64_t` (sizes in bytes);
/// durations and numbers are `double` (durations in seconds).
using value = std::variant<std::monostate, bool, std::int64_t, double, std::string>;

/// One row of the table. Rows are constant data with static storage duration.
struct setting {
  std::string_view name{};  ///< snake_case: the TOML key and the keyword argument
  kind type = kind::string;
  /// The default as it would be written in a file or on the command line
  /// ("1GiB", "5s", "none"); `default_value()` reads it.
  std::string_view default_text{};
  /// Bounds (inclusive) for `integer` and `size`.
  std::int64_t min_int = 0;
  std::int64_t max_int = 0;
  /// Bounds (inclusive) for `duration` (seconds) and `number`.
  double min_real = 0;
  double max_real = 0;
  /// Whether "none" is accepted (a limit that may be removed, an optional path).
  bool nullable = false;
  /// What "none" means for this setting ("no limit", "stderr", "off").
  std::string_view none_means{};
  /// The accepted words of a `choice`.
  std::span<const std::string_view> choices{};
  /// The unit of the value as stored ("bytes", "seconds", "microseconds"), or "".
  std::string_view unit{};
  /// Which part of the reference the setting belongs to ("Listening", "Limits", ...).
  std::string_view section{};
  /// One line of doc for the reference and `--help`.
  std::string_view doc{};
  /// Other spellings of the flag, space-separated, taking the same argument:
  /// the names uvicorn users type ("--workers" for cores). Flags only: the
  /// TOML key and the variable keep the setting's name.
  std::string_view flag_aliases{};
  /// A flag that takes no argument and sets a string setting to ""
  /// ("--no-server-header"), or "".
  std::string_view off_flag{};
};

/// One setting, by the name its row in table.def gives it: `setting_id::max_body`.
/// The value is the row's index in `settings()`.
enum class setting_id : std::uint16_t {
#define CADELOOP_SETTING(id, ...) id,
#include "cadeloop/config/table.def"
#undef CADELOOP_SETTING
};

/// How many settings the table has.
inline constexpr std::size_t setting_count = 0
#define CADELOOP_SETTING(id, ...) +1
#include "cadeloop/config/table.def"
#undef CADELOOP_SETTING
    ;

/// Every setting, in the order the reference lists them.
std::span<const setting> settings() noexcept;

/// The row of `id`.
const setting& row(setting_id id) noexcept;

/// The id of a row of `settings()`.
setting_id id_of(const setting& s) noexcept;

/// The row named `name` (snake_case), or nullptr.
const setting* find_setting(std::string_view name) noexcept;

/// The row named `name`, or setting_error (unknown_name) with the line
/// `unknown setting "max_bdy" (did you mean "max_body"?)`.
const setting& require_setting(std::string_view name);

/// Environment variables that start with the prefix but are not settings
/// (the part after the prefix): "CONFIG" names the TOML file; "FUZZ_SECONDS"
/// and "FUZZ_JOBS" are knobs of scripts/test and scripts/fuzz.
std::span<const std::string_view> environment_names_not_settings() noexcept;

/// Why a value was refused.
enum class error_kind : std::uint8_t {
  unknown_name,  ///< no such setting (key, variable, flag or keyword)
  invalid,       ///< not a value of the setting's kind ("expected a size like ...")
  out_of_range,  ///< the right kind, outside the bounds
  file,          ///< the TOML file cannot be read or is not TOML
};

/// A refused setting: `what()` is the one line for the user, naming the source
/// ("cadeloop.toml:12: max_body: expected ...", "CADELOOP_MAX_BODY: ...",
/// "--max-body: ...").
class setting_error : public std::runtime_error {
 public:
  setting_error(error_kind k, const std::string& line) : std::runtime_error(line), kind_(k) {}
  error_kind kind() const noexcept { return kind_; }

 private:
  error_kind kind_;
};

// ---------------------------------------------------------------- units

/// "16MiB", "64KiB", "1GiB", "10MB", "512", "512B", "1.5GiB" -> bytes. Units
/// are case-insensitive; KiB/MiB/GiB/TiB/PiB are powers of 1024, kB/MB/GB/TB/PB
/// powers of 1000. Nothing for text that is not a whole, non-negative number
/// of bytes that fits in int64.
std::optional<std::int64_t> parse_size(std::string_view text) noexcept;

/// "30s", "500ms", "2m", "1h", "250us", "1.5" (bare: seconds) -> seconds.
/// Nothing for text that is not a finite number with one of those units.
std::optional<double> parse_duration(std::string_view text) noexcept;

/// true/false, yes/no, on/off, 1/0 (case-insensitive).
std::optional<bool> parse_bool(std::string_view text) noexcept;

/// Bytes as the largest exact binary unit ("1GiB", "64KiB"), else bare ("1000").
std::string format_size(std::int64_t bytes);

/// Seconds as the largest exact unit ("5s", "2m", "24h", "500ms"), else "1.25s".
std::string format_duration(double seconds);

/// `v` written the way this setting is written in a file or on the command
/// line; `parse_text` reads it back to the same value.
std::string format_value(const setting& s, const value& v);

/// `v` as a TOML value (`"1GiB"`, `16`, `true`, `"none"`) for `--print-config`.
std::string format_toml(const setting& s, const value& v);

/// The setting's default, read from its `default_text`.
value default_value(const setting& s);

/// "--max-body" for max_body.
std::string flag_name(const setting& s);

/// "CADELOOP_MAX_BODY" for max_body with the prefix "CADELOOP_".
std::string env_name(const setting& s, std::string_view prefix = "CADELOOP_");

/// The candidate nearest to `wrong` by edit distance when it is near enough to
/// be a typo, else "".
std::string nearest(std::string_view wrong, std::span<const std::string> candidates);

// ---------------------------------------------------------------- reading one value

/// A value as it arrived with a type of its own (a TOML value, a Python
/// keyword argument). `std::monostate` is Python's None; `foreign` is anything
/// else (a table, a list), carried as the text to show in the error.
struct foreign {
  std::string shown;
};
using typed_input = std::variant<std::monostate, bool, std::int64_t, double, std::string, foreign>;

/// Reads `text` (an environment variable, a flag's argument) as a value of
/// `s`. `where` starts the error line: "CADELOOP_MAX_BODY", "--max-body".
value parse_text(const setting& s, std::string_view text, std::string_view where);

/// Checks a typed input against `s`: strings are read like `parse_text` only
/// for sizes, durations, words and "none"; numbers and bools must be of the
/// setting's kind. `where` starts the error line: "cadeloop.toml:12: max_body",
/// "max_body".
value accept(const setting& s, const typed_input& in, std::string_view where);

// ---------------------------------------------------------------- sources

/// One value from one source.
struct assignment {
  const setting* target;
  value v;
  /// Where it came from, as `--print-config` shows it: "cadeloop.toml:12",
  /// "env CADELOOP_MAX_BODY", "flag --max-body", "serve()".
  std::string origin;
};

/// Reads a TOML document. `path` names it in messages and origins. Keys are
/// setting names at the top level; `app = "main:app"` is allowed.
std::vector<assignment> load_toml(std::string_view text, std::string_view path);

/// Reads the TOML file at `path`.
std::vector<assignment> load_toml_file(const std::string& path);

/// Reads every variable that starts with `prefix`; a name that is neither a
/// setting nor in `environment_names_not_settings()` is an error.
std::vector<assignment> read_environment(
    std::span<const std::pair<std::string, std::string>> variables,
    std::string_view prefix = "CADELOOP_");

/// Reads one command-line flag ("--max-body") and its argument. A boolean
/// flag given without text ("--access-log") is true; "--no-access-log" is
/// false whatever the text.
assignment read_flag(std::string_view flag, std::string_view text);

/// For a flag of another ASGI server (uvicorn, granian, hypercorn) that is
/// not cadeloop's: which server has it and cadeloop's equivalent or why
/// there is none ("uvicorn's; cadeloop's is --cores"), else "".
std::string_view foreign_flag_hint(std::string_view flag) noexcept;

/// A setting's final value and where it came from ("default" when no source set it).
struct resolved_setting {
  const setting* def;
  value v;
  std::string origin;
};

/// Every setting, in table order: each takes the value of the last layer that
/// sets it (layers lowest first), else its default.
std::vector<resolved_setting> resolve(std::span<const std::vector<assignment>> layers);

// ---------------------------------------------------------------- the values, typed

/// One value per setting, addressed by `setting_id`: what C++ code reads the
/// resolved settings from (runtime/pair_settings.hpp fills a core pair's
/// options from it). Plain data; whoever holds it may read it on any thread.
///
/// The typed reads say what the caller expects; asking a setting for a kind
/// its row does not have (a duration as a whole number, none of a setting
/// that is not nullable) is a broken invariant: fatal, with a message naming
/// the setting.
class resolved_values {
 public:
  /// Every setting at its default.
  resolved_values();
  /// The values `resolve()` gives (one per setting, in table order).
  explicit resolved_values(std::span<const resolved_setting> resolved);

  /// Sets `id` to `v`, a value of its row (as `accept` or `parse_text` give it).
  void set(setting_id id, value v);

  /// The value of `id`, of the type its row's kind says (see `value`).
  [[nodiscard]] const value& operator[](setting_id id) const noexcept {
    return values_[static_cast<std::size_t>(id)];
  }
  /// Whether `id` is none (only nullable settings can be).
  [[nodiscard]] bool is_none(setting_id id) const noexcept;
  /// An integer or a size (bytes), not none.
  [[nodiscard]] std::int64_t whole(setting_id id) const;
  /// A duration (seconds) or a number, not none.
  [[nodiscard]] double real(setting_id id) const;
  /// A boolean.
  [[nodiscard]] bool flag(setting_id id) const;
  /// A string or a choice, not none.
  [[nodiscard]] const std::string& text(setting_id id) const;

 private:
  std::array<value, setting_count> values_;
};

}  // namespace cadeloop::config
