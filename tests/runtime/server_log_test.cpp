// The server log as a user sees it: the bytes that reach file descriptor 2
// (redirected to a file here), the level filter, whole lines from many
// threads, and a forked child that can still write while the parent's
// threads are writing.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cadeloop/runtime/server_log.hpp"

namespace cadeloop::runtime {
namespace {

using server_log::log_level;

/// Points fd 2 at a fresh file for the test's lifetime and reads it back.
/// The level is process-wide: every test starts at info and leaves it there.
class server_log_test : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/cadeloop-server-log-XXXXXX";
    const int fd = ::mkstemp(name);
    ASSERT_GE(fd, 0);
    path_ = name;
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    ASSERT_GE(saved_, 0);
    ASSERT_EQ(::dup2(fd, STDERR_FILENO), STDERR_FILENO);
    ::close(fd);
    server_log::set_level(log_level::info);
  }

  void TearDown() override {
    server_log::set_level(log_level::info);
    std::fflush(stderr);
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    std::remove(path_.c_str());
  }

  std::string written() const {
    std::ifstream in{path_, std::ios::binary};
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  std::string path_;
  int saved_ = -1;
};

TEST_F(server_log_test, writes_the_prefixed_line_to_stderr_at_once) {
  server_log::write(log_level::info, "listening on http://127.0.0.1:8000");
  // Read back before anything flushes: the write is synchronous.
  EXPECT_EQ(written(), "cadeloop: listening on http://127.0.0.1:8000\n");
  server_log::write(log_level::error, "stats endpoint", "bad_alloc");
  EXPECT_EQ(written(),
            "cadeloop: listening on http://127.0.0.1:8000\n"
            "cadeloop: stats endpoint: bad_alloc\n");
}

TEST_F(server_log_test, a_traceback_keeps_its_lines_and_gets_the_prefix_once) {
  server_log::write(log_level::error,
                    "Exception in ASGI application\nTraceback:\n  x\nValueError: boom");
  EXPECT_EQ(written(),
            "cadeloop: Exception in ASGI application\nTraceback:\n  x\nValueError: boom\n");
}

TEST_F(server_log_test, the_level_defaults_to_info_and_filters) {
  EXPECT_EQ(server_log::level(), log_level::info);
  server_log::write(log_level::debug, "hidden at info");
  server_log::write(log_level::info, "shown at info");
  server_log::set_level(log_level::warning);
  EXPECT_EQ(server_log::level(), log_level::warning);
  server_log::write(log_level::info, "hidden at warning");
  server_log::write(log_level::warning, "shown at warning");
  server_log::write(log_level::error, "error", "shown at warning");
  server_log::set_level(log_level::error);
  server_log::write(log_level::warning, "hidden at error");
  server_log::write(log_level::critical, "shown at error");
  server_log::set_level(log_level::debug);
  server_log::write(log_level::debug, "shown at debug");
  EXPECT_EQ(written(),
            "cadeloop: shown at info\n"
            "cadeloop: shown at warning\n"
            "cadeloop: error: shown at warning\n"
            "cadeloop: shown at error\n"
            "cadeloop: shown at debug\n");
}

TEST(server_log_names, round_trip_and_refuse_unknown_names) {
  for (auto l : {log_level::debug, log_level::info, log_level::warning, log_level::error,
                 log_level::critical}) {
    EXPECT_EQ(server_log::level_from_name(server_log::level_name(l)), l);
  }
  EXPECT_EQ(server_log::level_name(log_level::warning), "warning");
  EXPECT_FALSE(server_log::level_from_name("warn").has_value());
  EXPECT_FALSE(server_log::level_from_name("INFO").has_value());
  EXPECT_FALSE(server_log::level_from_name("").has_value());
}

TEST_F(server_log_test, lines_from_many_threads_stay_whole) {
  constexpr int threads = 4;
  constexpr int per_thread = 2000;
  std::vector<std::thread> writers;
  for (int t = 0; t < threads; ++t) {
    writers.emplace_back([t] {
      const std::string filler(300, static_cast<char>('a' + t));  // past fmt's inline buffer
      for (int i = 0; i < per_thread; ++i) {
        server_log::write(log_level::info, "thread " + std::to_string(t), filler);
      }
    });
  }
  for (auto& w : writers) {
    w.join();
  }
  std::istringstream lines{written()};
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    ++count;
    ASSERT_EQ(line.size(), std::string{"cadeloop: thread 0: "}.size() + 300) << line;
    const char c = line.back();
    EXPECT_EQ(line, "cadeloop: thread " + std::to_string(c - 'a') + ": " + std::string(300, c));
  }
  EXPECT_EQ(count, threads * per_thread);
}

// Each child forked while two threads write without pause must still write
// its own line and exit. Without the pthread_atfork handlers a child often
// inherits the sink's mutex locked by a thread it does not have and hangs.
TEST_F(server_log_test, a_child_forked_while_threads_write_can_write) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (int t = 0; t < 2; ++t) {
    writers.emplace_back([&stop] {
      while (!stop.load(std::memory_order_relaxed)) {
        server_log::write(log_level::info, "parent thread");
      }
    });
  }
  constexpr int children = 200;
  int hung = 0;
  int failed = 0;
  for (int i = 0; i < children; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      server_log::write(log_level::warning, "child", std::to_string(i));
      ::_exit(0);
    }
    ASSERT_GT(pid, 0);
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    pid_t done = 0;
    while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (done == 0) {
      ++hung;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
    }
    if (hung > 0) {
      break;  // one is proof enough; do not spend 5 s on each of the rest
    }
  }
  stop.store(true);
  for (auto& w : writers) {
    w.join();
  }
  EXPECT_EQ(hung, 0) << "a forked child hung writing its line";
  EXPECT_EQ(failed, 0);
  const std::string text = written();
  for (int i = 0; i < children && hung == 0; ++i) {
    EXPECT_NE(text.find("cadeloop: child: " + std::to_string(i) + "\n"), std::string::npos) << i;
  }
}

}  // namespace
}  // namespace cadeloop::runtime
