// The access log: a real core pair writing one line per request through
// spdlog's asynchronous logger into a file (JSON lines parsed back, the
// default and template formats), format checking, and a full queue that drops
// and counts lines instead of blocking.

#include "fake_app.hpp"
#include "pair_fixture.hpp"
#include "test_json.hpp"
#include "test_client.hpp"

#include <cadeloop/net/access_log.hpp>
#include <cadeloop/runtime/core_pair.hpp>

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono_literals;
using cadeloop::net::access_log;
using cadeloop::net::access_log_options;
using cadeloop::net::check_access_log_format;
using cadeloop::net::flush_access_logs;
using cadeloop::test::http_response;
using cadeloop::test::eventually;
using cadeloop::test::test_client;
using cadeloop::test::json;
using cadeloop::test::try_parse_json;

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in{path};
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    out.push_back(line);
  }
  return out;
}

std::string temp_path(const char* name) {
  const char* dir = std::getenv("TMPDIR");
  std::string p = std::string{dir != nullptr ? dir : "/tmp"} + "/cadeloop-" + name + "-" +
                  std::to_string(::getpid());
  std::remove(p.c_str());
  return p;
}

// ---------------------------------------------------------------- a pair with a log

class access_log_pair : public cadeloop::test::pair_fixture {
 protected:
  void SetUp() override {
    pair_fixture::SetUp();
    opt.index = 3;
    opt.server.access_log.enabled = true;
  }

  void TearDown() override {
    pair_fixture::TearDown();
    if (!path.empty()) {
      std::remove(path.c_str());
    }
  }

  std::string path;
};

TEST_F(access_log_pair, TenThousandRequestsGiveTenThousandJsonLines) {
  path = temp_path("access.jsonl");
  opt.server.access_log.file = path;
  opt.server.access_log.format = "json:user-agent,x-missing";
  start();

  constexpr int connections = 4;
  constexpr int per_connection = 2500;
  constexpr int batch = 10;  // pipelined requests per write
  const std::string agent = "probe/1.0 \"quoted\" \\ caf\xc3\xa9 \xff";
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int k = 0; k < connections; ++k) {
    clients.emplace_back([&, k] {
      test_client c = client();
      if (!c.connected()) {
        return;
      }
      for (int i = 0; i < per_connection; i += batch) {
        std::string requests;
        for (int j = i; j < i + batch; ++j) {
          requests += "GET /r" + std::to_string(k) + "?i=" + std::to_string(j) +
                      " HTTP/1.1\r\nHost: t\r\nUser-Agent: " + agent + "\r\n\r\n";
        }
        if (!c.send(requests)) {
          return;
        }
        for (int j = 0; j < batch; ++j) {
          if (c.read_response().status == 200) {
            ok.fetch_add(1);
          }
        }
      }
    });
  }
  for (std::thread& t : clients) {
    t.join();
  }
  constexpr int total = connections * per_connection;
  ASSERT_EQ(ok.load(), total);
  ASSERT_TRUE(eventually([&] { return pair->stats().responses == total; }, 20s));
  ASSERT_TRUE(flush_access_logs(20s));
  EXPECT_EQ(pair->stats().access_log_dropped, 0u);

  const std::vector<std::string> lines = read_lines(path);
  ASSERT_EQ(lines.size(), static_cast<std::size_t>(total));
  std::vector<int> seen(static_cast<std::size_t>(total), 0);
  for (const std::string& line : lines) {
    const std::optional<json> doc = try_parse_json(line);
    ASSERT_TRUE(doc) << "not one JSON object: " << line;
    ASSERT_TRUE(doc->is_object());
    const json* status = doc->get("status");
    const json* method = doc->get("method");
    const json* p = doc->get("path");
    const json* query = doc->get("query");
    const json* pair_index = doc->get("pair");
    const json* duration = doc->get("duration_us");
    const json* bytes = doc->get("bytes");
    const json* client_addr = doc->get("client");
    const json* time = doc->get("time");
    const json* headers = doc->get("headers");
    ASSERT_TRUE(status && method && p && query && pair_index && duration && bytes && client_addr &&
                time && headers)
        << line;
    EXPECT_EQ(status->num(), 200);
    EXPECT_EQ(method->str(), "GET");
    EXPECT_EQ(pair_index->num(), 3);
    EXPECT_GE(duration->num(), 0);
    EXPECT_GT(bytes->num(), 0);
    EXPECT_EQ(client_addr->str().rfind("127.0.0.1:", 0), 0u) << line;
    EXPECT_EQ(time->str().size(), 24u) << line;  // 2024-05-01T12:00:00.123Z
    ASSERT_TRUE(headers->is_object());
    const json* ua = headers->get("user-agent");
    const json* missing = headers->get("x-missing");
    ASSERT_TRUE(ua && missing);
    // The invalid UTF-8 byte 0xff comes back as U+00FF; the rest as sent.
    EXPECT_EQ(ua->str(), "probe/1.0 \"quoted\" \\ caf\xc3\xa9 \xc3\xbf");
    EXPECT_TRUE(missing->is_null());
    // Every request exactly once: path /rK, query i=J.
    ASSERT_EQ(p->str().size(), 3u);
    const int k = p->str()[2] - '0';
    ASSERT_EQ(query->str().rfind("i=", 0), 0u);
    const int j = std::stoi(query->str().substr(2));
    ASSERT_TRUE(k >= 0 && k < connections && j >= 0 && j < per_connection) << line;
    ++seen[static_cast<std::size_t>(k * per_connection + j)];
  }
  for (std::size_t i = 0; i < seen.size(); ++i) {
    ASSERT_EQ(seen[i], 1) << "request " << i;
  }
}

