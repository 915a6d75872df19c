// The settings table and its resolver, for cadeloop.config and the CLI.
//
// Every function here runs on the calling Python thread with the GIL held and
// keeps no Python object beyond the call (SettingError lives in the module's
// own namespace, looked up when raised, so each interpreter has its own).
#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>

#include <cadeloop/config/settings.hpp>

#include "config_values.hpp"
#include "register.hpp"

namespace cadeloop::pyhost {

namespace py = pybind11;
namespace cfg = cadeloop::config;

namespace {

const char* kind_name(cfg::kind k) {
  switch (k) {
    case cfg::kind::integer:
      return "int";
    case cfg::kind::size:
      return "size";
    case cfg::kind::duration:
      return "duration";
    case cfg::kind::number:
      return "float";
    case cfg::kind::boolean:
      return "bool";
    case cfg::kind::string:
      return "str";
    case cfg::kind::choice:
      return "choice";
  }
  return "?";
}

const char* error_kind_name(cfg::error_kind k) {
  switch (k) {
    case cfg::error_kind::unknown_name:
      return "unknown";
    case cfg::error_kind::invalid:
      return "invalid";
    case cfg::error_kind::out_of_range:
      return "out_of_range";
    case cfg::error_kind::file:
      return "file";
  }
  return "?";
}

/// Runs `f`, turning a refused setting into SettingError.
template <class F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const cfg::setting_error& e) {
    raise_setting_error(e);
  }
}

py::list table() {
  py::list out;
  for (const cfg::setting& s : cfg::settings()) {
    py::dict row;
    row["name"] = std::string(s.name);
    row["kind"] = kind_name(s.type);
    row["default"] = to_python(cfg::default_value(s));
    row["default_text"] = std::string(s.default_text);
    const bool integral = s.type == cfg::kind::integer || s.type == cfg::kind::size;
    const bool real = s.type == cfg::kind::duration || s.type == cfg::kind::number;
    row["min"] = integral ? py::object(py::int_(s.min_int))
                 : real   ? py::object(py::float_(s.min_real))
                          : py::object(py::none());
    row["max"] = integral ? py::object(py::int_(s.max_int))
                 : real   ? py::object(py::float_(s.max_real))
                          : py::object(py::none());
    row["min_text"] = (integral || real)
                          ? py::object(py::str(cfg::format_value(
                                s, integral ? cfg::value{s.min_int} : cfg::value{s.min_real})))
                          : py::object(py::none());
    row["max_text"] = (integral || real)
                          ? py::object(py::str(cfg::format_value(
                                s, integral ? cfg::value{s.max_int} : cfg::value{s.max_real})))
                          : py::object(py::none());
    row["nullable"] = s.nullable;
    row["none_means"] = std::string(s.none_means);
    py::list choices;
    for (const std::string_view c : s.choices) {
      choices.append(py::str(std::string(c)));
    }
    row["choices"] = choices;
    row["unit"] = std::string(s.unit);
    row["section"] = std::string(s.section);
    row["doc"] = std::string(s.doc);
    row["flag"] = cfg::flag_name(s);
    py::list aliases;
    for (std::string_view rest = s.flag_aliases; !rest.empty();) {
      const std::size_t end = std::min(rest.find(' '), rest.size());
      aliases.append(py::str(std::string(rest.substr(0, end))));
      rest.remove_prefix(std::min(end + 1, rest.size()));
    }
    row["aliases"] = aliases;
    row["off_flag"] =
        s.off_flag.empty() ? py::object(py::none()) : py::str(std::string(s.off_flag));
    out.append(row);
  }
  return out;
}

py::list not_settings() {
  py::list out;
  for (const std::string_view n : cfg::environment_names_not_settings()) {
    out.append(py::str(std::string(n)));
  }
  return out;
}

py::object check_setting(const std::string& name, const py::handle& v, const py::object& where) {
  return guarded([&] {
    const cfg::setting& s = cfg::require_setting(name);
    const std::string w = where.is_none() ? name : where.cast<std::string>();
    return to_python(cfg::accept(s, typed_input_from(v), w));
  });
}

std::string format_setting(const std::string& name, const py::handle& v, bool toml) {
  return guarded([&] {
    const cfg::setting& s = cfg::require_setting(name);
    const cfg::value value = cfg::accept(s, typed_input_from(v), name);
    return toml ? cfg::format_toml(s, value) : cfg::format_value(s, value);
  });
}

