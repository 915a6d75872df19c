# cmake -DINPUT=page.html -DOUTPUT=page.cpp -P embed_dashboard.cmake
# Writes stats_dashboard_html() returning INPUT's bytes (see stats_endpoint.cmake).
file(READ "${INPUT}" _html)
set(_delim "cadeloop_html")  # at most 16 characters
string(FIND "${_html}" ")${_delim}\"" _clash)
if(NOT _clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw string delimiter )${_delim}\"")
endif()
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by embed_dashboard.cmake; do not edit.\n"
  "#include <cadeloop/runtime/stats/stats_endpoint.hpp>\n\n"
  "namespace cadeloop::runtime {\n\n"
  "std::string_view stats_dashboard_html() noexcept {\n"
  "  static constexpr std::string_view page = R\"${_delim}(${_html})${_delim}\";\n"
  "  return page;\n"
  "}\n\n"
  "}  // namespace cadeloop::runtime\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
