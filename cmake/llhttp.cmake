# llhttp: its generated C sources come from a PyPI source distribution, pinned
# by version and sha256, fetched by name with pip at configure time. Nothing of
# llhttp is committed to the tree.
#
# The httptools sdist carries llhttp's generated C under vendor/llhttp
# (httptools 0.9.0 holds llhttp 9.4.3; the `llhttp` sdist 9.3.0.0 holds 9.3.0).

set(CADELOOP_LLHTTP_SDIST_NAME "httptools" CACHE STRING "PyPI sdist that carries llhttp's C sources")
set(CADELOOP_LLHTTP_SDIST_VERSION "0.9.0" CACHE STRING "Its version")
set(CADELOOP_LLHTTP_SDIST_SHA256 "d484ebb7e3a3f3597b0f645fbd1b85633674ca808c1f5ba11c2caf7c66f5c8b6"
    CACHE STRING "sha256 of that sdist")
set(CADELOOP_LLHTTP_EXPECTED_VERSION "9.4.3")

set(_sdist_base "${CADELOOP_LLHTTP_SDIST_NAME}-${CADELOOP_LLHTTP_SDIST_VERSION}")
set(_sdist_file "${CADELOOP_DEPS_DIR}/${_sdist_base}.tar.gz")

function(_cadeloop_llhttp_verify out)
  if(EXISTS "${_sdist_file}")
    file(SHA256 "${_sdist_file}" _got)
    if(_got STREQUAL CADELOOP_LLHTTP_SDIST_SHA256)
      set(${out} TRUE PARENT_SCOPE)
      return()
    endif()
    message(WARNING "llhttp: ${_sdist_file} has sha256 ${_got}, expected ${CADELOOP_LLHTTP_SDIST_SHA256}; fetching again")
    file(REMOVE "${_sdist_file}")
  endif()
  set(${out} FALSE PARENT_SCOPE)
endfunction()

_cadeloop_llhttp_verify(_ok)
if(NOT _ok)
  # Any interpreter with pip will do; prefer the one the build runs under.
  find_program(_cadeloop_py NAMES python3 python)
  set(_py "${Python_EXECUTABLE}")
  if(NOT _py)
    set(_py "${_cadeloop_py}")
  endif()
  file(MAKE_DIRECTORY "${CADELOOP_DEPS_DIR}")
  message(STATUS "llhttp: pip download ${CADELOOP_LLHTTP_SDIST_NAME}==${CADELOOP_LLHTTP_SDIST_VERSION}")
  # Inside a wheel build (pip's isolated build environment) PYTHONPATH points
  # at an overlay that hides the interpreter's own site-packages, pip included:
  # run pip without it.
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE
            "${_py}" -m pip download --quiet --no-deps --no-binary=:all:
            "${CADELOOP_LLHTTP_SDIST_NAME}==${CADELOOP_LLHTTP_SDIST_VERSION}" -d "${CADELOOP_DEPS_DIR}"
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  _cadeloop_llhttp_verify(_ok)
  if(NOT _ok)
    message(FATAL_ERROR "llhttp: could not obtain ${_sdist_base}.tar.gz with the pinned sha256 (pip exit ${_rc}):\n${_err}")
  endif()
endif()

set(_src_root "${CMAKE_BINARY_DIR}/_deps/llhttp")
set(_stamp "${_src_root}/.extracted-${CADELOOP_LLHTTP_SDIST_SHA256}")
if(NOT EXISTS "${_stamp}")
  file(REMOVE_RECURSE "${_src_root}")
  file(ARCHIVE_EXTRACT INPUT "${_sdist_file}" DESTINATION "${_src_root}"
       PATTERNS "${_sdist_base}/vendor/llhttp/*")
  file(TOUCH "${_stamp}")
endif()
set(_llhttp_dir "${_src_root}/${_sdist_base}/vendor/llhttp")

file(STRINGS "${_llhttp_dir}/include/llhttp.h" _ver_lines REGEX "#define LLHTTP_VERSION_(MAJOR|MINOR|PATCH) ")
string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3" _llhttp_version "${_ver_lines}")
if(NOT _llhttp_version STREQUAL CADELOOP_LLHTTP_EXPECTED_VERSION)
  message(FATAL_ERROR "llhttp: expected version ${CADELOOP_LLHTTP_EXPECTED_VERSION}, the sdist holds ${_llhttp_version}")
endif()
message(STATUS "llhttp ${_llhttp_version} from ${_sdist_base}")

add_library(cadeloop_llhttp STATIC
  "${_llhttp_dir}/src/api.c" "${_llhttp_dir}/src/http.c" "${_llhttp_dir}/src/llhttp.c")
# Third-party C: its own warnings are not ours to fix.
target_include_directories(cadeloop_llhttp SYSTEM PUBLIC "${_llhttp_dir}/include")
set_target_properties(cadeloop_llhttp PROPERTIES C_STANDARD 99 POSITION_INDEPENDENT_CODE ON)
target_compile_options(cadeloop_llhttp PRIVATE -w -O2)
# llhttp's generated C scans header values and tokens 16 bytes at a time with
# SSE4.2 when the compiler targets it: about 22 % fewer instructions for a
# typical browser request (callgrind, 4967 -> 3847 per request). Every x86-64
# CPU since 2009 has SSE4.2; turn the option off to build for older ones.
option(CADELOOP_LLHTTP_SSE42 "Build llhttp with SSE4.2 on x86-64" ON)
if(CADELOOP_LLHTTP_SSE42 AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  target_compile_options(cadeloop_llhttp PRIVATE -msse4.2)
endif()
add_library(llhttp::llhttp ALIAS cadeloop_llhttp)
