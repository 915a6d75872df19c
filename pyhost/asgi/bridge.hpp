#pragma once
// Private to pyhost: the app thread's half of a core pair — the ASGI 3.0 HTTP
// bridge. It drains the pair's inbound ring inside cadeloop.Loop's own pass
// (as a loop_source), builds each request's scope, starts the app coroutine
// eagerly, and turns the app's send() messages into response bytes staged
// on the outbound ring.
//
// The code is split by what it does: bridge.cpp (the bridge's life and its
// loop_source part), bridge_request.cpp (a request from its head to the end
// of its task: scope, app, completion), bridge_receive.cpp and
// bridge_send.cpp (the app's receive() and send()), request_type.cpp (the
// Request and Ready types). It reaches the loop only through loop_source.
//
// Everything here runs on the loop (app) thread with its interpreter's GIL
// held; only the core pair's I/O thread runs elsewhere, and it never sees a
// Python object. Every Python object the bridge keeps belongs to the
// interpreter that created it (no C++ statics hold one).

#ifndef PY_SSIZE_T_CLEAN
#define PY_SSIZE_T_CLEAN  // '#' formats take Py_ssize_t (required before 3.12)
#endif
#include <Python.h>

#include <cadeloop/http/date_cache.hpp>
#include <cadeloop/http/response_encoder.hpp>
#include <cadeloop/net/byte_buffer.hpp>
#include <cadeloop/runtime/core_pair.hpp>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "asgi/app_task.hpp"
#include "asgi/proxy_headers.hpp"
#include "loop/loop_source.hpp"

