# Sources of the core pair (I/O side): rings, the I/O thread and the app-side
# endpoint. Included from runtime/CMakeLists.txt.
find_package(Boost 1.74 REQUIRED)
target_sources(cadeloop_runtime PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/core_pair.cpp
  ${CMAKE_CURRENT_LIST_DIR}/io_thread.cpp)
# moodycamel::ConcurrentQueue is header-only (Debian's libconcurrentqueue-dev,
# under /usr/include/concurrentqueue).
target_link_libraries(cadeloop_runtime PUBLIC cadeloop::net Boost::headers Threads::Threads)
