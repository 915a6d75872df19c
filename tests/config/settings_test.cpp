// The settings table: units, bounds, every error line, TOML types and lines,
// suggestions, and precedence.
#include <cadeloop/config/settings.hpp>

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace cfg = cadeloop::config;

const cfg::setting& row(std::string_view name) {
  const cfg::setting* s = cfg::find_setting(name);
  if (s == nullptr) {
    throw std::runtime_error("no setting " + std::string(name));
  }
  return *s;
}

/// The one line a call throws, or "" when it does not throw.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const cfg::setting_error& e) {
    return e.what();
  }
  return "";
}

template <class F>
cfg::error_kind kind_of(F&& f) {
  try {
    f();
  } catch (const cfg::setting_error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "did not throw";
  return cfg::error_kind::file;
}

using env = std::vector<std::pair<std::string, std::string>>;

// ---------------------------------------------------------------- the table

TEST(settings_table, every_default_reads_and_is_in_bounds) {
  for (const cfg::setting& s : cfg::settings()) {
    SCOPED_TRACE(std::string(s.name));
    const cfg::value v = cfg::default_value(s);
    EXPECT_EQ(cfg::format_value(s, v), s.default_text);
    EXPECT_FALSE(s.doc.empty());
    EXPECT_FALSE(s.section.empty());
    if (std::holds_alternative<std::monostate>(v)) {
      EXPECT_TRUE(s.nullable);
      EXPECT_FALSE(s.none_means.empty());
    }
  }
}

TEST(settings_table, names_are_unique_snake_case) {
  std::vector<std::string_view> seen;
  for (const cfg::setting& s : cfg::settings()) {
    for (const char c : s.name) {
      EXPECT_TRUE((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_') << s.name;
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), s.name), 0) << s.name;
    seen.push_back(s.name);
    EXPECT_EQ(cfg::find_setting(s.name), &s);
  }
  EXPECT_EQ(cfg::find_setting("max_bdy"), nullptr);
}

TEST(settings_table, the_documented_defaults) {
  EXPECT_EQ(std::get<std::int64_t>(cfg::default_value(row("max_body"))), std::int64_t{1} << 30);
  EXPECT_EQ(std::get<std::int64_t>(cfg::default_value(row("port"))), 8000);
  EXPECT_EQ(std::get<double>(cfg::default_value(row("keepalive_idle"))), 5.0);
  EXPECT_EQ(std::get<bool>(cfg::default_value(row("access_log"))), false);
  EXPECT_EQ(std::get<std::string>(cfg::default_value(row("log_level"))), "info");
  EXPECT_EQ(std::get<std::string>(cfg::default_value(row("stats_host"))), "127.0.0.1");
  EXPECT_TRUE(std::holds_alternative<std::monostate>(cfg::default_value(row("stats_port"))));
  EXPECT_TRUE(std::holds_alternative<std::monostate>(cfg::default_value(row("access_log_file"))));
  EXPECT_TRUE(row("max_body").nullable);
}

TEST(settings_table, names_in_each_source) {
  EXPECT_EQ(cfg::flag_name(row("max_body")), "--max-body");
  EXPECT_EQ(cfg::env_name(row("max_body")), "CADELOOP_MAX_BODY");
  EXPECT_EQ(cfg::env_name(row("keepalive_idle"), "APP_"), "APP_KEEPALIVE_IDLE");
}

// ---------------------------------------------------------------- units

TEST(units, sizes) {
  EXPECT_EQ(cfg::parse_size("16MiB"), 16 * 1024 * 1024);
  EXPECT_EQ(cfg::parse_size("64KiB"), 64 * 1024);
  EXPECT_EQ(cfg::parse_size("1GiB"), std::int64_t{1} << 30);
  EXPECT_EQ(cfg::parse_size("512"), 512);
  EXPECT_EQ(cfg::parse_size("512B"), 512);
  EXPECT_EQ(cfg::parse_size("10MB"), 10'000'000);
  EXPECT_EQ(cfg::parse_size("1kb"), 1000);
  EXPECT_EQ(cfg::parse_size("16 mib"), 16 * 1024 * 1024);
  EXPECT_EQ(cfg::parse_size("1.5KiB"), 1536);
  EXPECT_EQ(cfg::parse_size("0"), 0);
  EXPECT_EQ(cfg::parse_size("abc"), std::nullopt);
  EXPECT_EQ(cfg::parse_size("-1"), std::nullopt);
  EXPECT_EQ(cfg::parse_size("16XB"), std::nullopt);
  EXPECT_EQ(cfg::parse_size("1.3B"), std::nullopt);
  EXPECT_EQ(cfg::parse_size(""), std::nullopt);
  EXPECT_EQ(cfg::parse_size("MiB"), std::nullopt);
  EXPECT_EQ(cfg::parse_size("99999999999PiB"), std::nullopt);
  EXPECT_EQ(cfg::parse_size("1e3"), std::nullopt);
}

TEST(units, durations) {
  EXPECT_EQ(cfg::parse_duration("30s"), 30.0);
  EXPECT_EQ(cfg::parse_duration("500ms"), 0.5);
  EXPECT_EQ(cfg::parse_duration("2m"), 120.0);
  EXPECT_EQ(cfg::parse_duration("1h"), 3600.0);
  EXPECT_EQ(cfg::parse_duration("1.5"), 1.5);
  EXPECT_EQ(cfg::parse_duration("7"), 7.0);
  EXPECT_EQ(cfg::parse_duration("250us"), 250e-6);
  EXPECT_EQ(cfg::parse_duration("30 s"), 30.0);
  EXPECT_EQ(cfg::parse_duration("30x"), std::nullopt);
  EXPECT_EQ(cfg::parse_duration("-1s"), std::nullopt);
  EXPECT_EQ(cfg::parse_duration("s"), std::nullopt);
  EXPECT_EQ(cfg::parse_duration("nan"), std::nullopt);
}

TEST(units, bools) {
  EXPECT_EQ(cfg::parse_bool("true"), true);
  EXPECT_EQ(cfg::parse_bool("Yes"), true);
  EXPECT_EQ(cfg::parse_bool("1"), true);
  EXPECT_EQ(cfg::parse_bool("off"), false);
  EXPECT_EQ(cfg::parse_bool("FALSE"), false);
  EXPECT_EQ(cfg::parse_bool("maybe"), std::nullopt);
}

TEST(units, formatting_reads_back) {
  EXPECT_EQ(cfg::format_size(std::int64_t{1} << 30), "1GiB");
  EXPECT_EQ(cfg::format_size(64 * 1024), "64KiB");
  EXPECT_EQ(cfg::format_size(1000), "1000");
  EXPECT_EQ(cfg::format_size(0), "0");
  EXPECT_EQ(cfg::format_duration(5), "5s");
  EXPECT_EQ(cfg::format_duration(0.5), "500ms");
  EXPECT_EQ(cfg::format_duration(120), "2m");
  EXPECT_EQ(cfg::format_duration(86400), "24h");
  EXPECT_EQ(cfg::format_duration(1.25), "1.25s");
  EXPECT_EQ(cfg::format_duration(0.001), "1ms");
  for (const double d : {0.001, 0.5, 1.25, 5.0, 90.0, 120.0, 86400.0}) {
    EXPECT_EQ(cfg::parse_duration(cfg::format_duration(d)), d);
  }
}

TEST(units, none_only_where_allowed) {
  EXPECT_TRUE(
      std::holds_alternative<std::monostate>(cfg::parse_text(row("max_body"), "none", "x")));
  EXPECT_TRUE(
      std::holds_alternative<std::monostate>(cfg::parse_text(row("max_body"), "None", "x")));
  EXPECT_EQ(error_of([] { cfg::parse_text(row("max_url"), "none", "--max-url"); }),
            "--max-url: expected a size like \"16MiB\", got \"none\"");
}

// ---------------------------------------------------------------- error lines

TEST(error_lines, environment_bad_size) {
  EXPECT_EQ(error_of([] {
              cfg::read_environment(env{{"CADELOOP_MAX_BODY", "abc"}});
            }),
            "CADELOOP_MAX_BODY: expected a size like \"16MiB\", got \"abc\"");
}

TEST(error_lines, flag_bad_size) {
  EXPECT_EQ(error_of([] { cfg::read_flag("--max-body", "abc"); }),
            "--max-body: expected a size like \"16MiB\", got \"abc\"");
}

TEST(error_lines, file_negative_size) {
  EXPECT_EQ(error_of([] { cfg::load_toml("\n\nmax_body = -1\n", "cadeloop.toml"); }),
            "cadeloop.toml:3: max_body: expected a size like \"16MiB\", got -1");
}

TEST(error_lines, out_of_range_from_each_source) {
  EXPECT_EQ(error_of([] { cfg::load_toml("max_pipelined = 5000", "cadeloop.toml"); }),
            "cadeloop.toml:1: max_pipelined: must be between 1 and 1024, got 5000");
  EXPECT_EQ(error_of([] {
              cfg::read_environment(env{{"CADELOOP_MAX_PIPELINED", "5000"}});
            }),
            "CADELOOP_MAX_PIPELINED: max_pipelined: must be between 1 and 1024, got 5000");
  EXPECT_EQ(error_of([] { cfg::read_flag("--max-pipelined", "5000"); }),
            "--max-pipelined: max_pipelined: must be between 1 and 1024, got 5000");
  EXPECT_EQ(
      error_of([] { cfg::accept(row("max_pipelined"), std::int64_t{5000}, "max_pipelined"); }),
      "max_pipelined: must be between 1 and 1024, got 5000");
  EXPECT_EQ(kind_of([] { cfg::read_flag("--max-pipelined", "5000"); }),
            cfg::error_kind::out_of_range);
}

TEST(error_lines, bounds_are_shown_in_the_settings_unit) {
  EXPECT_EQ(error_of([] { cfg::read_flag("--max-url", "2MiB"); }),
            "--max-url: max_url: must be between 32 and 1MiB, got 2MiB");
  EXPECT_EQ(error_of([] { cfg::read_flag("--keepalive-idle", "2d"); }),
            "--keepalive-idle: expected a duration like \"30s\", got \"2d\"");
  EXPECT_EQ(error_of([] { cfg::read_flag("--keepalive-idle", "25h"); }),
            "--keepalive-idle: keepalive_idle: must be between 1ms and 24h, got 25h");
  EXPECT_EQ(error_of([] { cfg::read_flag("--keepalive-idle", "0"); }),
            "--keepalive-idle: keepalive_idle: must be between 1ms and 24h, got 0");
}

TEST(error_lines, each_kind_says_what_it_expected) {
  EXPECT_EQ(error_of([] { cfg::read_flag("--port", "http"); }),
            "--port: expected an integer, got \"http\"");
  EXPECT_EQ(error_of([] { cfg::read_flag("--lifespan", "maybe"); }),
            "--lifespan: expected one of \"auto\", \"on\" or \"off\", got \"maybe\"");
  EXPECT_EQ(error_of([] { cfg::read_flag("--access-log", "perhaps"); }),
            "--access-log: expected true or false, got \"perhaps\"");
  EXPECT_EQ(
      error_of([] { cfg::read_flag("--log-level", "loud"); }),
      "--log-level: expected one of \"debug\", \"info\", \"warning\" or \"error\", got \"loud\"");
  EXPECT_EQ(error_of([] {
              cfg::read_environment(env{{"CADELOOP_GRACE", "soon"}});
            }),
            "CADELOOP_GRACE: expected a duration like \"30s\", got \"soon\"");
  const cfg::setting ratio{.name = "ratio",
                           .type = cfg::kind::number,
                           .default_text = "0.5",
                           .min_real = 0,
                           .max_real = 1,
                           .section = "x",
                           .doc = "x"};
  EXPECT_EQ(error_of([&] { cfg::parse_text(ratio, "half", "--ratio"); }),
            "--ratio: expected a number, got \"half\"");
  EXPECT_EQ(error_of([&] { cfg::parse_text(ratio, "1.5", "--ratio"); }),
            "--ratio: ratio: must be between 0 and 1, got 1.5");
  EXPECT_EQ(std::get<double>(cfg::parse_text(ratio, "0.25", "--ratio")), 0.25);
}

TEST(error_lines, messages_quote_control_characters) {
  EXPECT_EQ(error_of([] { cfg::read_flag("--max-body", "1\n\"x\""); }),
            "--max-body: expected a size like \"16MiB\", got \"1\\x0a\\\"x\\\"\"");
}

// ---------------------------------------------------------------- unknown names

TEST(unknown_names, file_key_with_suggestion_and_line) {
  const std::string text = "port = 9000\n# a comment\nmax_bdy = \"16MiB\"\n";
  EXPECT_EQ(error_of([&] { cfg::load_toml(text, "cadeloop.toml"); }),
            "cadeloop.toml:3: unknown setting \"max_bdy\" (did you mean \"max_body\"?)");
  EXPECT_EQ(kind_of([&] { cfg::load_toml(text, "cadeloop.toml"); }), cfg::error_kind::unknown_name);
}

TEST(unknown_names, no_suggestion_when_nothing_is_near) {
  EXPECT_EQ(error_of([] { cfg::load_toml("colour = \"blue\"", "c.toml"); }),
            "c.toml:1: unknown setting \"colour\"");
}

TEST(unknown_names, environment) {
  EXPECT_EQ(error_of([] {
              cfg::read_environment(env{{"CADELOOP_MAX_BDY", "1"}});
            }),
            "unknown setting \"CADELOOP_MAX_BDY\" (did you mean \"CADELOOP_MAX_BODY\"?)");
  EXPECT_EQ(
      error_of([] {
        cfg::read_environment(env{{"CADELOOP_KEEPALIVE_IDEL", "1s"}});
      }),
      "unknown setting \"CADELOOP_KEEPALIVE_IDEL\" (did you mean \"CADELOOP_KEEPALIVE_IDLE\"?)");
  EXPECT_EQ(error_of([] {
              cfg::read_environment(env{{"CADELOOP_COLOUR", "1"}});
            }),
            "unknown setting \"CADELOOP_COLOUR\"");
}

TEST(unknown_names, environment_names_that_are_not_settings_and_other_prefixes) {
  const env vars{{"CADELOOP_CONFIG", "x.toml"},
                 {"CADELOOP_FUZZ_SECONDS", "3"},
                 {"PATH", "/bin"},
                 {"APP_PORT", "1"},
                 {"CADELOOP_PORT", "9000"}};
  const auto out = cfg::read_environment(vars);
  ASSERT_EQ(out.size(), 1U);
  EXPECT_EQ(out[0].target, &row("port"));
  EXPECT_EQ(out[0].origin, "env CADELOOP_PORT");
  const auto other = cfg::read_environment(vars, "APP_");
  ASSERT_EQ(other.size(), 1U);
  EXPECT_EQ(other[0].origin, "env APP_PORT");
}

TEST(unknown_names, keywords) {
  EXPECT_EQ(&cfg::require_setting("max_body"), &row("max_body"));
  EXPECT_EQ(error_of([] { cfg::require_setting("max_bdy"); }),
            "unknown setting \"max_bdy\" (did you mean \"max_body\"?)");
}

TEST(unknown_names, flags) {
  EXPECT_EQ(error_of([] { cfg::read_flag("--max-bdy", "1"); }),
            "unknown flag \"--max-bdy\" (did you mean \"--max-body\"?)");
  EXPECT_EQ(error_of([] { cfg::read_flag("--colour", "1"); }), "unknown flag \"--colour\"");
}

TEST(unknown_names, nearest_is_by_edit_distance) {
  const std::array<std::string, 3> names{"keepalive_idle", "grace", "max_body"};
  EXPECT_EQ(cfg::nearest("keepalive_idel", names), "keepalive_idle");
  EXPECT_EQ(cfg::nearest("grase", names), "grace");
  EXPECT_EQ(cfg::nearest("GRACE", names), "grace");
  EXPECT_EQ(cfg::nearest("completely_else", names), "");
}

// ---------------------------------------------------------------- TOML

TEST(toml_file, typed_values_units_and_lines) {
  const std::string text =
      "# cadeloop settings\n"
      "app = \"main:app\"\n"
      "port = 9000\n"
      "max_body = \"16MiB\"\n"
      "max_url = 4096\n"
      "keepalive_idle = \"500ms\"\n"
      "grace = 2.5\n"
      "request_line_timeout = 3\n"
      "access_log = true\n"
      "stats_port = \"none\"\n"
      "lifespan = \"off\"\n";
  const auto out = cfg::load_toml(text, "conf/cadeloop.toml");
  ASSERT_EQ(out.size(), 10U);
  EXPECT_EQ(out[0].target, &row("app"));
  EXPECT_EQ(std::get<std::string>(out[0].v), "main:app");
  EXPECT_EQ(out[0].origin, "conf/cadeloop.toml:2");
  EXPECT_EQ(std::get<std::int64_t>(out[1].v), 9000);
  EXPECT_EQ(std::get<std::int64_t>(out[2].v), 16 * 1024 * 1024);
  EXPECT_EQ(out[2].origin, "conf/cadeloop.toml:4");
  EXPECT_EQ(std::get<std::int64_t>(out[3].v), 4096);
  EXPECT_EQ(std::get<double>(out[4].v), 0.5);
  EXPECT_EQ(std::get<double>(out[5].v), 2.5);
  EXPECT_EQ(std::get<double>(out[6].v), 3.0);
  EXPECT_EQ(std::get<bool>(out[7].v), true);
  EXPECT_TRUE(std::holds_alternative<std::monostate>(out[8].v));
  EXPECT_EQ(std::get<std::string>(out[9].v), "off");
  EXPECT_EQ(out[9].origin, "conf/cadeloop.toml:11");
}

TEST(toml_file, values_must_have_the_settings_type) {
  EXPECT_EQ(error_of([] { cfg::load_toml("port = \"8000\"", "c.toml"); }),
            "c.toml:1: port: expected an integer, got \"8000\"");
  EXPECT_EQ(error_of([] { cfg::load_toml("port = 80.5", "c.toml"); }),
            "c.toml:1: port: expected an integer, got 80.5");
  EXPECT_EQ(error_of([] { cfg::load_toml("access_log = \"yes\"", "c.toml"); }),
            "c.toml:1: access_log: expected true or false, got \"yes\"");
  EXPECT_EQ(error_of([] { cfg::load_toml("factory = 1", "c.toml"); }),
            "c.toml:1: factory: expected true or false, got 1");
  EXPECT_EQ(error_of([] { cfg::load_toml("host = 127", "c.toml"); }),
            "c.toml:1: host: expected a string, got 127");
  EXPECT_EQ(error_of([] { cfg::load_toml("max_body = [1]", "c.toml"); }),
            "c.toml:1: max_body: expected a size like \"16MiB\", got an array");
  EXPECT_EQ(error_of([] { cfg::load_toml("[max_body]\nx = 1", "c.toml"); }),
            "c.toml:1: max_body: expected a size like \"16MiB\", got a table");
  EXPECT_EQ(error_of([] { cfg::load_toml("max_body = \"16 potatoes\"", "c.toml"); }),
            "c.toml:1: max_body: expected a size like \"16MiB\", got \"16 potatoes\"");
  EXPECT_EQ(error_of([] { cfg::load_toml("grace = -1", "c.toml"); }),
            "c.toml:1: grace: must be between 0s and 24h, got -1");
  EXPECT_EQ(error_of([] { cfg::load_toml("grace = nan", "c.toml"); }),
            "c.toml:1: grace: expected a duration like \"30s\", got nan");
}

TEST(toml_file, the_first_mistake_in_the_file_is_reported) {
  // toml++ sorts keys; the report follows the file's order.
  EXPECT_EQ(error_of([] { cfg::load_toml("zzz = 1\naaa = 2\n", "c.toml"); }),
            "c.toml:1: unknown setting \"zzz\"");
}

TEST(toml_file, syntax_errors_name_the_line) {
  const std::string line = error_of([] { cfg::load_toml("port = 1\nmax_body = \n", "c.toml"); });
  EXPECT_EQ(line.rfind("c.toml:2: ", 0), 0U) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_EQ(kind_of([] { cfg::load_toml("port = 1\nport = 2\n", "c.toml"); }),
            cfg::error_kind::file);
}

TEST(toml_file, from_disk) {
  const auto path = std::filesystem::temp_directory_path() / "cadeloop-settings-test.toml";
  {
    std::ofstream out(path);
    out << "max_pipelined = 4\n";
  }
  const auto got = cfg::load_toml_file(path.string());
  std::filesystem::remove(path);
  ASSERT_EQ(got.size(), 1U);
  EXPECT_EQ(std::get<std::int64_t>(got[0].v), 4);
  EXPECT_EQ(got[0].origin, path.string() + ":1");
  EXPECT_EQ(error_of([] { cfg::load_toml_file("/nonexistent/cadeloop.toml"); }),
            "/nonexistent/cadeloop.toml: cannot read the settings file: No such file or directory");
}

// ---------------------------------------------------------------- typed input (serve())

TEST(typed_input, python_like_values) {
  EXPECT_EQ(std::get<std::int64_t>(cfg::accept(row("max_body"), std::string("16MiB"), "max_body")),
            16 * 1024 * 1024);
  EXPECT_EQ(std::get<double>(cfg::accept(row("grace"), std::int64_t{2}, "grace")), 2.0);
  EXPECT_TRUE(std::holds_alternative<std::monostate>(
      cfg::accept(row("max_body"), std::monostate{}, "max_body")));
  EXPECT_EQ(error_of([] { cfg::accept(row("port"), std::monostate{}, "port"); }),
            "port: expected an integer, got None");
  EXPECT_EQ(error_of([] { cfg::accept(row("port"), true, "port"); }),
            "port: expected an integer, got true");
  EXPECT_EQ(error_of([] { cfg::accept(row("max_body"), cfg::foreign{"[1]"}, "max_body"); }),
            "max_body: expected a size like \"16MiB\", got [1]");
}

// ---------------------------------------------------------------- flags and precedence

TEST(flags, booleans_and_negations) {
  EXPECT_EQ(std::get<bool>(cfg::read_flag("--access-log", "").v), true);
  const auto no = cfg::read_flag("--no-access-log", "");
  EXPECT_EQ(std::get<bool>(no.v), false);
  EXPECT_EQ(no.origin, "flag --no-access-log");
  EXPECT_EQ(cfg::read_flag("--max-body", "none").origin, "flag --max-body");
}

TEST(precedence, later_layers_win_and_origins_follow) {
  std::vector<std::vector<cfg::assignment>> layers;
  layers.push_back(
      cfg::load_toml("keepalive_idle = \"1s\"\nmax_body = 100\ngrace = 1\n", "f.toml"));
  layers.push_back(
      cfg::read_environment(env{{"CADELOOP_KEEPALIVE_IDLE", "2s"}, {"CADELOOP_GRACE", "2"}}));
  layers.push_back({cfg::read_flag("--keepalive-idle", "3s")});
  const auto out = cfg::resolve(layers);
  ASSERT_EQ(out.size(), cfg::settings().size());
  for (const auto& r : out) {
    if (r.def->name == "keepalive_idle") {
      EXPECT_EQ(std::get<double>(r.v), 3.0);
      EXPECT_EQ(r.origin, "flag --keepalive-idle");
    } else if (r.def->name == "grace") {
      EXPECT_EQ(std::get<double>(r.v), 2.0);
      EXPECT_EQ(r.origin, "env CADELOOP_GRACE");
    } else if (r.def->name == "max_body") {
      EXPECT_EQ(std::get<std::int64_t>(r.v), 100);
      EXPECT_EQ(r.origin, "f.toml:2");
    } else if (r.def->name == "port") {
      EXPECT_EQ(std::get<std::int64_t>(r.v), 8000);
      EXPECT_EQ(r.origin, "default");
    }
  }
}

TEST(print_config, toml_values_read_back) {
  for (const cfg::setting& s : cfg::settings()) {
    SCOPED_TRACE(std::string(s.name));
    const cfg::value v = cfg::default_value(s);
    const std::string doc = std::string(s.name) + " = " + cfg::format_toml(s, v) + "\n";
    const auto back = cfg::load_toml(doc, "x.toml");
    ASSERT_EQ(back.size(), 1U);
    EXPECT_EQ(back[0].v, v);
  }
}

}  // namespace

