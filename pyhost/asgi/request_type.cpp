// The Python types of the ASGI bridge: cadeloop._core.Request (one HTTP
// request: the done callback of its task, its GC slots, its place in the
// bridge's live list), cadeloop._core.Ready (an already finished
// receive()/send() result) and ClientDisconnected, added to the module by
// add_types(). The Request's receive() and send() methods are in
// bridge_receive.cpp and bridge_send.cpp, beside what they call.
#include "asgi/request_type.hpp"

namespace cadeloop::pyhost::server {

namespace {

// --------------------------------------------------------------- ready awaitable

PyObject* ready_await(PyObject* self) {
  return Py_NewRef(self);
}

PyObject* ready_next(PyObject* self) {
  PyObject* v = reinterpret_cast<ready_object*>(self)->value;
  if (v != Py_None) {
    // StopIteration(value): wrapped in a tuple so a tuple value is not unpacked.
    PyObject* args = PyTuple_Pack(1, v);
    if (args != nullptr) {
      PyErr_SetObject(PyExc_StopIteration, args);
      Py_DECREF(args);
    }
  }
  return nullptr;  // no exception set: StopIteration(None)
}

void ready_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  Py_XDECREF(reinterpret_cast<ready_object*>(self)->value);
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyType_Slot ready_slots[] = {
    {Py_tp_doc, const_cast<char*>("An already finished ASGI receive()/send() result.")},
    {Py_tp_dealloc, reinterpret_cast<void*>(ready_dealloc)},
    {Py_am_await, reinterpret_cast<void*>(ready_await)},
    {Py_tp_iter, reinterpret_cast<void*>(ready_await)},
    {Py_tp_iternext, reinterpret_cast<void*>(ready_next)},
    {0, nullptr},
};

PyType_Spec ready_spec = {"cadeloop._core.Ready", static_cast<int>(sizeof(ready_object)), 0,
                          Py_TPFLAGS_DEFAULT, ready_slots};

// --------------------------------------------------------------- request object

request_object* as_request(PyObject* o) {
  return reinterpret_cast<request_object*>(o);
}

/// tp_call: the task's done callback (`task.add_done_callback(request)`).
PyObject* request_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  request_object* r = as_request(self);
  PyObject* task = nullptr;
  if ((kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) ||
      !PyArg_UnpackTuple(args, "request", 1, 1, &task)) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_TypeError, "request callback takes one task");
    }
    return nullptr;
  }
  if (r->owner == nullptr) {
    Py_CLEAR(r->task);
    Py_RETURN_NONE;
  }
  return r->owner->task_done(r, task);
}

int request_traverse(PyObject* self, visitproc visit, void* arg) {
  request_object* r = as_request(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(r->task);
  Py_VISIT(r->receive_waiter);
  Py_VISIT(r->send_waiter);
  Py_VISIT(r->start_headers);
  Py_VISIT(r->gated);
  Py_VISIT(r->receive_fn);
  Py_VISIT(r->send_fn);
  return 0;
}

int request_clear(PyObject* self) {
  request_object* r = as_request(self);
  Py_CLEAR(r->task);
  Py_CLEAR(r->receive_waiter);
  Py_CLEAR(r->send_waiter);
  Py_CLEAR(r->start_headers);
  Py_CLEAR(r->gated);
  Py_CLEAR(r->receive_fn);
  Py_CLEAR(r->send_fn);
  return 0;
}

void request_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  request_object* r = as_request(self);
  if (r->owner != nullptr) {
    r->owner->unlink(r);
  }
  request_clear(self);
  r->body.destroy();
  delete r->ws;
  r->encoder = nullptr;  // trivially destructible, in the object itself
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyType_Slot request_slots[] = {
    {Py_tp_doc,
     const_cast<char*>("One HTTP request served by cadeloop (owner of its receive/send).")},
    {Py_tp_dealloc, reinterpret_cast<void*>(request_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(request_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(request_clear)},
    {Py_tp_call, reinterpret_cast<void*>(request_call)},
    {0, nullptr},
};

PyType_Spec request_spec = {"cadeloop._core.Request", static_cast<int>(sizeof(request_object)), 0,
                            Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, request_slots};

}  // namespace

// Here, beside request_dealloc, its caller for every request that ends while
// the bridge lives.
void bridge::unlink(request_object* r) noexcept {
  if (r->live_prev != nullptr) {
    r->live_prev->live_next = r->live_next;
    r->live_next->live_prev = r->live_prev;
  }
  r->live_prev = r->live_next = nullptr;
  r->owner = nullptr;
}

// --------------------------------------------------------------- types

int add_types(PyObject* module) {
  PyObject* request_type = PyType_FromModuleAndSpec(module, &request_spec, nullptr);
  PyObject* ready_type = PyType_FromModuleAndSpec(module, &ready_spec, nullptr);
  PyObject* disconnected = PyErr_NewExceptionWithDoc(
      "cadeloop._core.ClientDisconnected",
      "Raised by an ASGI send() when the client has gone (an OSError, as ASGI spec 2.4 asks).",
      PyExc_OSError, nullptr);
  const bool ok = request_type != nullptr && ready_type != nullptr && disconnected != nullptr &&
                  add_app_task_type(module) == 0 &&
                  PyModule_AddObjectRef(module, "Request", request_type) == 0 &&
                  PyModule_AddObjectRef(module, "Ready", ready_type) == 0 &&
                  PyModule_AddObjectRef(module, "ClientDisconnected", disconnected) == 0;
  Py_XDECREF(request_type);
  Py_XDECREF(ready_type);
  Py_XDECREF(disconnected);
  return ok ? 0 : -1;
}

}  // namespace cadeloop::pyhost::server
