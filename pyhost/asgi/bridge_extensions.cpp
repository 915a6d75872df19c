// The ASGI extensions of HTTP responses the bridge offers in
// scope["extensions"]: `http.response.pathsend` (the app names a file; the
// bridge opens it, sends the head, and the I/O thread sends the file's bytes
// with sendfile(2) as the socket takes them: this thread never reads it) and
// `http.response.trailers` (a trailer section after a chunked body, for a
// client that sent `TE: trailers`; dropped, as the spec allows, otherwise).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <cadeloop/http/request.hpp>

#include "asgi/request_type.hpp"

namespace cadeloop::pyhost::server {

namespace {

bool is_type(PyObject* type, const char* name) {
  return PyUnicode_Check(type) && PyUnicode_CompareWithASCIIString(type, name) == 0;
}

bool iequal(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
    if (lower(a[i]) != lower(b[i])) {
      return false;
    }
  }
  return true;
}

/// `message[key]` (borrowed) or NULL without an exception when missing.
PyObject* get_item(PyObject* message, const char* key) {
  PyObject* k = PyUnicode_InternFromString(key);
  if (k == nullptr) {
    return nullptr;
  }
  PyObject* v = PyDict_GetItemWithError(message, k);
  Py_DECREF(k);
  return v;
}

/// Closes a descriptor on every path out of a scope unless released.
struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0) {
      ::close(fd);
    }
  }
  int release() noexcept { return std::exchange(fd, -1); }
};

}  // namespace

bool accepts_trailers(const http::request_head& head) noexcept {
  for (const http::header_field f : head.headers()) {
    if (!iequal(f.name, "te")) {
      continue;
    }
    std::string_view v = f.value;
    while (!v.empty()) {
      const std::size_t comma = v.find(',');
      std::string_view item = v.substr(0, comma);
      v = comma == std::string_view::npos ? std::string_view{} : v.substr(comma + 1);
      item = item.substr(0, item.find(';'));
      while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) {
        item.remove_prefix(1);
      }
      while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) {
        item.remove_suffix(1);
      }
      if (iequal(item, "trailers")) {
        return true;
      }
    }
  }
  return false;
}

bool bridge::add_http_extensions(PyObject* scope, bool given) {
  if (http_extensions_ == nullptr) {
    http_extensions_ =
        Py_BuildValue("{s:{},s:{}}", "http.response.pathsend", "http.response.trailers");
    if (http_extensions_ == nullptr) {
      return false;
    }
  }
  if (given) {
    PyObject* tls = PyDict_GetItemWithError(scope, n_.extensions);
    return tls != nullptr && PyDict_Merge(tls, http_extensions_, 0) == 0;
  }
  PyObject* copy = PyDict_Copy(http_extensions_);
  const bool ok = copy != nullptr && PyDict_SetItem(scope, n_.extensions, copy) == 0;
  Py_XDECREF(copy);
  return ok;
}

PyObject* bridge::send_extension(request_object* r, PyObject* type, PyObject* message) {
  if (is_type(type, "http.response.pathsend")) {
    return send_pathsend(r, message);
  }
  if (is_type(type, "http.response.trailers")) {
    return send_trailers(r, message);
  }
  return nullptr;  // no exception: not an extension's message
}

// The response is complete: a receive() waiting for the end learns it now.
void bridge::response_sent(request_object* r) {
  r->complete = true;
  if (r->body_delivered && r->receive_waiter != nullptr) {
    wake_receiver(r);
  }
}

// --------------------------------------------------------------- pathsend

PyObject* bridge::send_pathsend(request_object* r, PyObject* message) {
  if (!r->started) {
    PyErr_SetString(PyExc_RuntimeError,
                    "'http.response.pathsend' sent before 'http.response.start'");
    return nullptr;
  }
  if (r->complete) {
    PyErr_SetString(PyExc_OSError, "'http.response.pathsend' sent after the response was complete");
    return nullptr;
  }
  if (r->head_written) {
    PyErr_SetString(
        PyExc_RuntimeError,
        "'http.response.pathsend' sent after 'http.response.body' (it is the whole body)");
    return nullptr;
  }
  PyObject* path = PyDict_GetItemWithError(message, n_.path);
  if (path == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_ValueError, "'http.response.pathsend' without a 'path'");
    }
    return nullptr;
  }
  if (!PyUnicode_Check(path)) {
    PyErr_Format(PyExc_TypeError, "'path' in 'http.response.pathsend' must be a str, got %.100s",
                 Py_TYPE(path)->tp_name);
    return nullptr;
  }
  PyObject* encoded = nullptr;
  if (PyUnicode_FSConverter(path, &encoded) == 0) {
    return nullptr;
  }
  const std::string file{PyBytes_AS_STRING(encoded),
                         static_cast<std::size_t>(PyBytes_GET_SIZE(encoded))};
  Py_DECREF(encoded);
  if (file.empty() || file.front() != '/') {
    PyErr_Format(PyExc_ValueError, "'path' in 'http.response.pathsend' must be absolute, got %R",
                 path);
    return nullptr;
  }
  fd_guard fd{::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY)};
  if (fd.fd < 0) {
    return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
  }
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) {
    return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
  }
  if (!S_ISREG(st.st_mode)) {
    PyErr_Format(PyExc_ValueError, "'path' in 'http.response.pathsend' is not a regular file: %R",
                 path);
    return nullptr;
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  r->trailers = false;  // the file is the rest of the response: nothing follows it
  scratch_.clear();
  if (!encode_head(r, size)) {
    return nullptr;
  }
  const http::body_part_framing f = r->encoder->frame_body_part(size, scratch_);
  std::string tail{f.status.ok() ? f.after_body : std::string_view{}};
  const http::encode_status st_end =
      f.status.ok() ? r->encoder->finish({}, tail) : http::encode_status{};
  if (!f.status.ok() || !st_end.ok() || !tail.empty()) {
    // The app's content-length disagrees with the file (or framing would follow it).
    PyErr_Format(PyExc_ValueError, "%s in 'http.response.pathsend' of %R (%llu bytes)",
                 !f.status.ok() ? f.status.message().c_str()
                 : !st_end.ok() ? st_end.message().c_str()
                                : "framing after the file",
                 path, static_cast<unsigned long long>(size));
    return nullptr;
  }
  try {
    runtime::send_options o;
    o.keep_alive = r->encoder->keep_alive();
    o.status = static_cast<std::uint16_t>(r->status);
    if (!f.send_body || size == 0) {  // HEAD, 204, 304, an empty file: the head is all
      o.end_of_response = true;
      side_.send(r->conn, r->seq, net::byte_buffer::copy_of(scratch_), o);
    } else {
      side_.send(r->conn, r->seq, net::byte_buffer::copy_of(scratch_), o);
      o.status = 0;
      side_.send_file(r->conn, r->seq, fd.fd, 0, size, o);
      (void)fd.release();  // the I/O thread closes it
    }
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  }
  response_sent(r);
  return Py_NewRef(none_ready_);
}

