// cadeloop._core: core pairs in own-GIL sub-interpreters (PEP 684, 3.12+),
// the process-wide registry through which the main thread stops them, and
// the parent-death signal of worker processes.
//
// A sub-interpreter pair is a native thread that creates its interpreter with
// Py_NewInterpreterFromConfig, calls one Python function there
// (cadeloop._subinterpreters.run_interp_pair, which builds and runs a
// cadeloop._pair.PairServer, lifespan included), records the outcome as plain
// C++ data and ends the interpreter. Nothing in this
// file holds a Python object beyond the call that made it: the registry is
// plain data shared by every interpreter (the module's C++ statics are
// per-process, its Python objects per-interpreter).
#ifndef PY_SSIZE_T_CLEAN
#define PY_SSIZE_T_CLEAN
#endif
#include <Python.h>

#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <pybind11/stl.h>

#include "register.hpp"

namespace cadeloop::pyhost {

namespace py = pybind11;

namespace {

#if PY_VERSION_HEX >= 0x030C0000 && !defined(Py_GIL_DISABLED)
#define CADELOOP_OWN_GIL 1
#else
#define CADELOOP_OWN_GIL 0
#endif

/// One interpreter thread's record, shared by the main thread (which starts,
/// stops, waits for and releases it) and the thread itself. Plain data only.
/// Owned by the registry; the thread holds a shared_ptr while it runs, so
/// whichever of the two lets go last destroys it.
struct interp_slot {
  std::int64_t id = 0;
  std::string module;    ///< the Python module the entry function lives in
  std::string function;  ///< called as function(argument, id) -> (code, message, stats)
  std::string argument;
  std::vector<int> cpus;     ///< affinity of the thread (and of threads it starts); empty: unchanged
  double thread_grace = 5;   ///< seconds threads the app started get to end before the interpreter ends

  int stop_fd = -1;                 ///< eventfd: the pair's loop watches it; written on a stop request
  std::atomic<int> stop_level{0};   ///< 1: drain; 2: drain cut short

  std::mutex mutex;
  std::condition_variable changed;
  // Guarded by `mutex`.
  bool ready = false;
  bool finished = false;
  bool ended = false;  ///< Py_EndInterpreter ran (false: the interpreter was left alive)
  std::string description;
  int exit_code = 0;
  std::string message;
  std::string stats;

  std::thread thread;

