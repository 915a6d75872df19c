# Core-pair tests: the rings with wakeups, and the I/O thread serving HTTP to
# a fake app thread over real sockets.
find_package(Boost 1.74 REQUIRED)

add_cadeloop_test(ring_test SOURCES ring_test.cpp DEPS cadeloop::runtime TIMEOUT 120)
add_cadeloop_test(core_pair_test
  SOURCES core_pair_test.cpp test_encoder.cpp
  DEPS cadeloop::runtime cadeloop::net cadeloop::http
  TIMEOUT 120)
# The per-pair stats page: histogram, percentiles, a MAP_SHARED region across
# fork, and a real pair counting into a region's page.
add_cadeloop_test(stats_page_test
  SOURCES stats_page_test.cpp test_encoder.cpp
  DEPS cadeloop::runtime cadeloop::net cadeloop::http
  TIMEOUT 120)
# The access log: a real pair writing JSON/default/template lines to a file
# through spdlog's async logger, and a full queue dropping instead of blocking.
add_cadeloop_test(access_log_test
  SOURCES access_log_test.cpp test_encoder.cpp
  DEPS cadeloop::runtime cadeloop::net cadeloop::http
  TIMEOUT 120)