py::list resolve(const py::object& file, const py::object& environ, const std::string& prefix,
                 const std::vector<std::pair<std::string, std::string>>& flags,
                 const py::object& arguments, const std::string& arguments_origin) {
  return guarded([&] {
    std::vector<std::vector<cfg::assignment>> layers;
    if (!file.is_none()) {
      layers.push_back(cfg::load_toml_file(py::str(file).cast<std::string>()));
    }
    if (!environ.is_none()) {
      std::vector<std::pair<std::string, std::string>> vars;
      for (const auto& item : environ.attr("items")()) {
        const auto pair = item.cast<py::tuple>();
        vars.emplace_back(pair[0].cast<std::string>(), pair[1].cast<std::string>());
      }
      layers.push_back(cfg::read_environment(vars, prefix));
    }
    std::vector<cfg::assignment> flag_layer;
    for (const auto& [flag, text] : flags) {
      flag_layer.push_back(cfg::read_flag(flag, text));
    }
    layers.push_back(std::move(flag_layer));
    std::vector<cfg::assignment> argument_layer;
    if (!arguments.is_none()) {
      for (const auto& [key, v] : arguments.cast<py::dict>()) {
        const std::string name = key.cast<std::string>();
        const cfg::setting& s = cfg::require_setting(name);
        argument_layer.push_back({&s, cfg::accept(s, typed_input_from(v), name), arguments_origin});
      }
    }
    layers.push_back(std::move(argument_layer));
    py::list out;
    for (const cfg::resolved_setting& r : cfg::resolve(layers)) {
      out.append(py::make_tuple(std::string(r.def->name), to_python(r.v), r.origin));
    }
    return out;
  });
}

}  // namespace

[[noreturn]] void raise_setting_error(const cfg::setting_error& e) {
  py::object type = py::module_::import("cadeloop._core").attr("SettingError");
  py::object exc = type(py::str(e.what()));
  exc.attr("kind") = py::str(error_kind_name(e.kind()));
  PyErr_SetObject(type.ptr(), exc.ptr());
  throw py::error_already_set();
}

py::object to_python(const cfg::value& v) {
  if (const auto* b = std::get_if<bool>(&v)) {
    return py::bool_(*b);
  }
  if (const auto* i = std::get_if<std::int64_t>(&v)) {
    return py::int_(*i);
  }
  if (const auto* d = std::get_if<double>(&v)) {
    return py::float_(*d);
  }
  if (const auto* s = std::get_if<std::string>(&v)) {
    return py::str(*s);
  }
  return py::none();
}

cfg::typed_input typed_input_from(const py::handle& obj) {
  if (obj.is_none()) {
    return std::monostate{};
  }
  if (PyBool_Check(obj.ptr())) {
    return obj.ptr() == Py_True;
  }
  if (PyLong_Check(obj.ptr())) {
    int overflow = 0;
    const long long n = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
    if (overflow == 0 && !(n == -1 && PyErr_Occurred())) {
      return static_cast<std::int64_t>(n);
    }
    PyErr_Clear();
  } else if (PyFloat_Check(obj.ptr())) {
    return PyFloat_AsDouble(obj.ptr());
  } else if (PyUnicode_Check(obj.ptr())) {
    return obj.cast<std::string>();
  }
  return cfg::foreign{py::repr(obj).cast<std::string>()};
}

void register_config(py::module_& m) {
  PyObject* error = PyErr_NewExceptionWithDoc(
      "cadeloop._core.SettingError",
      "A refused setting: str(e) is the one line for the user (naming the file and line, the "
      "variable or the flag); e.kind is 'unknown', 'invalid', 'out_of_range' or 'file'.",
      PyExc_ValueError, nullptr);
  if (error == nullptr) {
    throw py::error_already_set();
  }
  m.attr("SettingError") = py::reinterpret_steal<py::object>(error);

  m.def("settings_table", &table,
        "Every setting as a dict (name, kind, default, min, max, nullable, choices, unit, "
        "section, doc, flag), in the reference's order.");
  m.def("environment_names_not_settings", &not_settings,
        "Names after the prefix that are not settings (CONFIG names the TOML file).");
  m.def("check_setting", &check_setting, py::arg("name"), py::arg("value"),
        py::arg("where") = py::none(),
        "The value of setting `name` that `value` gives (\"16MiB\" -> 16777216), or SettingError "
        "whose line starts with `where` (default: the name).");
  m.def(
      "format_setting",
      [](const std::string& name, const py::handle& v, bool toml) {
        return format_setting(name, v, toml);
      },
      py::arg("name"), py::arg("value"), py::arg("toml") = false,
      "`value` written as the setting is written on the command line (\"1GiB\", \"5s\"), or as "
      "a TOML value.");
  m.def("resolve_settings", &resolve, py::arg("file") = py::none(), py::arg("environ") = py::none(),
        py::arg("prefix") = "CADELOOP_",
        py::arg("flags") = std::vector<std::pair<std::string, std::string>>{},
        py::arg("arguments") = py::none(), py::arg("arguments_origin") = "serve()",
        "Every setting as (name, value, origin): defaults < TOML `file` < `environ` (variables "
        "starting with `prefix`) < `flags` ((flag, text) pairs) < `arguments` (keyword values). "
        "Raises SettingError with one line.");
}

}  // namespace cadeloop::pyhost