  ~interp_slot() {
    if (stop_fd >= 0) {
      ::close(stop_fd);
    }
    if (thread.joinable()) {
      thread.detach();  // only at process exit with a thread stuck in the app
    }
  }
};

/// Every interpreter thread not yet released, by id. Any thread, under `registry_mutex`.
std::mutex registry_mutex;
std::map<std::int64_t, std::shared_ptr<interp_slot>> registry;
#if CADELOOP_OWN_GIL
std::int64_t next_id = 1;
#endif

std::shared_ptr<interp_slot> find_slot(std::int64_t id) {
  std::lock_guard lock{registry_mutex};
  auto it = registry.find(id);
  if (it == registry.end()) {
    throw py::value_error("no interpreter pair " + std::to_string(id));
  }
  return it->second;
}

/// Raises the stop level of one slot (never lowers it) and wakes its loop. Any thread.
void request_stop(interp_slot& s, int level) noexcept {
  int current = s.stop_level.load();
  while (current < level && !s.stop_level.compare_exchange_weak(current, level)) {
  }
  const std::uint64_t one = 1;
  if (s.stop_fd >= 0) {
    (void)!::write(s.stop_fd, &one, sizeof one);
  }
}

#if CADELOOP_OWN_GIL

void finish(interp_slot& s, int code, std::string message, std::string stats, bool ended) {
  {
    std::lock_guard lock{s.mutex};
    s.finished = true;
    s.ended = ended;
    s.exit_code = code;
    s.message = std::move(message);
    s.stats = std::move(stats);
  }
  s.changed.notify_all();
}

/// "Type: message" of the exception being raised (cleared). Interpreter thread, GIL held.
std::string take_error_line() {
  PyObject* exc = PyErr_GetRaisedException();
  if (exc == nullptr) {
    return "unknown error";
  }
  std::string line = Py_TYPE(exc)->tp_name;
  PyObject* text = PyObject_Str(exc);
  if (text != nullptr) {
    const char* utf8 = PyUnicode_AsUTF8(text);
    if (utf8 != nullptr && *utf8 != '\0') {
      line += ": ";
      line += utf8;
    }
    Py_DECREF(text);
  }
  PyErr_Clear();
  Py_DECREF(exc);
  return line;
}

/// Threads of this interpreter other than the caller's. Interpreter thread,
/// GIL held (thread states leave the list only under their interpreter's GIL).
int other_threads(PyThreadState* self) {
  int n = 0;
  for (PyThreadState* t = PyInterpreterState_ThreadHead(PyThreadState_GetInterpreter(self)); t != nullptr;
       t = PyThreadState_Next(t)) {
    if (t != self) {
      ++n;
    }
  }
  return n;
}

/// Calls the slot's entry function; returns (exit code, message, stats).
/// Interpreter thread, GIL held.
std::tuple<int, std::string, std::string> call_entry(const interp_slot& s) {
  PyObject* mod = PyImport_ImportModule(s.module.c_str());
  if (mod == nullptr) {
    return {1, take_error_line(), ""};
  }
  PyObject* result = PyObject_CallMethod(mod, s.function.c_str(), "sL", s.argument.c_str(),
                                         static_cast<long long>(s.id));
  Py_DECREF(mod);
  if (result == nullptr) {
    return {1, take_error_line(), ""};
  }
  int code = 1;
  const char* message = nullptr;
  const char* stats = nullptr;
  std::tuple<int, std::string, std::string> out;
  if (PyArg_ParseTuple(result, "iss", &code, &message, &stats)) {
    out = {code, message, stats};
  } else {
    out = {1, take_error_line(), ""};
  }
  Py_DECREF(result);
  return out;
}

/// The body of an interpreter thread. Owns no Python object across calls.
void run_interpreter(std::shared_ptr<interp_slot> s) {
  if (!s->cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : s->cpus) {
      if (cpu >= 0 && cpu < CPU_SETSIZE) {
        CPU_SET(static_cast<unsigned>(cpu), &set);
      }
    }
    // The I/O thread the pair starts inherits this mask: both threads share the CPU set.
    (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  }

  PyInterpreterConfig config{};
  config.use_main_obmalloc = 0;
  config.allow_fork = 0;           // forking a process with other interpreters' threads is unsound
  config.allow_exec = 1;           // subprocess (fork+exec) stays usable
  config.allow_threads = 1;
  // asgiref (every Django request) starts one; safe because the end below waits for
  // every thread state, daemon or not, before Py_EndInterpreter (docs/architecture.md)
  config.allow_daemon_threads = 1;
  config.check_multi_interp_extensions = 1;
  config.gil = PyInterpreterConfig_OWN_GIL;

  // No thread state is current on this new thread; on 3.13 creation briefly
  // takes the main interpreter's GIL, which the main thread never holds
  // while it waits for us (it waits in interp_wait, GIL released).
  PyThreadState* tstate = nullptr;
  const PyStatus status = Py_NewInterpreterFromConfig(&tstate, &config);
  if (PyStatus_Exception(status)) {
    std::string why = "cannot create a sub-interpreter";
    if (status.err_msg != nullptr) {
      why += ": ";
      why += status.err_msg;
    }
    finish(*s, 1, std::move(why), "", true);
    return;
  }

  auto [code, message, stats] = call_entry(*s);

  // Py_EndInterpreter waits for threading's non-daemon threads and aborts
  // the process if any other thread state of this interpreter is alive (a
  // raw _thread thread, a C thread). Give them `thread_grace` seconds, in
  // slices with our GIL released so they can run, and leave the interpreter
  // alive rather than abort if they never end (the process then exits
  // without finalizing; see cadeloop.server.run_server).
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds{static_cast<std::int64_t>(s->thread_grace * 1000)};
  while (other_threads(tstate) > 0 && std::chrono::steady_clock::now() < deadline) {
    Py_BEGIN_ALLOW_THREADS
    std::this_thread::sleep_for(std::chrono::milliseconds{10});
    Py_END_ALLOW_THREADS
  }
  const int left = other_threads(tstate);
  if (left > 0) {
    if (message.empty()) {
      message = std::to_string(left) + " thread(s) the app started still run; the interpreter was not ended";
    }
    (void)PyEval_SaveThread();  // let them run; the interpreter stays alive
    finish(*s, code == 0 ? 1 : code, std::move(message), std::move(stats), false);
    return;
  }
  Py_EndInterpreter(tstate);
  finish(*s, code, std::move(message), std::move(stats), true);
}

#endif  // CADELOOP_OWN_GIL

/// Starts an interpreter thread running module.function(argument, id).
/// Main thread (GIL held). Returns the slot id.
std::int64_t interp_start(const std::string& module, const std::string& function, const std::string& argument,
                          const std::vector<int>& cpus, double thread_grace) {
#if CADELOOP_OWN_GIL
  auto s = std::make_shared<interp_slot>();
  s->module = module;
  s->function = function;
  s->argument = argument;
  s->cpus = cpus;
  s->thread_grace = thread_grace;
  s->stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->stop_fd < 0) {
    PyErr_SetFromErrno(PyExc_OSError);
    throw py::error_already_set();
  }
  {
    std::lock_guard lock{registry_mutex};
    s->id = next_id++;
    registry.emplace(s->id, s);
  }
  try {
    s->thread = std::thread{run_interpreter, s};
  } catch (...) {
    std::lock_guard lock{registry_mutex};
    registry.erase(s->id);
    throw;
  }
  return s->id;
#else
  (void)module, (void)function, (void)argument, (void)cpus, (void)thread_grace;
  throw std::runtime_error("own-GIL sub-interpreters need CPython 3.12+");
#endif
}

/// Waits up to `timeout` seconds for the slot to finish (or, with
/// `for_ready`, to report ready or finish). The GIL is released meanwhile, in
/// one slice: callers loop so that signal handlers run between slices.
bool interp_wait(std::int64_t id, double timeout, bool for_ready) {
  std::shared_ptr<interp_slot> s = find_slot(id);
  py::gil_scoped_release nogil;
  std::unique_lock lock{s->mutex};
  return s->changed.wait_for(lock, std::chrono::microseconds{static_cast<std::int64_t>(timeout * 1e6)},
                             [&] { return s->finished || (for_ready && s->ready); });
}

/// (ready, finished, ended, description, exit code, message, stats). Any thread.
py::tuple interp_status(std::int64_t id) {
  std::shared_ptr<interp_slot> s = find_slot(id);
  std::lock_guard lock{s->mutex};
  return py::make_tuple(s->ready, s->finished, s->ended, s->description, s->exit_code, s->message, s->stats);
}

/// Joins a finished slot's thread and forgets it. Main thread.
void interp_release(std::int64_t id) {
  std::shared_ptr<interp_slot> s = find_slot(id);
  {
    std::lock_guard lock{s->mutex};
    if (!s->finished) {
      throw std::runtime_error("interpreter pair still running");
    }
  }
  {
    py::gil_scoped_release nogil;
    if (s->thread.joinable()) {
      s->thread.join();
    }
  }
  std::lock_guard lock{registry_mutex};
  registry.erase(id);
}

/// Asks every registered pair to stop (level 1: drain; 2: drain cut short). Any thread.
int interp_request_stop_all(int level) {
  std::lock_guard lock{registry_mutex};
  for (auto& [id, s] : registry) {
    request_stop(*s, level);
  }
  return static_cast<int>(registry.size());
}

// --- called inside the pair's own interpreter ---

int interp_stop_fd(std::int64_t id) { return find_slot(id)->stop_fd; }

/// Clears the stop eventfd and returns the stop level (0: none). Pair thread.
int interp_take_stop(std::int64_t id) {
  std::shared_ptr<interp_slot> s = find_slot(id);
  std::uint64_t n = 0;
  (void)!::read(s->stop_fd, &n, sizeof n);
  return s->stop_level.load();
}

/// The pair listens now ("127.0.0.1:8000"). Pair thread.
void interp_report_ready(std::int64_t id, const std::string& description) {
  std::shared_ptr<interp_slot> s = find_slot(id);
  {
    std::lock_guard lock{s->mutex};
    s->ready = true;
    s->description = description;
  }
  s->changed.notify_all();
}

/// prctl(PR_SET_PDEATHSIG): this process gets `sig` when the thread that
/// forked it ends. Worker process, main thread, before it starts threads.
void set_parent_death_signal(int sig) {
  if (::prctl(PR_SET_PDEATHSIG, static_cast<unsigned long>(sig)) != 0) {
    PyErr_SetFromErrno(PyExc_OSError);
    throw py::error_already_set();
  }
}

}  // namespace

