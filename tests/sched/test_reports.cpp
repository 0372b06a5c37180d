// SPDX-License-Identifier: Apache-2.0
// Failures that speak: an exception escaping a detached fiber reaches
// Options::on_detached_exception (in the fiber, under its cookie) or a log
// line naming the fiber and its tenant; a shutdown kept waiting by parked
// fibers says what they wait for; Options::logger takes the library's lines.
#include <coresched/coresched.hpp>

#include "test_support.hpp"

#include <catch2/catch.hpp>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

using namespace coresched;
using namespace std::chrono_literals;
using test_support::topo;

namespace {

// A logger that keeps the library's last lines, installed through
// Options::logger; the library's own logger is put back at the end (the
// logger is one per process).
struct CapturedLog {
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  std::shared_ptr<spdlog::logger> logger = std::make_shared<spdlog::logger>("captured", sink);
  std::shared_ptr<spdlog::logger> previous = spdlog::get("coresched");

  ~CapturedLog() {
    Options restore = topo("core:1 pu:1");
    restore.logger = previous;
    Runtime put_back(restore);
  }
  Options options(const char* spec) const {
    Options o = topo(spec);
    o.logger = logger;
    return o;
  }
  std::string text() const {
    std::string all;
    for (const auto& line : sink->last_formatted()) all += line;
    return all;
  }
  // Waits up to 10 s for `what` to be logged.
  bool shows(const std::string& what) const {
    for (auto until = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < until;) {
      if (text().find(what) != std::string::npos) return true;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }
};

} // namespace

TEST_CASE("an exception escaping a detached fiber is logged with the fiber, its tenant and what()", "[reports]") {
  CapturedLog log;
  Runtime rt(log.options("core:1 pu:2"));
  const Cookie billing = Cookie::create("billing");
  std::atomic<std::uint64_t> id{0};
  rt.spawn([&] {
    id = this_fiber::id();
    throw std::runtime_error("ledger out of balance");
  }, SpawnOptions{.cookie = billing, .detached = true});
  REQUIRE(log.shows("ledger out of balance"));
  const std::string t = log.text();
  CHECK(t.find("fiber " + std::to_string(id.load())) != std::string::npos);
  CHECK(t.find("billing") != std::string::npos);

  // detach() before the end reports the same way; detach() after it, too.
  auto early = rt.spawn([] {
    this_fiber::sleep_for(2ms);
    throw std::logic_error("detached first");
  });
  early.detach();
  CHECK(log.shows("detached first"));
  std::atomic<bool> ending{false};
  auto late = rt.spawn([&]() -> int {
    ending = true;
    throw std::out_of_range("ended first");
  });
  while (!ending.load()) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(20ms); // past its end: the handle holds the exception
  late.detach();
  CHECK(log.shows("ended first"));
  // Something not derived from std::exception.
  rt.spawn([] { throw 42; }, SpawnOptions{.detached = true});
  CHECK(log.shows("not derived from std::exception"));
}

TEST_CASE("Options::on_detached_exception runs in the fiber, under its cookie, and may suspend", "[reports]") {
  CapturedLog log;
  Options o = log.options("core:2 pu:2");
  const Cookie tenant = Cookie::create("tenant");
  std::atomic<int> calls{0};
  std::atomic<std::uint64_t> seen_cookie{0}, seen_fiber{0};
  std::string seen_what;
  o.on_detached_exception = [&](std::exception_ptr e) {
    seen_cookie = this_fiber::cookie().value();
    seen_fiber = this_fiber::id();
    this_fiber::sleep_for(1ms); // a handler is fiber code: it may wait
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      seen_what = x.what();
    }
    if (calls.fetch_add(1) == 1) throw std::runtime_error("the handler itself failed");
  };
  {
    Runtime rt(o);
    std::atomic<std::uint64_t> id{0};
    rt.spawn([&] {
      id = this_fiber::id();
      throw std::invalid_argument("bad request");
    }, SpawnOptions{.cookie = tenant, .detached = true});
    while (calls.load() < 1) std::this_thread::sleep_for(1ms);
    CHECK(seen_cookie.load() == tenant.value());
    CHECK(seen_fiber.load() == id.load());
    // The second call throws: that is logged, with the fiber's exception.
    rt.spawn([] { throw std::runtime_error("second"); }, SpawnOptions{.cookie = tenant, .detached = true});
  }
  CHECK(calls.load() == 2);
  CHECK(seen_what == "second");
  CHECK(log.shows("the handler itself failed"));
  CHECK(log.shows("second"));
  CHECK(log.text().find("bad request") == std::string::npos); // the handler took it; nothing logged
}

TEST_CASE("a shutdown kept waiting by a fiber says what it waits for, and keeps waiting", "[reports]") {
  CapturedLog log;
  Options o = log.options("core:1 pu:2");
  o.shutdown_report_after = 30ms;
  // The fiber yields until told to end, rather than parking on an event the
  // main thread sets: a plain thread's wake-up of a runtime's fiber may still
  // be touching its worker when that fiber ends and the runtime goes away.
  std::atomic<bool> release{false}, shut{false};
  std::atomic<std::uint64_t> id{0};
  auto rt = std::make_unique<Runtime>(o);
  rt->spawn([&] {
    id = this_fiber::id();
    while (!release.load()) this_fiber::yield();
  }, SpawnOptions{.detached = true});
  std::thread closer([&] {
    rt.reset(); // waits for the fiber
    shut = true;
  });
  CHECK(log.shows("shutdown has waited"));
  while (id.load() == 0) std::this_thread::sleep_for(1ms);
  CHECK(log.shows("fiber " + std::to_string(id.load()) + " cookie")); // its line in the fiber dump
  CHECK_FALSE(shut.load()); // still waiting: reporting does not end anything
  release = true;
  closer.join();
  CHECK(shut.load());
}

TEST_CASE("bad report options are UsageErrors", "[reports]") {
  Options o = topo("core:1 pu:1");
  o.shutdown_report_after = -1ms;
  CHECK_THROWS_AS(Runtime(o), UsageError);
  o.shutdown_report_after = std::chrono::milliseconds::max(); // would overflow the next report's time
  CHECK_THROWS_AS(Runtime(o), UsageError);
}
