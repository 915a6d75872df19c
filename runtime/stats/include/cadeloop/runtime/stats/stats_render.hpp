#pragma once

// The stats endpoint's documents, from pair snapshots: /stats (JSON),
// /metrics (Prometheus text) and the /readyz verdict. Pure functions
// (stats_render.cpp); the endpoint (stats_endpoint.hpp) serves them.

#include <cadeloop/runtime/stats/stats_page.hpp>

#include <cstdint>
#include <span>
#include <string>

namespace cadeloop::runtime {

/// What the stats endpoint says about the process besides the counters.
/// Plain data, fixed for the process's life; built by the main thread.
struct stats_process_info {
  /// "subinterpreters" or "processes" (the resolved `isolation` setting).
  std::string isolation;
  /// The interpreter's version, "3.13.1".
  std::string python_version;
  /// cadeloop's version, "0.1.0".
  std::string cadeloop_version;
  /// When the server started, Unix time in milliseconds (uptime counts from here).
  std::int64_t started_unix_ms = 0;
};

/// The /stats document for `pairs`. `uptime_s` is measured by the caller
/// (steady clock); `now_unix_ms` is the wall clock. Any thread; pure.
[[nodiscard]] std::string render_stats_json(std::span<const pair_stats_snapshot> pairs,
                                            const stats_process_info& info,
                                            std::int64_t now_unix_ms, double uptime_s,
                                            bool draining);

/// The /metrics document for `pairs` (Prometheus text format 0.0.4). Any
/// thread; pure.
[[nodiscard]] std::string render_prometheus(std::span<const pair_stats_snapshot> pairs,
                                            const stats_process_info& info, double uptime_s,
                                            bool draining);

/// Whether /readyz answers 200: not draining, at least one pair, every pair
/// serving or stuck (a stuck pair takes no new connections: the watchdog
/// paused its listener), and at least one serving. When not ready, `why`
/// says what is missing ("draining", "pair 1 is starting", "every pair is
/// stuck"). Any thread; pure.
[[nodiscard]] bool stats_ready(std::span<const pair_stats_snapshot> pairs, bool draining,
                               std::string& why);

}  // namespace cadeloop::runtime