// --------------------------------------------------------------- trailers

PyObject* bridge::send_trailers(request_object* r, PyObject* message) {
  if (!r->started) {
    PyErr_SetString(PyExc_RuntimeError,
                    "'http.response.trailers' sent before 'http.response.start'");
    return nullptr;
  }
  if (!r->trailers) {
    PyErr_SetString(PyExc_RuntimeError,
                    "'http.response.trailers' sent but 'http.response.start' did not set "
                    "'trailers': True");
    return nullptr;
  }
  if (r->complete) {
    PyErr_SetString(PyExc_OSError, "'http.response.trailers' sent after the response was complete");
    return nullptr;
  }
  PyObject* headers = PyDict_GetItemWithError(message, n_.headers);
  if (headers == nullptr && PyErr_Occurred()) {
    return nullptr;
  }
  PyObject* more_obj = get_item(message, "more_trailers");
  if (more_obj == nullptr && PyErr_Occurred()) {
    return nullptr;
  }
  const int more = more_obj == nullptr ? 0 : PyObject_IsTrue(more_obj);
  if (more < 0) {
    return nullptr;
  }
  PyObject* list = header_pair_list(headers, "http.response.trailers");
  if (list == nullptr) {
    return nullptr;
  }
  // After the head is encoded, start_headers holds the trailers gathered so far.
  if (r->head_written && r->start_headers != nullptr) {
    const int rc = PyList_SetSlice(r->start_headers, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, list);
    Py_DECREF(list);
    if (rc != 0) {
      return nullptr;
    }
  } else if (r->head_written) {
    r->start_headers = list;
  } else {
    Py_DECREF(list);  // kept below, once the head (which consumes start_headers) is encoded
    list = nullptr;
  }
  if (more) {
    if (!r->head_written) {
      // Rare: trailers before any body. Keep them aside until the head goes.
      PyErr_SetString(PyExc_RuntimeError,
                      "'http.response.trailers' with more_trailers before 'http.response.body'");
      return nullptr;
    }
    return Py_NewRef(none_ready_);
  }
  scratch_.clear();
  const bool with_head = !r->head_written;
  PyObject* gathered = nullptr;
  if (with_head) {
    // No body was sent: an empty one, then the trailers given here.
    gathered = header_pair_list(headers, "http.response.trailers");
    if (gathered == nullptr || !encode_head(r, std::nullopt)) {
      Py_XDECREF(gathered);
      return nullptr;
    }
  } else {
    gathered = std::exchange(r->start_headers, nullptr);
  }
  std::vector<http::header_field> fields;
  const Py_ssize_t n = gathered == nullptr ? 0 : PyList_GET_SIZE(gathered);
  for (Py_ssize_t i = 0; i < n && r->te_trailers; ++i) {
    PyObject* pair = PyList_GET_ITEM(gathered, i);
    PyObject* name = PyTuple_GET_ITEM(pair, 0);
    PyObject* value = PyTuple_GET_ITEM(pair, 1);
    fields.push_back(
        {{PyBytes_AS_STRING(name), static_cast<std::size_t>(PyBytes_GET_SIZE(name))},
         {PyBytes_AS_STRING(value), static_cast<std::size_t>(PyBytes_GET_SIZE(value))}});
  }
  const http::encode_status st = r->encoder->finish(fields, scratch_);
  Py_XDECREF(gathered);
  if (!st.ok()) {
    PyErr_Format(PyExc_ValueError, "%s in 'http.response.trailers'", st.message().c_str());
    return nullptr;
  }
  try {
    runtime::send_options o;
    o.end_of_response = true;
    o.keep_alive = r->encoder->keep_alive();
    o.status = with_head ? static_cast<std::uint16_t>(r->status) : std::uint16_t{0};
    side_.send(r->conn, r->seq, net::byte_buffer::copy_of(scratch_), o);
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  }
  response_sent(r);
  return Py_NewRef(none_ready_);
}

}  // namespace cadeloop::pyhost::server
