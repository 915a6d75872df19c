# Core-pair tests: the rings with wakeups, and the I/O thread serving HTTP to
# a fake app thread over real sockets.
find_package(Boost 1.74 REQUIRED)

add_cadeloop_test(ring_test SOURCES ring_test.cpp DEPS cadeloop::runtime TIMEOUT 120)
add_cadeloop_test(core_pair_test
  SOURCES core_pair_test.cpp test_encoder.cpp
  DEPS cadeloop::runtime cadeloop::net cadeloop::http
  TIMEOUT 120)
