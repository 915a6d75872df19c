# The stats endpoint (/stats, /metrics, /healthz, /readyz and the dashboard).
# Included from runtime/CMakeLists.txt.
#
# The dashboard is one HTML file, embedded into the library as a raw string
# literal generated at build time, so editing the page needs no CMake re-run
# and the binary needs no file at run time.
set(_stats_html ${CMAKE_CURRENT_LIST_DIR}/stats_dashboard.html)
set(_stats_html_cpp ${CMAKE_CURRENT_BINARY_DIR}/stats_dashboard_html.cpp)
add_custom_command(
  OUTPUT ${_stats_html_cpp}
  COMMAND ${CMAKE_COMMAND} -DINPUT=${_stats_html} -DOUTPUT=${_stats_html_cpp}
          -P ${CMAKE_CURRENT_LIST_DIR}/embed_dashboard.cmake
  DEPENDS ${_stats_html} ${CMAKE_CURRENT_LIST_DIR}/embed_dashboard.cmake
  COMMENT "Embedding the stats dashboard"
  VERBATIM)
target_sources(cadeloop_runtime PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/stats_endpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stats_render.cpp
  ${_stats_html_cpp})