TEST_F(access_log_pair, DefaultFormatAndTheIoThreadsOwnAnswers) {
  path = temp_path("access.log");
  opt.server.access_log.file = path;
  start();
  test_client c = client();
  ASSERT_TRUE(c.send("GET /a?x=1 HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_EQ(c.read_response().status, 200);
  ASSERT_TRUE(c.send("HEAD /b%20c HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_EQ(c.read_response(true).status, 200);
  test_client bad = client();
  ASSERT_TRUE(bad.send("GARBAGE\r\n\r\n"));
  ASSERT_EQ(bad.read_response().status, 400);
  ASSERT_TRUE(eventually(
      [&] { return pair->stats().protocol_errors == 1 && pair->stats().responses == 2; }, 20s));
  ASSERT_TRUE(flush_access_logs(10s));

  const std::vector<std::string> lines = read_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  // 2024-05-01T12:00:00.123Z 127.0.0.1:50312 "GET /a?x=1" 200 34 87us pair=3
  auto check = [](const std::string& line, const std::string& request, const std::string& status) {
    SCOPED_TRACE(line);
    ASSERT_GT(line.size(), 25u);
    EXPECT_EQ(line[4], '-');
    EXPECT_EQ(line[10], 'T');
    EXPECT_EQ(line[23], 'Z');
    EXPECT_EQ(line.substr(25, 10), "127.0.0.1:");
    EXPECT_NE(line.find(" \"" + request + "\" " + status + " "), std::string::npos);
    EXPECT_NE(line.find("us pair=3"), std::string::npos);
  };
  // The 400 may be logged before or after the others (another connection).
  std::string error_line;
  std::vector<std::string> app_lines;
  for (const std::string& l : lines) {
    if (l.find("\"- -\"") != std::string::npos) {
      error_line = l;
    } else {
      app_lines.push_back(l);
    }
  }
  ASSERT_EQ(app_lines.size(), 2u);
  check(app_lines[0], "GET /a?x=1", "200");
  check(app_lines[1], "HEAD /b%20c", "200");
  check(error_line, "- -", "400");
  EXPECT_NE(error_line.find(" 0us pair=3"), std::string::npos);
}

TEST_F(access_log_pair, TemplateFieldsHeadersAndEscaping) {
  path = temp_path("access-custom.log");
  opt.server.access_log.file = path;
  opt.server.access_log.format =
      R"({client} "{method} {path}" q={query} {status} {bytes} {duration_us}us {duration_ms}ms {header:User-Agent} {header:x-none} {{pair {pair}}})";
  start();
  test_client c = client();
  ASSERT_TRUE(c.send("GET /x HTTP/1.1\r\nHost: t\r\nUser-Agent: a\"b\tc\r\n\r\n"));
  const http_response r = c.read_response();
  ASSERT_EQ(r.status, 200);
  ASSERT_TRUE(eventually([&] { return pair->stats().responses == 1; }, 20s));
  ASSERT_TRUE(flush_access_logs(10s));
  const std::vector<std::string> lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  const std::string& line = lines[0];
  EXPECT_EQ(line.rfind("127.0.0.1:", 0), 0u) << line;
  EXPECT_NE(line.find(R"( "GET /x" q= 200 )"), std::string::npos) << line;
  EXPECT_NE(line.find(R"(ms a\x22b\x09c - {pair 3})"), std::string::npos) << line;
}

// A pair's lines reach the file without anyone asking: the collector takes
// the I/O thread's batch within 50 ms of its first line.
TEST_F(access_log_pair, LinesAreWrittenWhenThePairGoesIdle) {
  path = temp_path("access-idle.log");
  opt.server.access_log.file = path;
  start();
  test_client c = client();
  ASSERT_TRUE(c.send("GET /idle HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_EQ(c.read_response().status, 200);
  ASSERT_TRUE(eventually([&] { return read_lines(path).size() == 1; }, 10s))
      << read_lines(path).size() << " lines";
  EXPECT_NE(read_lines(path)[0].find("\"GET /idle\" 200 "), std::string::npos);
}

// flush_access_logs() also takes what an I/O thread has not handed over yet
// (it hands over only at 64 KiB; the collector after 50 ms): here a log
// written to and never flushed by its own thread, flushed at once.
TEST(access_log_flush, TakesTheBatchOfALogThatNeverFlushed) {
  const std::string path = temp_path("access-batch.log");
  access_log_options o;
  o.enabled = true;
  o.file = path;
  o.format = "{client} {status}";
  std::atomic<bool> written{false};
  std::atomic<bool> done{false};
  std::thread io{[&] {
    access_log log{o};
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(log.write({}, std::string{"c"}.append(std::to_string(i)), 200, 1, 1), 0u);
    }
    written = true;
    while (!done) {
      std::this_thread::sleep_for(1ms);
    }
  }};
  ASSERT_TRUE(eventually([&] { return written.load(); }, 10s));
  ASSERT_TRUE(flush_access_logs(10s));
  const std::vector<std::string> lines = read_lines(path);
  done = true;
  io.join();
  EXPECT_EQ(lines, (std::vector<std::string>{"c0 200", "c1 200", "c2 200"}));
  std::remove(path.c_str());
}

// Two processes (process mode: one per pair) append to one file: every line
// reaches it whole, never cut by the other's write. Each child writes 40,000
// 140-byte lines, handing over every 100 (an I/O pass), so the file's buffer
// fills many times while the other child writes.
std::string shared_line(int child, int i, const std::string& pad) {
  std::string s{"p"};
  s.append(std::to_string(child)).append("-").append(std::to_string(i)).append("-").append(pad);
  return s;
}

TEST(access_log_file, TwoProcessesAppendingNeverCutALine) {
  const std::string path = temp_path("access-shared.log");
  constexpr int per_child = 40000;
  const std::string pad(120, 'x');
  std::vector<pid_t> children;
  for (int c = 0; c < 2; ++c) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::alarm(60);
      access_log_options o;
      o.enabled = true;
      o.file = path;
      o.format = "{client} {status}";
      o.queue_lines = 2 * per_child;  // room for every line: none dropped
      bool ok = true;
      {
        access_log log{o};
        for (int i = 0; i < per_child; ++i) {
          const std::string client = shared_line(c, i, pad);
          ok = ok && log.write({}, client, 200, 1, 1) == 0;
          if (i % 100 == 99) {
            ok = ok && log.flush() == 0;
          }
        }
      }
      ok = ok && flush_access_logs(30s);
      ::_exit(ok ? 0 : 12);
    }
    children.push_back(child);
  }
  for (const pid_t child : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  const std::vector<std::string> lines = read_lines(path);
  std::vector<std::vector<int>> seen(2, std::vector<int>(per_child, 0));
  std::size_t bad = 0;
  std::string first_bad;
  for (const std::string& line : lines) {
    int c = -1;
    int i = -1;
    char tail[200] = {};
    const bool shaped = std::sscanf(line.c_str(), "p%d-%d-%199s", &c, &i, tail) == 3 &&
                        (c == 0 || c == 1) && i >= 0 && i < per_child &&
                        line == shared_line(c, i, pad).append(" 200");
    if (!shaped) {
      if (bad++ == 0) {
        first_bad = line.substr(0, 300);
      }
      continue;
    }
    ++seen[static_cast<std::size_t>(c)][static_cast<std::size_t>(i)];
  }
  EXPECT_EQ(bad, 0u) << "first cut line: " << first_bad;
  EXPECT_EQ(lines.size(), 2u * per_child);
  for (int c = 0; c < 2; ++c) {
    EXPECT_EQ(std::count(seen[static_cast<std::size_t>(c)].begin(),
                         seen[static_cast<std::size_t>(c)].end(), 1),
              per_child)
        << "child " << c;
  }
  std::remove(path.c_str());
}

// ---------------------------------------------------------------- formats and failures

TEST(access_log_format, ChecksFieldsAndBraces) {
  EXPECT_EQ(check_access_log_format(""), "");
  EXPECT_EQ(check_access_log_format("default"), "");
  EXPECT_EQ(check_access_log_format("json"), "");
  EXPECT_EQ(check_access_log_format("json:user-agent, X-Request-Id"), "");
  EXPECT_EQ(check_access_log_format("{client} {{literal}} {header:referer}"), "");
  EXPECT_NE(check_access_log_format("{usr}").find("unknown field {usr}"), std::string::npos);
  EXPECT_NE(check_access_log_format("{client").find("'{' without its '}'"), std::string::npos);
  EXPECT_NE(check_access_log_format("client}").find("'}' without its '{'"), std::string::npos);
  EXPECT_NE(check_access_log_format("{header:}").find("empty header name"), std::string::npos);
  EXPECT_NE(check_access_log_format("json:bad name").find("not a header name"), std::string::npos);
}

TEST(access_log_open, UnopenableFileIsOneLineNamingTheSetting) {
  access_log_options o;
  o.enabled = true;
  o.file = "/nonexistent-dir/access.log";
  try {
    access_log log{o};
    FAIL() << "opened";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(
        std::string{e.what()},
        "access_log_file: cannot open '/nonexistent-dir/access.log': No such file or directory");
  }
  o.file.clear();
  o.format = "{nope}";
  EXPECT_THROW(access_log{o}, std::invalid_argument);
}

// A writer stuck on a pipe nobody reads: the queue fills, and then lines are
// dropped (and the caller told) at once, never waited for. In a child
// process, whose first log sets a small queue (and whose stuck pool thread
// must not be joined at exit).
TEST(access_log_queue, FullQueueDropsInsteadOfBlocking) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(20);  // a blocked writer would hang the child: fail it instead
    int fds[2];
    if (::pipe(fds) != 0) {
      ::_exit(10);
    }
    access_log_options o;
    o.enabled = true;
    o.queue_lines = 256;
    o.file = "/proc/self/fd/" + std::to_string(fds[1]);
    o.format = "{client}";
    access_log log{o};
    const std::string client(1000, 'c');  // 1000-byte lines
    std::size_t dropped = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 5000; ++i) {
      dropped += log.write({}, client, 200, 10, 5);
      if (i % 4 == 3) {
        dropped += log.flush();  // the end of an I/O pass
      }
    }
    dropped += log.flush();
    const auto took = std::chrono::steady_clock::now() - start;
    // 64 KiB of pipe (plus the file buffer) and 192 queued lines hold far
    // fewer than 5000 lines of 1000 bytes.
    const bool ok = dropped > 4000 && took < 5s;
    ::_exit(ok ? 0 : 11);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child was killed (blocked?)";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
