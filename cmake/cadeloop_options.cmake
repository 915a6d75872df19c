# Warnings and sanitizers shared by every cadeloop target.

add_library(cadeloop_warnings INTERFACE)
target_compile_options(cadeloop_warnings INTERFACE
  -Wall -Wextra -Wconversion -Wsign-conversion -Wshadow -Wnon-virtual-dtor
  $<$<BOOL:${CADELOOP_WERROR}>:-Werror>)

add_library(cadeloop_sanitize INTERFACE)
if(CADELOOP_SANITIZE)
  string(REPLACE "," ";" _cadeloop_sans "${CADELOOP_SANITIZE}")
  foreach(_san IN LISTS _cadeloop_sans)
    if(NOT _san MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "CADELOOP_SANITIZE: unknown sanitizer '${_san}' (address, undefined, thread)")
    endif()
  endforeach()
  string(REPLACE ";" "," _cadeloop_san_flag "${_cadeloop_sans}")
  # Abort on the first finding so a sanitizer report always fails the test.
  set(_cadeloop_san_opts -fsanitize=${_cadeloop_san_flag} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_compile_options(${_cadeloop_san_opts} -g)
  add_link_options(-fsanitize=${_cadeloop_san_flag})
endif()

# add_cadeloop_library(name SOURCES ... DEPS ...): one library per top-level folder,
# public headers under <folder>/include/cadeloop/<folder>/.
function(add_cadeloop_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  if(ARG_SOURCES)
    add_library(cadeloop_${name} STATIC ${ARG_SOURCES})
    target_include_directories(cadeloop_${name} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
    target_link_libraries(cadeloop_${name} PUBLIC ${ARG_DEPS} PRIVATE cadeloop_warnings)
  else()
    add_library(cadeloop_${name} INTERFACE)
    target_include_directories(cadeloop_${name} INTERFACE ${CMAKE_CURRENT_SOURCE_DIR}/include)
    target_link_libraries(cadeloop_${name} INTERFACE ${ARG_DEPS})
  endif()
  add_library(cadeloop::${name} ALIAS cadeloop_${name})
endfunction()

if(CADELOOP_BUILD_FUZZ)
  # Coverage instrumentation for every target, so libFuzzer sees inside the libraries.
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
