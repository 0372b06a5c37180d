// SPDX-License-Identifier: Apache-2.0
// The scheduling trace: what it records and that its memory is bounded.
// (tests/check_trace.py checks that a trace is well-formed JSON.)
#include "test_support.hpp"

#include <coresched/coresched.hpp>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

using namespace coresched;
using test_support::topo;

namespace {

std::string temp_path(const char* name) {
  return "/tmp/coresched-test-" + std::to_string(getpid()) + "-" + name + ".json";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + what.size())) ++n;
  return n;
}

// Two tenants compete for one core with two siblings and wake each other
// through sleeps, each round longer than a slice (so the core changes cookie
// while the cookie it leaves still has work): every kind of event appears.
void contended_run(const std::string& path, Cookie a = Cookie::create(), Cookie b = Cookie::create()) {
  Options o = topo("core:1 pu:2");
  o.trace_path = path;
  Runtime rt(o);
  std::vector<JoinHandle<void>> fibers;
  for (int i = 0; i < 4; ++i)
    fibers.push_back(rt.spawn(
        [] {
          for (int round = 0; round < 20; ++round) {
            const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(1500);
            while (std::chrono::steady_clock::now() < until) this_fiber::preempt_point();
            this_fiber::sleep_for(std::chrono::microseconds(100));
          }
        },
        SpawnOptions{.cookie = i % 2 ? a : b}));
  for (auto& f : fibers) f.join();
}

} // namespace

TEST_CASE("the trace records run spans, forced idle, cookie changes, hand-overs and wakeups", "[trace]") {
  const std::string path = temp_path("trace");
  contended_run(path);
  const std::string text = slurp(path);
  std::remove(path.c_str());
  REQUIRE(text.rfind(R"({"displayTimeUnit":"ns","traceEvents":[)", 0) == 0);
  CHECK(text.substr(text.size() - 3) == "]}\n");
  CHECK(text.find("SYNTHETIC siblings") != std::string::npos);
  CHECK(count(text, R"("name":"thread_name")") == 2); // one row per worker
  CHECK(count(text, R"("cat":"run")") >= 80);         // each of 4 fibers ran at least 20 times
  CHECK(count(text, R"("cat":"forced_idle")") > 0);
  CHECK(count(text, R"("cat":"cookie")") > 0);
  CHECK(count(text, R"("cat":"wakeup")") > 0);
  CHECK(count(text, R"("cat":"handover")") > 0);
}

TEST_CASE("the trace gives a named cookie's name beside its number, escaped", "[trace]") {
  const std::string path = temp_path("names");
  // A quote, a backslash, UTF-8 (e-acute) and a byte that is not UTF-8.
  const Cookie a = Cookie::create("say \"hi\" \\ caf\xc3\xa9 \xff"), b = Cookie::create();
  contended_run(path, a, b);
  const std::string text = slurp(path);
  const std::string named = fmt::format(R"("cookie":{},"cookie_name":)", a.value()) +
                            "\"say \\\"hi\\\" \\\\ caf\xc3\xa9 \\ufffd\"";
  CHECK(count(text, named) > 0);
  CHECK(count(text, fmt::format(R"("cookie":{},"cookie_name")", b.value())) == 0); // no name, no field
  CHECK(count(text, R"("core_cookie_name")") + count(text, R"("waiting_cookie_name")") > 0);
  CHECK(count(text, R"("from_cookie_name")") + count(text, R"("to_cookie_name")") > 0);
  // Well-formed for a strict parser: Python's json, reading the file as UTF-8.
  const std::string check = "python3 -c 'import json, sys; json.load(open(sys.argv[1], encoding=\"utf-8\"))' " + path;
  CHECK(std::system(check.c_str()) == 0);
  std::remove(path.c_str());
}

TEST_CASE("a full trace ring keeps only the newest events", "[trace]") {
  const std::string path = temp_path("bounded");
  setenv("CORESCHED_TRACE_EVENTS", "16", 1);
  contended_run(path);
  unsetenv("CORESCHED_TRACE_EVENTS");
  const std::string text = slurp(path);
  std::remove(path.c_str());
  const std::size_t events = count(text, R"("ph":"X")") + count(text, R"("ph":"i")");
  CHECK(events > 0);
  CHECK(events <= 2 * 16);
}

TEST_CASE("a bad trace path or size is reported", "[trace]") {
  Options unwritable = topo("core:1 pu:1");
  unwritable.trace_path = "/nonexistent-dir/trace.json";
  CHECK_NOTHROW([&] {
    Runtime rt(unwritable);
    rt.spawn([] {}).join();
  }()); // logged, not thrown at shutdown

  setenv("CORESCHED_TRACE_EVENTS", "lots", 1);
  Options traced = topo("core:1 pu:1");
  traced.trace_path = temp_path("bad-size");
  CHECK_THROWS_WITH(Runtime(traced), Catch::Contains("CORESCHED_TRACE_EVENTS"));
  unsetenv("CORESCHED_TRACE_EVENTS");
}
