// The table's storage: the rows of table.def as one constant array, and the
// lookups by name and by id. The rows themselves are declared in
// include/cadeloop/config/table.def.
#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>

#include "cadeloop/config/settings.hpp"

namespace cadeloop::config {

namespace {

constexpr std::int64_t kib = 1024;
constexpr std::int64_t mib = 1024 * kib;
constexpr std::int64_t gib = 1024 * mib;
constexpr std::int64_t pib = 1024 * 1024 * gib;

constexpr std::array<std::string_view, 3> lifespan_choices{"auto", "on", "off"};
constexpr std::array<std::string_view, 3> isolation_choices{"auto", "subinterpreters", "processes"};
// auto and on serve WebSockets; off does not. `off` comes first after the
// default (it is the other value tests pick); the rest are uvicorn's names.
constexpr std::array<std::string_view, 7> ws_choices{"auto", "off", "on", "none", "websockets",
                                                     "wsproto", "websockets-sansio"};
constexpr std::array<std::string_view, 4> log_levels{"debug", "info", "warning", "error"};

// Sections, in the order the reference shows them.
constexpr std::string_view app_section = "Application";
constexpr std::string_view listen_section = "Listening";
constexpr std::string_view cores_section = "Cores";
constexpr std::string_view limit_section = "Limits";
constexpr std::string_view timeout_section = "Timeouts";
constexpr std::string_view flow_section = "Flow control";
constexpr std::string_view ws_section = "WebSockets";
constexpr std::string_view log_section = "Logging";
constexpr std::string_view stats_section = "Statistics";
constexpr std::string_view tuning_section = "Tuning";
constexpr std::string_view tls_section = "TLS";
constexpr std::array<std::string_view, 2> tls_versions{"1.2", "1.3"};

// Bounds a designated initializer cannot name shorter.
constexpr double day = 86400.0;

constexpr setting table[] = {
#define CADELOOP_SETTING(id, ...) {.name = #id, __VA_ARGS__},
#include "cadeloop/config/table.def"
#undef CADELOOP_SETTING
};
static_assert(std::size(table) == setting_count, "table.def made the rows and the ids differently");

constexpr std::array<std::string_view, 3> not_settings{"CONFIG", "FUZZ_SECONDS", "FUZZ_JOBS"};

}  // namespace

std::span<const setting> settings() noexcept {
  return table;
}

std::span<const std::string_view> environment_names_not_settings() noexcept {
  return not_settings;
}

const setting& row(setting_id id) noexcept {
  return table[static_cast<std::size_t>(id)];
}

setting_id id_of(const setting& s) noexcept {
  return static_cast<setting_id>(&s - table);
}

const setting* find_setting(std::string_view name) noexcept {
  for (const setting& s : table) {
    if (s.name == name) {
      return &s;
    }
  }
  return nullptr;
}

}  // namespace cadeloop::config
