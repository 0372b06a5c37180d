// SPDX-License-Identifier: Apache-2.0
// Settings and environment values out of range, and a core wider than the
// runtime supports, are refused when the Runtime is made, with a message.
#include "test_support.hpp"

#include <coresched/coresched.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>

using namespace coresched;
using test_support::topo;

TEST_CASE("settings out of range are refused with a message", "[options]") {
  auto refused = [](auto change) {
    Options o = topo("core:1 pu:1");
    change(o);
    CHECK_THROWS_AS(Runtime(o), UsageError);
  };
  refused([](Options& o) { o.slice = std::chrono::microseconds::max(); }); // would overflow: a tick every 90 us
  refused([](Options& o) { o.stall_threshold = std::chrono::milliseconds(18446744073710); }); // would wrap to 0.45 ms
  refused([](Options& o) { o.log_level = "bogus"; }); // would be taken as "off"
  refused([](Options& o) { o.dump_signal = 32; });    // glibc's own: sigaction would fail, only logged
  CHECK_THROWS_AS(Runtime(topo("core:100000 pu:100000")), TopologyError); // would load in hwloc for minutes
  Runtime rt(topo("core:1 pu:1"));
  CHECK_THROWS_AS(rt.dump(nullptr), UsageError); // SIGSEGV
}

TEST_CASE("environment values out of range are refused with a message", "[options]") {
  struct Env {
    const char* name;
    Env(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
    ~Env() { ::unsetenv(name); }
  };
  {
    Env e("CORESCHED_TRACE_EVENTS", "-1"); // would be std::length_error: terminate in a program without a catch
    Options o = topo("core:1 pu:1");
    o.trace_path = "/dev/null";
    CHECK_THROWS_AS(Runtime(o), UsageError);
  }
  {
    Env e("CORESCHED_DUMP_SIGNAL", "4294967306"); // would read as 10, SIGUSR1
    CHECK_THROWS_AS(Runtime(topo("core:1 pu:1")), UsageError);
  }
}

TEST_CASE("a core with more PUs than the runtime supports is refused with a message", "[options]") {
  CHECK_THROWS_WITH(Runtime(topo("core:1 pu:65")), Catch::Contains("at most 64 per core"));
}