void register_interp(py::module_& m) {
  m.def("interp_start", &interp_start, py::arg("module"), py::arg("function"), py::arg("argument"),
        py::arg("cpus"), py::arg("thread_grace"),
        "Starts a native thread that runs module.function(argument, id) -> (code, message, stats) in a new "
        "own-GIL sub-interpreter, then ends it; returns the id. Main thread.");
  m.def("interp_wait", &interp_wait, py::arg("id"), py::arg("timeout"), py::arg("for_ready") = false,
        "Waits (GIL released) up to timeout seconds for the pair to finish (or be ready); True if it did.");
  m.def("interp_status", &interp_status, py::arg("id"),
        "(ready, finished, ended, description, exit_code, message, stats) of a pair.");
  m.def("interp_release", &interp_release, py::arg("id"), "Joins a finished pair's thread and forgets it.");
  m.def("interp_request_stop_all", &interp_request_stop_all, py::arg("level"),
        "Stops every running pair (1: drain, 2: drain cut short); returns how many. Any thread, no GIL needed.");
  m.def("interp_stop_fd", &interp_stop_fd, py::arg("id"), "The eventfd a pair's loop watches for stop requests.");
  m.def("interp_take_stop", &interp_take_stop, py::arg("id"), "Clears the stop eventfd; returns the stop level.");
  m.def("interp_report_ready", &interp_report_ready, py::arg("id"), py::arg("description"),
        "Reports that the pair listens. Pair thread.");
  m.def("set_parent_death_signal", &set_parent_death_signal, py::arg("sig"),
        "prctl(PR_SET_PDEATHSIG, sig) for this process (Linux).");
}

}  // namespace cadeloop::pyhost