namespace cadeloop::pyhost::server {

class bridge;

/// One WebSocket message received and not yet given to the app.
struct ws_inbound {
  net::byte_buffer bytes;
  bool text = false;
};

/// The messages of one WebSocket waiting for the app, oldest first: one
/// vector that allocates nothing until the first message arrives and gives
/// a burst's storage back when it empties (an empty std::deque costs ~600
/// bytes, and most WebSockets sit idle most of the time). Loop thread.
class ws_inbox {
 public:
  [[nodiscard]] bool empty() const noexcept { return head_ == items_.size(); }
  ws_inbound& front() noexcept { return items_[head_]; }
  void push_back(ws_inbound&& m) { items_.push_back(std::move(m)); }
  void pop_front() {
    items_[head_] = ws_inbound{};  // its bytes go now, not at the next compaction
    if (++head_ == items_.size()) {
      clear();
    } else if (head_ >= 16 && head_ * 2 >= items_.size()) {
      items_.erase(items_.begin(), items_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }
  void clear() noexcept {
    head_ = 0;
    items_.clear();
    if (items_.capacity() > 4) {
      std::vector<ws_inbound>{}.swap(items_);  // a burst's storage is given back
    }
  }

 private:
  std::vector<ws_inbound> items_;
  std::size_t head_ = 0;
};

/// The app side's state of a WebSocket upgrade request (bridge_websocket.cpp).
/// Owned by its request_object. Loop thread.
struct ws_session {
  enum class phase : std::uint8_t {
    connecting,  ///< neither accepted nor denied yet
    accepted,    ///< websocket.accept sent: the connection speaks WebSocket
    denied,      ///< answered with an HTTP response (403 or the app's own)
  };
  phase state = phase::connecting;
  bool connect_delivered = false;     ///< receive() gave websocket.connect
  bool app_closed = false;            ///< the app sent websocket.close after accepting
  bool peer_closed = false;           ///< the WebSocket ended (ws_close or the connection gone)
  bool disconnect_delivered = false;  ///< receive() gave websocket.disconnect
  std::uint16_t close_code = 1006;    ///< with peer_closed: the code the app sees
  std::string close_reason;
  ws_inbox inbox;  ///< messages received, oldest first
};

/// The body pieces of one request not yet given to the app, oldest first.
/// The first is held inline, so a body that came in one piece (the common
/// case) costs no allocation here; a vector for the others is made when a
/// second piece waits. Plain data, so that request_object stays a C struct:
/// all-zero is empty; `destroy()` frees everything. Loop thread.
struct pending_body {
  char* first;  ///< owned allocation (net::byte_buffer::release()), or NULL when empty
  std::size_t first_size;
  std::size_t first_offset;             ///< where its bytes start in `first`
  std::vector<net::byte_buffer>* rest;  ///< owned, or NULL; non-empty only with `first`

  [[nodiscard]] bool empty() const noexcept { return first == nullptr; }
  /// The first piece's bytes.
  [[nodiscard]] const char* first_data() const noexcept { return first + first_offset; }
  /// Appends a non-empty piece. Throws std::bad_alloc (the piece is then dropped).
  void push(net::byte_buffer&& piece) {
    if (first == nullptr) {
      first_size = piece.size();
      first_offset = piece.offset();
      first = piece.release();
      return;
    }
    if (rest == nullptr) {
      rest = new std::vector<net::byte_buffer>();
    }
    rest->push_back(std::move(piece));
  }
  /// Bytes waiting.
  [[nodiscard]] std::size_t size() const noexcept {
    std::size_t n = first == nullptr ? 0 : first_size;
    if (rest != nullptr) {
      for (const net::byte_buffer& b : *rest) {
        n += b.size();
      }
    }
    return n;
  }
  /// Frees the pieces (keeps the vector's storage).
  void clear() noexcept {
    (void)net::byte_buffer::adopt(std::exchange(first, nullptr), first_size, first_offset);
    first_size = first_offset = 0;
    if (rest != nullptr) {
      rest->clear();
    }
  }
  /// Frees the pieces and the vector.
  void destroy() noexcept {
    clear();
    delete std::exchange(rest, nullptr);
  }
};

/// One HTTP request as the app sees it: the owner of its `receive`/`send`
/// callables and of its response encoder. A CPython GC object made by the
/// bridge on the loop thread; whichever reference goes last frees it (a task
/// may keep it after the bridge is gone: `owner` is then NULL and its
/// methods raise ClientDisconnected).
struct request_object {
  PyObject_HEAD bridge* owner;  // NULL once the bridge is gone
  request_object* live_prev;    // the bridge's list of live requests
  request_object* live_next;
  PyObject* task;  // the app's task (RequestTask, or asyncio.Task); strong until it is done
  PyObject* receive_waiter;  // a Future a receive() waits on, or NULL
  PyObject* send_waiter;     // a Future a send() waits on (drained), or NULL
  PyObject* start_headers;   // headers of http.response.start until the head is encoded (a list)
  PyObject* gated;           // a body message waiting for the pair's staging gate (a dict), or NULL
  PyObject* receive_fn;      // the receive() and send() the app was given (strong until finish():
  PyObject* send_fn;         // then back to the bridge's spares when nothing else holds them)
  net::connection_id conn;
  std::uint32_t seq;
  unsigned status;
  pending_body body;                // body pieces not given to the app yet
  ws_session* ws;                   // owned: a WebSocket upgrade's state, else NULL
  http::response_encoder* encoder;  // in encoder_space once made (make_encoder), else NULL
  http::request_context ctx;
  bool has_body;        // body events follow the head
  bool body_complete;   // the last body piece arrived (or there is no body)
  bool body_delivered;  // the app got more_body == False
  bool expect_continue;
  bool continue_sent;
  bool started;       // http.response.start received
  bool head_written;  // the head bytes are staged (a 500 can no longer replace them)
  bool complete;      // the response is complete (or was replaced/aborted)
  bool disconnected;  // the connection is gone
  bool finished;      // task done and the request forgotten by its connection
  bool te_trailers;   // the client sent `TE: trailers` (bridge_extensions.cpp)
  bool trailers;      // http.response.start announced trailers
  bool body_done;     // the last http.response.body came; trailers may follow
  // The encoder lives in the request object: no allocation per request.
  alignas(http::response_encoder) unsigned char encoder_space[sizeof(http::response_encoder)];
};
static_assert(std::is_trivially_destructible_v<http::response_encoder>,
              "request_object frees its encoder without calling a destructor");

/// Makes r's encoder (in r->encoder_space) and starts it for r's request.
inline void make_encoder(request_object* r, http::date_cache& dates,
                         const http::encoder_options& options) noexcept {
  r->encoder = new (static_cast<void*>(r->encoder_space)) http::response_encoder(dates, options);
  r->encoder->start(r->ctx);
}

/// The app side's view of one connection (indexed by slot).
struct conn_state {
  std::uint32_t generation = 0;
  std::uint64_t sent_since_notice = 0;  // response bytes staged since the last drained notice
  bool waiting_drain = false;           // a drained notice was asked for
  bool shed = false;                    // cut by the staging gate (its disconnect is on the way)
  std::uint64_t drain_asked = 0;        // the bridge's drain_asks_ when waiting_drain was set
  bool peer_eof = false;                // the client stopped sending (it may be gone)
  PyObject* client = nullptr;           // (host, port) or None; strong
  std::vector<request_object*> active;  // requests in flight, strong references
  // From the connection's second request: the scope template with its
  // client, server and HTTP version set (strong), so a request's scope copies
  // it and sets only what changes per request (bridge::build_scope).
  PyObject* scope_base = nullptr;
  std::uint32_t scope_base_of = 0;  // the bridge's template_generation_ it was made from
  bool scope_base_v10 = false;      // its http_version is "1.0"
  // The base also holds the method, path, raw_path and query_string of the
  // request it was made at; a later request on the connection with the same
  // target or query bytes takes these objects (build_scope compares the
  // bytes first) and so leaves those keys as copied. Borrowed from the base,
  // and read only while it is set (made together with it).
  PyObject* base_method = nullptr;
  PyObject* base_path = nullptr;
  PyObject* base_raw_path = nullptr;
  PyObject* base_query = nullptr;
  bool had_request = false;
};

/// Interned names and constant objects of one bridge (one interpreter).
struct names {
  PyObject* type = nullptr;
  PyObject* asgi = nullptr;
  PyObject* http_version = nullptr;
  PyObject* method = nullptr;
  PyObject* scheme = nullptr;
  PyObject* path = nullptr;
  PyObject* raw_path = nullptr;
  PyObject* query_string = nullptr;
  PyObject* root_path = nullptr;
  PyObject* headers = nullptr;
  PyObject* client = nullptr;
  PyObject* server = nullptr;
  PyObject* state = nullptr;
  PyObject* body = nullptr;
  PyObject* more_body = nullptr;
  PyObject* status = nullptr;
  PyObject* trailers = nullptr;
  PyObject* v10 = nullptr;  // "1.0"
  PyObject* v11 = nullptr;  // "1.1"
  PyObject* http_request = nullptr;
  PyObject* http_disconnect = nullptr;
  PyObject* response_start = nullptr;
  PyObject* response_body = nullptr;
  PyObject* done = nullptr;
  PyObject* exception = nullptr;
  PyObject* set_result = nullptr;
  PyObject* set_exception = nullptr;
  PyObject* add_done_callback = nullptr;
  PyObject* cancel = nullptr;
  PyObject* empty_bytes = nullptr;
  // WebSocket scopes and messages (bridge_websocket.cpp)
  PyObject* websocket = nullptr;
  PyObject* ws = nullptr;
  PyObject* wss = nullptr;
  PyObject* subprotocols = nullptr;
  PyObject* subprotocol = nullptr;
  PyObject* extensions = nullptr;
  PyObject* text = nullptr;
  PyObject* bytes = nullptr;
  PyObject* code = nullptr;
  PyObject* reason = nullptr;
  PyObject* ws_connect = nullptr;
  PyObject* ws_receive = nullptr;
  PyObject* ws_disconnect = nullptr;
  PyObject* ws_accept = nullptr;
  PyObject* ws_send = nullptr;
  PyObject* ws_close = nullptr;
  PyObject* ws_response_start = nullptr;
  PyObject* ws_response_body = nullptr;
  std::vector<PyObject*> methods;  // indexed by http::request_method (other: NULL)

  bool init();
  void clear();
};

/// Settings of one bridge, read once from ServerCore's options. Plain data.
struct bridge_options {
  std::uint64_t send_high_mark =
      1024 * 1024;  ///< bytes sent per connection before send() waits for "drained"
  /// Response bytes staged by the whole pair (the sum of every connection's
  /// sent_since_notice) beyond which every send() waits for its connection's
  /// "drained" notice: 1.25 x memory_budget, so many slow readers cannot make
  /// the app side allocate send_high_mark bytes each before the I/O thread can
  /// cut them.
  std::uint64_t staged_budget = std::uint64_t{256} << 20;
  std::string root_path;
  std::string unix_path;  ///< for scope["server"] of a Unix socket listener
  std::string server_header = "cadeloop";
  bool date_header = true;     ///< the app's responses get a Date header
  bool asyncio_tasks = false;  ///< apps run in asyncio.Task, not the native request task
  std::string extra_headers;   ///< "Name: value\r\n" lines added to every app response
  proxy_trust proxy;  ///< peers whose proxy headers set client and scheme (proxy_headers.hpp)
};

/// Counters of the app side. Loop thread.
struct bridge_stats {
  std::uint64_t requests = 0;         ///< requests handed to the app
  std::uint64_t eager_completed = 0;  ///< requests whose task finished inside its eager first step
  std::uint64_t app_errors = 0;       ///< app exceptions and malformed messages
  std::uint64_t drain_waits = 0;      ///< send() calls that waited for "drained"
  std::uint64_t gate_waits = 0;       ///< send() calls that waited for the staging gate
  std::uint64_t gate_cuts = 0;        ///< connections cut because sends waited at the staging gate
  std::uint64_t passes_with_work = 0;
};

/// The ASGI HTTP bridge of one core pair: a loop_source attached to one
/// cadeloop.Loop. Created, used and destroyed on the loop thread (the
/// interpreter's thread running the loop); the core pair it drives is owned
/// by the caller and must outlive it.
class bridge final : public loop_source {
 public:
  /// `app`: the ASGI callable; `loop`: the cadeloop.Loop; `on_error(msg, exc)`
  /// logs an app error; `on_stopped()` runs once when the I/O thread ended;
  /// `types`: (request type, ready type, ClientDisconnected). Raises (sets a
  /// Python exception and throws pybind11::error_already_set) on failure.
  bridge(runtime::app_side& side, PyObject* app, PyObject* loop, PyObject* on_error,
         PyObject* on_stopped, PyObject* request_type, PyObject* ready_type,
         PyObject* disconnected_type, bridge_options options);
  bridge(const bridge&) = delete;
  bridge& operator=(const bridge&) = delete;
  /// Loop thread, GIL held, after it was detached from the loop.
  ~bridge() override;

  // loop_source
  int run() override;
  bool try_park() noexcept override;
  void unpark(bool signalled) noexcept override;
  void end_of_pass() noexcept override;
  [[nodiscard]] int fd() const noexcept override { return side_.parker_fd(); }
  // Solo mode (runtime::app_side): the loop watches the pair's sockets while
  // this thread serves them.
  [[nodiscard]] int sockets_fd() const noexcept override { return side_.solo_fd(); }
  [[nodiscard]] bool wants_sockets_fd() noexcept override { return side_.serves_sockets(); }
  void sockets_ready() noexcept override { side_.sockets_ready(); }
  [[nodiscard]] bool serve_sockets_nogil() noexcept override { return side_.poll_sockets(); }
  [[nodiscard]] std::uint32_t sockets_spin_us() const noexcept override {
    return side_.solo_spin_us();
  }
  void attached(bool yes) noexcept override {
    if (yes) {
      (void)side_.enable_solo();
    } else {
      side_.disable_solo();
    }
  }

  /// Sets the lifespan state copied (shallowly) into every scope; NULL for none. Loop thread.
  void set_state(PyObject* state);
  /// Requests whose task has not finished yet. Loop thread.
  [[nodiscard]] std::size_t active_tasks() const noexcept { return active_tasks_; }
  /// Cancels every running app task. Loop thread.
  void cancel_tasks();
  /// Drops every connection's state (after the I/O thread stopped). Loop thread.
  void forget_connections();
  [[nodiscard]] const bridge_stats& stats() const noexcept { return stats_; }

  // --- called by request_object's methods (loop thread) ---
  PyObject* receive(request_object* r);
  PyObject* send(request_object* r, PyObject* message);
  /// The end of an asyncio.Task's request (its done callback).
  PyObject* task_done(request_object* r, PyObject* task);
  void unlink(request_object* r) noexcept;
  [[nodiscard]] PyObject* disconnected_type() const noexcept { return disconnected_type_; }

 private:
  void on_message(runtime::inbound_message& m);
  void on_request(runtime::inbound_message& m);
  void on_body(runtime::inbound_message& m);
  void on_disconnect(const runtime::inbound_message& m);
  void on_drained(const runtime::inbound_message& m);
  void on_peer_eof(const runtime::inbound_message& m);
  // WebSockets (bridge_websocket.cpp)
  void on_ws_message(runtime::inbound_message& m);
  void on_ws_close(runtime::inbound_message& m);
  request_object* ws_request_of(net::connection_id id) noexcept;
  PyObject* websocket_scope(PyObject* scope, const http::request_head& head, bool tls);
  PyObject* ws_receive(request_object* r);
  PyObject* ws_next_event(request_object* r);
  void ws_wake(request_object* r);
  PyObject* ws_send(request_object* r, PyObject* type, PyObject* message);
  PyObject* ws_accept(request_object* r, PyObject* message);
  PyObject* ws_send_message(request_object* r, PyObject* message);
  PyObject* ws_close(request_object* r, PyObject* message);
  void ws_deny(request_object* r, unsigned status);
  void ws_task_done(request_object* r, PyObject* exc);
  /// The app side's state of connection `id`, or NULL if it is gone (or
  /// reused). Inline: every file of the bridge calls it per message.
  conn_state* conn_of(net::connection_id id) noexcept {
    if (id.slot >= conns_.size()) {
      return nullptr;
    }
    conn_state& cs = conns_[id.slot];
    return cs.generation == id.generation ? &cs : nullptr;
  }
  request_object* find_request(conn_state& cs, std::uint32_t seq) noexcept;

  PyObject* build_scope(const runtime::inbound_message& m, conn_state& cs);
  /// A copy of full_template_ with the request line's keys and `server` set
  /// (the start of a connection's base and of first_base_); null with an
  /// exception set on failure.
  PyObject* template_for(PyObject* version, PyObject* method, PyObject* path, PyObject* raw_path,
                         PyObject* query);
  /// Whether a connection's first request may copy first_base_ (made anew
  /// for this request when the last one went unused for a while).
  bool use_first_base(PyObject* version, PyObject* method, PyObject* path, PyObject* raw_path,
                      PyObject* query);
  PyObject* build_headers(const http::request_head& head);
  PyObject* decode_path(std::string_view raw);
  PyObject* header_pair(const http::header_field& f);
  PyObject* header_name(std::string_view name);
  PyObject* address_tuple(const net::socket_address& a, bool server_side);
  bool start_app(request_object* r, PyObject* scope);
  /// The app's coroutine started in a native request task (app_task.hpp); steals `coro`.
  bool start_native(request_object* r, PyObject* coro);
  /// The end of a request's native task (app_task_done_fn).
  static void native_task_done(PyObject* owner, PyObject* task);
  /// A request's app ended with `exc` (NULL or None: returned).
  void app_ended(request_object* r, PyObject* exc);
  /// Starts the apps of the requests on_request deferred to the end of the
  /// drained batch (a request with a body, and every request after it).
  void start_deferred();

  PyObject* ready(PyObject* value);  // steals value
  PyObject* body_message(request_object* r);
  /// {"type": "http.request", "body": bytes, "more_body": more}; steals `bytes`.
  PyObject* request_message(PyObject* bytes, bool more);
  PyObject* disconnect_message();
  bool resolve(PyObject*& waiter, PyObject* value, bool exception);  // steals value
  void wake_receiver(request_object* r);

  /// The keys of an http.response.start/body message send() reads, found in
  /// one pass over the dict instead of a lookup each (a missing key costs a
  /// lookup too). Borrowed; NULL where absent.
  struct message_fields {
    PyObject* type = nullptr;
    PyObject* status = nullptr;
    PyObject* headers = nullptr;
    PyObject* trailers = nullptr;
    PyObject* body = nullptr;
    PyObject* more_body = nullptr;
  };
  void read_fields(PyObject* message, message_fields& f) const;
  PyObject* send_start(request_object* r, PyObject* message);  // reads the fields itself
  PyObject* send_start(request_object* r, const message_fields& f);
  PyObject* send_body(request_object* r, PyObject* message);  // reads the fields itself
  PyObject* send_body(request_object* r, PyObject* message, const message_fields& f);
  bool encode_head(request_object* r, std::optional<std::uint64_t> body_size);
  // ASGI extensions (bridge_extensions.cpp).
  // `given`: scope["extensions"] already holds an extension (TLS) to merge
  // into; otherwise the key holds the template's None and is replaced.
  bool add_http_extensions(PyObject* scope, bool given);
  PyObject* send_extension(request_object* r, PyObject* type, PyObject* message);
  PyObject* send_pathsend(request_object* r, PyObject* message);
  PyObject* send_trailers(request_object* r, PyObject* message);
  void response_sent(request_object* r);
  void app_error(request_object* r, const char* what, PyObject* exc);
  void finish(request_object* r);
  /// `def` bound to `self`: a spare callable of an earlier request rebound
  /// when there is one, else a new one (PyCFunction_NewEx). NULL on error.
  static PyObject* bind_callable(PyMethodDef& def, std::vector<PyObject*>& spares, PyObject* self);
  /// Drops a request's callable: kept as a spare, bound to None, when the
  /// request held the only reference (the app's frames are gone and nothing
  /// else kept it, not even a weak reference); else released.
  static void release_callable(PyObject*& fn, std::vector<PyObject*>& spares);
  void release_python();
  // Releases the app objects whose bytes were sent borrowed (send_body) and
  // have come back written or dropped. App thread, with the GIL.
  void release_owners();
  // Bodies from this size up are sent from the app's bytes object, not copied.
  static constexpr std::size_t borrow_min_body = 16 * 1024;

  runtime::app_side& side_;
  bridge_options options_;
  PyObject* app_;
  PyObject* loop_;
  PyObject* on_error_;
  PyObject* on_stopped_;
  PyObject* request_type_;
  PyObject* ready_type_;
  PyObject* disconnected_type_;
  PyObject* task_factory_ = nullptr;   // asyncio.Task (3.12+: eager start) or loop.create_task
  PyObject* task_kwnames_ = nullptr;   // ("loop", "eager_start") on 3.12+
  app_task_env* task_env_ = nullptr;   // native request tasks; NULL with asyncio_tasks
  PyObject* iscoroutine_ = nullptr;    // asyncio.iscoroutine, for what is not a native coroutine
  PyObject* create_future_ = nullptr;  // loop.create_future
  PyObject* scope_template_ = nullptr;
  PyObject* state_ = nullptr;
  PyObject* none_ready_ = nullptr;       // a reusable awaitable of None
  PyObject* last_server_ = nullptr;      // cache of scope["server"]
  PyObject* http_extensions_ = nullptr;  // scope["extensions"] of HTTP, copied per request
  // receive()/send() callables of finished requests, bound to None, rebound
  // to the next requests (no allocation and no GC tracking per request).
  std::vector<PyObject*> spare_receive_;
  std::vector<PyObject*> spare_send_;
  net::socket_address last_server_addr_{};
  names n_;
  std::unordered_map<std::string, PyObject*> header_names_;
  std::vector<PyObject*> header_pairs_;  // shared (name, value) tuples of repeating headers
  PyObject* last_path_ = nullptr;  // the last target's scope["path"] and scope["raw_path"], shared
  PyObject* last_raw_path_ = nullptr;
  std::string last_raw_text_;
  PyObject* last_client_host_ = nullptr;    // the last client's host str, shared
  net::socket_address last_client_addr_{};  // whose address it is (the port aside)
  PyObject* done_context_ = nullptr;        // the empty Context the tasks' done callbacks run in
  PyObject* done_kwnames_ = nullptr;        // ("context",)
  std::vector<conn_state> conns_;
  struct deferred_start {
    request_object* r;  // strong
    PyObject* scope;    // strong
  };
  std::vector<deferred_start> deferred_;  // on_request's, started by start_deferred()
  std::vector<deferred_start> deferred_swap_;
  request_object live_{};  // sentinel of the live list
  http::date_cache dates_;
  // App header fields checked once, for every HTTP response this thread encodes.
  http::header_line_cache header_lines_;
  std::string scratch_;
  std::vector<void*> owners_scratch_;  // release_owners()'s
  std::string path_scratch_;
  std::vector<http::header_field> fields_scratch_;  // encode_head's view of the app's headers
  // scope_template_ plus every key build_scope sets (values None), so a
  // scope is one copy whose values are replaced, never a dict that grows.
  PyObject* full_template_ = nullptr;
  bool full_template_state_ = false;       // made with the "state" key
  std::uint32_t template_generation_ = 0;  // counts the full_template_s made
  // A connection's first request copies this when it asks what the last
  // first request asked (method, target, query, HTTP version, listener):
  // full_template_ with those keys set, so a new connection's scope takes
  // two stores fewer than seven. The fb_ pointers are held by first_base_.
  PyObject* first_base_ = nullptr;
  std::uint32_t first_base_of_ = 0;  // the template_generation_ it was made from
  PyObject* fb_version_ = nullptr;
  PyObject* fb_server_ = nullptr;
  PyObject* fb_method_ = nullptr;
  PyObject* fb_raw_path_ = nullptr;
  PyObject* fb_query_ = nullptr;
  unsigned first_base_misses_ = 0;  // first requests in a row that asked something else
  std::size_t handled_ = 0;
  std::size_t active_tasks_ = 0;
  bool stopped_ = false;
  bridge_stats stats_;
  std::uint64_t staged_total_ = 0;  // the sum of every conn_state's sent_since_notice
  // Sets cs.sent_since_notice and keeps staged_total_ the sum. Loop thread.
  void set_staged(conn_state& cs, std::uint64_t bytes) noexcept {
    staged_total_ -= std::min(staged_total_, cs.sent_since_notice);
    cs.sent_since_notice = bytes;
    staged_total_ += bytes;
  }
  /// Whether a send staging bytes on `cs` asks for a "drained" notice: past
  /// the connection's high mark, or the pair's staged_budget; and at the end
  /// of a response while the pair has half its budget staged, so a
  /// connection's count does not stay stale once its bytes are written.
  [[nodiscard]] bool over_staged(const conn_state& cs,
                                 bool end_of_response = false) const noexcept {
    return cs.sent_since_notice >= options_.send_high_mark ||
           staged_total_ >= options_.staged_budget ||
           (end_of_response && cs.sent_since_notice != 0 &&
            staged_total_ >= options_.staged_budget / 2);
  }

  // ---- the staging gate (bridge_gate.cpp): while the pair has staged_budget
  // bytes staged, a body part bigger than gate_pass_size waits BEFORE its
  // bytes are copied (the app keeps its object; the server holds nothing
  // more), in arrival order, until disconnects and drained notices bring the
  // total back under the budget.
  static constexpr Py_ssize_t gate_pass_size = 4096;
  std::deque<request_object*> gated_;  // requests whose send() waits for the gate (strong)
  bool releasing_gate_ = false;        // release_gate() is staging a held message
  [[nodiscard]] bool gate_open() const noexcept {
    return releasing_gate_ || (gated_.empty() && staged_total_ < options_.staged_budget);
  }
  /// With the gate closed: a Future the send waits on (the message held), or
  /// NULL without an error when the message passes, NULL with one on failure.
  /// `body` is the message's body as send_body read it (null when absent).
  PyObject* wait_for_gate(request_object* r, PyObject* message, PyObject* body);
  /// Stages held messages in order while the pair is under staged_budget.
  void release_gate();
  /// With sends still held: cuts the connection that has waited for its
  /// "drained" notice the longest (its client reads slowest), whose
  /// disconnect then opens the gate. One per pass.
  void shed_stalled();
  // Drained notices asked for so far (orders conn_state::drain_asked).
  std::uint64_t drain_asks_ = 0;
  void ask_stale_counts();
  void asked_drain(conn_state& cs) noexcept {
    cs.waiting_drain = true;
    cs.drain_asked = ++drain_asks_;
  }
  /// Drops every held message (the bridge goes away).
  void drop_gate() noexcept;
};

/// Creates the Request, Ready and ClientDisconnected types for this
/// interpreter and adds them to `module`. Returns -1 with an exception set.
int add_types(PyObject* module);

}  // namespace cadeloop::pyhost::server
