// cadeloop._core.log, set_log_level, log_level: the native server log
// (runtime/server_log.hpp) for Python. The `cadeloop` logger's handler
// (cadeloop._log.ServerLogHandler) hands every formatted record here, so
// messages from Python and from C++ share one writer, one level and one
// order on stderr. No Python object is kept: the log is process-wide, shared
// by every interpreter that imports the module.
#include <cadeloop/runtime/server_log.hpp>

#include <string>
#include <string_view>

#include "register.hpp"

namespace cadeloop::pyhost {

namespace py = pybind11;
namespace server_log = runtime::server_log;

namespace {

/// Python's logging level numbers (DEBUG 10, INFO 20, WARNING 30, ERROR 40,
/// CRITICAL 50); a custom level in between counts as the one below it.
server_log::log_level from_python_level(int levelno) noexcept {
  if (levelno >= 50) {
    return server_log::log_level::critical;
  }
  if (levelno >= 40) {
    return server_log::log_level::error;
  }
  if (levelno >= 30) {
    return server_log::log_level::warning;
  }
  if (levelno >= 20) {
    return server_log::log_level::info;
  }
  return server_log::log_level::debug;
}

/// Thread: any thread holding its interpreter's GIL; the write runs without it.
void log(int levelno, const py::handle& message) {
  if (!PyUnicode_Check(message.ptr())) {
    throw py::type_error("message must be str, not " +
                         std::string{Py_TYPE(message.ptr())->tp_name});
  }
  // As sys.stderr would write it: a lone surrogate (an undecodable file
  // name) becomes a backslash escape instead of failing the message.
  auto bytes = py::reinterpret_steal<py::object>(
      PyUnicode_AsEncodedString(message.ptr(), "utf-8", "backslashreplace"));
  if (!bytes) {
    throw py::error_already_set();
  }
  const std::string_view text{PyBytes_AS_STRING(bytes.ptr()),
                              static_cast<std::size_t>(PyBytes_GET_SIZE(bytes.ptr()))};
  const auto level = from_python_level(levelno);
  // The bytes object stays referenced; another thread may take the GIL
  // while this one waits for stderr.
  py::gil_scoped_release nogil;
  server_log::write(level, text);
}

void set_log_level(const std::string& name) {
  const auto level = server_log::level_from_name(name);
  if (!level) {
    throw py::value_error("unknown log level '" + name +
                          "' (debug, info, warning, error, critical)");
  }
  server_log::set_level(*level);
}

std::string log_level() {
  return std::string{server_log::level_name(server_log::level())};
}

}  // namespace

void register_log(py::module_& m) {
  m.def("log", &log, py::arg("level"), py::arg("message"),
        "Writes 'cadeloop: <message>' to stderr through the native server log when `level` (a "
        "logging level number) is at least log_level(). Releases the GIL while writing.");
  m.def("set_log_level", &set_log_level, py::arg("name"),
        "Sets the native server log's level for the whole process: debug, info, warning, error "
        "or critical.");
  m.def("log_level", &log_level, "The native server log's level name.");
}

}  // namespace cadeloop::pyhost
