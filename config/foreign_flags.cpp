// Flags of other ASGI servers (uvicorn, granian, hypercorn) that cadeloop does
// not spell the same way: which server has the flag and cadeloop's
// equivalent, or why there is none. read_flag adds the hint to its "unknown
// flag" line, so someone moving a command line over learns the new name
// instead of a near-miss by spelling. Flags cadeloop shares with uvicorn
// (--host, --port, --uds, --fd, --root-path, --proxy-headers, ...) and the
// aliases in table.def are not listed: they are cadeloop's own.
#include <array>
#include <string_view>
#include <utility>

#include "cadeloop/config/settings.hpp"

namespace cadeloop::config {

namespace {

using hint = std::pair<std::string_view, std::string_view>;

constexpr std::string_view no_reload = "not supported: --reload polls every 0.25 s";
constexpr std::string_view own_loop = "not needed: cadeloop always runs its own event loop";
constexpr std::string_view own_http = "not needed: cadeloop has one HTTP/1.1 implementation";

constexpr std::array foreign_flags{
    // uvicorn
    hint{"--reload-delay", no_reload},
    hint{"--loop", own_loop},
    hint{"--http", own_http},
    hint{"--interface", "not needed: cadeloop serves ASGI 3 apps only"},
    hint{"--use-colors", "not supported: the server log is plain text"},
    hint{"--no-use-colors", "not needed: the server log is plain text"},
    hint{"--timeout-worker-healthcheck", "uvicorn's; not supported"},
    hint{"--h11-max-incomplete-event-size", "uvicorn's; cadeloop's is --max-header-bytes"},
    hint{"--ssl-version", "uvicorn's; cadeloop's is --ssl-min-version (1.2 or 1.3)"},
    // granian
    hint{"--threads", "granian's; cadeloop's is --cores (one I/O thread and one app thread each)"},
    hint{"--blocking-threads", "granian's; not needed: each core pair has one app thread"},
    hint{"--runtime-threads", "granian's; cadeloop's is --cores"},
    hint{"--backpressure", "granian's; cadeloop's is --max-requests-in-flight"},
    hint{"--http1-keep-alive",
         "granian's; cadeloop keeps connections alive (see --keepalive-idle)"},
    hint{"--url-path-prefix", "granian's; cadeloop's is --root-path"},
    hint{"--respawn-failed-workers", "granian's; not supported"},
    hint{"--workers-lifetime", "granian's; not supported"},
    hint{"--ssl-certificate", "granian's; cadeloop's is --ssl-certfile"},
    hint{"--ssl-key", "granian's; cadeloop's is --ssl-keyfile"},
    // hypercorn
    hint{"--bind", "hypercorn's; cadeloop's are --host and --port (or --uds, --fd)"},
    hint{"-b", "hypercorn's --bind; cadeloop's are --host and --port (or --uds, --fd)"},
    hint{"-w", "the workers of uvicorn/hypercorn; cadeloop's is --cores (or --workers)"},
    hint{"--keep-alive", "hypercorn's; cadeloop's is --keepalive-idle"},
    hint{"--graceful-timeout", "hypercorn's; cadeloop's is --grace"},
    hint{"--access-logfile", "hypercorn's; cadeloop's is --access-log-file (with --access-log)"},
    hint{"--access-logformat", "hypercorn's; cadeloop's is --access-log-format"},
    hint{"--error-logfile", "hypercorn's; not supported: the server log goes to stderr"},
    hint{"--worker-class", own_loop},
    hint{"-k", own_loop},
    hint{"--certfile", "hypercorn's; cadeloop's is --ssl-certfile"},
    hint{"--keyfile", "hypercorn's; cadeloop's is --ssl-keyfile"},
    hint{"--max-requests", "hypercorn's; cadeloop's is --limit-max-requests"},
    hint{"--read-timeout", "hypercorn's; cadeloop's is --request-line-timeout"},
};

}  // namespace

std::string_view foreign_flag_hint(std::string_view flag) noexcept {
  for (const auto& [name, text] : foreign_flags) {
    if (name == flag) {
      return text;
    }
  }
  return {};
}

}  // namespace cadeloop::config
