#pragma once

// A real core pair on 127.0.0.1 (any port) answered by a fake app thread:
// the fixture the core-pair and access-log tests share. start() after
// adjusting `opt`; TearDown stops both.

#include "fake_app.hpp"
#include "test_client.hpp"

#include <cadeloop/runtime/core_pair.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>

namespace cadeloop::test {

class pair_fixture : public ::testing::Test {
 protected:
  void SetUp() override {
    opt.listen = net::listen_spec::tcp("127.0.0.1", 0);
    opt.grace = std::chrono::seconds{1};  // tests that leave requests unanswered must not wait 30 s in TearDown
  }

  void start(fake_app::hook hook = {}) {
    pair = std::make_unique<runtime::core_pair>(opt);
    const std::string error = pair->start();
    ASSERT_EQ(error, "");
    app = std::make_unique<fake_app>(pair->app());
    app->set_hook(std::move(hook));
    app->start();
  }

  void TearDown() override {
    if (pair) {
      pair->stop();
    }
    if (app) {
      app->stop();
    }
    app.reset();
    pair.reset();
  }

  [[nodiscard]] test_client client() const { return test_client::tcp(pair->local_address().port); }

  runtime::core_pair_options opt;
  std::unique_ptr<runtime::core_pair> pair;
  std::unique_ptr<fake_app> app;
};

}  // namespace cadeloop::test