// ---------------------------------------------------------------- ids and resolved values

namespace {

TEST(setting_ids, one_per_row_in_table_order) {
  ASSERT_EQ(cfg::settings().size(), cfg::setting_count);
  for (const cfg::setting& s : cfg::settings()) {
    EXPECT_EQ(&cfg::row(cfg::id_of(s)), &s) << s.name;
  }
  EXPECT_EQ(cfg::row(cfg::setting_id::max_body).name, "max_body");
  EXPECT_EQ(cfg::row(cfg::setting_id::linger_timeout).name, "linger_timeout");
}

TEST(resolved_values, defaults_then_layers) {
  const cfg::resolved_values defaults;
  for (const cfg::setting& s : cfg::settings()) {
    EXPECT_EQ(defaults[cfg::id_of(s)], cfg::default_value(s)) << s.name;
  }
  const std::vector<std::vector<cfg::assignment>> layers{
      cfg::load_toml("max_body = \"none\"\nkeepalive_idle = \"250ms\"\n", "f.toml"),
      {cfg::read_flag("--access-log", ""), cfg::read_flag("--server-header", "x")}};
  const cfg::resolved_values v{cfg::resolve(layers)};
  using id = cfg::setting_id;
  EXPECT_TRUE(v.is_none(id::max_body));
  EXPECT_DOUBLE_EQ(v.real(id::keepalive_idle), 0.25);
  EXPECT_TRUE(v.flag(id::access_log));
  EXPECT_EQ(v.text(id::server_header), "x");
  EXPECT_EQ(v.whole(id::max_url), 8 * 1024);
  EXPECT_FALSE(v.is_none(id::max_url));
}

TEST(resolved_values, reading_a_setting_as_another_kind_is_fatal) {
  const cfg::resolved_values v;
  EXPECT_DEATH((void)v.whole(cfg::setting_id::keepalive_idle),
               "setting keepalive_idle read as a whole number");
  EXPECT_EQ(v.whole(cfg::setting_id::max_body), std::int64_t{1} << 30);
  cfg::resolved_values w;
  w.set(cfg::setting_id::max_body, std::monostate{});
  EXPECT_DEATH((void)w.whole(cfg::setting_id::max_body), "max_body read as a whole number");
  EXPECT_DEATH(w.set(cfg::setting_id::port, std::string{"80"}),
               "port read as a value of another kind");
}

}  // namespace
