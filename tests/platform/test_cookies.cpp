// SPDX-License-Identifier: Apache-2.0
// Cookies' names and weights: the API refuses bad input and changes nothing,
// names read back, weights change under running fibers, and the stats and
// their table carry a cookie's name. (The fiber dump's labels are checked in
// test_dump.cpp, the trace's in test_trace.cpp.)
#include "test_support.hpp"

#include <coresched/coresched.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

using namespace coresched;
using test_support::topo;

namespace {

// Cookie::create() numbers cookies in order: the next number shows whether a
// refused call made one.
std::uint64_t next_cookie_value() { return Cookie::create().value() + 1; }

// The message of the UsageError `f` throws ("" if it throws none).
template <class F> std::string usage_error(F f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return {};
}

} // namespace

TEST_CASE("bad input to the cookie API is a UsageError with a message, and changes nothing", "[cookies]") {
  SECTION("a weight outside 1 to 10,000 at creation makes no cookie") {
    for (std::uint32_t w : {0u, 10'001u}) {
      const std::uint64_t next = next_cookie_value();
      const std::string what = usage_error([&] { Cookie::create("w", w); });
      CHECK_THAT(what, Catch::Contains("weight must be 1 to 10000") && Catch::Contains(std::to_string(w)));
      CHECK(Cookie::create().value() == next);
    }
  }
  SECTION("a name too long or holding a control character makes no cookie") {
    const std::string longest(Cookie::kMaxNameLength, 'n');
    CHECK(Cookie::create(longest).name() == longest);
    for (const std::string& bad : {longest + "n", std::string("two\nlines"), std::string("tab\there"),
                                   std::string("del\x7f")}) {
      const std::uint64_t next = next_cookie_value();
      CHECK_THAT(usage_error([&] { Cookie::create(bad); }), Catch::Contains("a cookie's name"));
      CHECK(Cookie::create().value() == next);
    }
    CHECK_THROWS_WITH(Cookie::create(longest + "n"), Catch::Contains("at most 48 bytes"));
    CHECK_THROWS_WITH(Cookie::create("a\nb"), Catch::Contains("control characters"));
  }
  SECTION("set_weight out of range, or on the reserved value, keeps the weight") {
    const Cookie c = Cookie::create("kept", 300);
    CHECK_THROWS_WITH(c.set_weight(0), Catch::Contains("weight must be 1 to 10000"));
    CHECK_THROWS_AS(c.set_weight(10'001), UsageError);
    CHECK(c.weight() == 300);
    const Cookie reserved = Cookie::from_value(UINT64_MAX);
    CHECK_THAT(usage_error([&] { reserved.set_weight(200); }), Catch::Contains("UINT64_MAX is reserved"));
    CHECK(reserved.weight() == Cookie::kDefaultWeight);
  }
}

TEST_CASE("the reserved cookie value is refused with a message", "[cookies]") {
  Runtime rt(topo("core:1 pu:2"));
  const Cookie reserved = Cookie::from_value(~std::uint64_t{0});
  CHECK_THROWS_WITH(rt.spawn([] {}, SpawnOptions{.cookie = reserved}), Catch::Contains("reserved"));
  auto h = rt.spawn([&] {
    try {
      this_fiber::set_cookie(reserved);
    } catch (const UsageError&) {
      return true;
    }
    return false;
  });
  CHECK(h.join());
}

TEST_CASE("names, labels and weights read back", "[cookies]") {
  const Cookie premium = Cookie::create("premium", 250);
  CHECK(premium.name() == "premium");
  CHECK(premium.weight() == 250);
  CHECK(premium.label() == std::to_string(premium.value()) + " (premium)");

  const Cookie plain = Cookie::create();
  CHECK(plain.name().empty());
  CHECK(plain.weight() == Cookie::kDefaultWeight);
  CHECK(plain.label() == std::to_string(plain.value()));

  const Cookie weighted_only = Cookie::create("", 7);
  CHECK(weighted_only.name().empty());
  CHECK(weighted_only.weight() == 7);
  CHECK(weighted_only.label() == std::to_string(weighted_only.value()));

  const Cookie odd = Cookie::create(R"(say "hi" \ bye)");
  CHECK(odd.name() == R"(say "hi" \ bye)");
  CHECK(Cookie::from_value(odd.value()).name() == odd.name()); // the name belongs to the number

  CHECK(Cookie().label() == "0 (untagged)");
  premium.set_weight(Cookie::kMaxWeight);
  CHECK(premium.weight() == Cookie::kMaxWeight);
  premium.set_weight(Cookie::kMinWeight);
  CHECK(premium.weight() == Cookie::kMinWeight);
}

TEST_CASE("set_weight from plain threads while fibers of that cookie run", "[cookies]") {
  Runtime rt(topo("core:1 pu:2"));
  const Cookie busy = Cookie::create("busy"), rival = Cookie::create("rival");
  std::atomic<bool> stop{false};
  std::vector<JoinHandle<void>> fibers;
  for (int i = 0; i < 4; ++i)
    fibers.push_back(rt.spawn([&] { test_support::busy_until(stop); }, SpawnOptions{.cookie = i % 2 ? busy : rival}));
  std::vector<std::thread> setters;
  for (std::uint32_t t = 0; t < 4; ++t)
    setters.emplace_back([&, t] {
      for (std::uint32_t i = 0; i < 2000; ++i) {
        busy.set_weight(1 + (i * 4 + t) % Cookie::kMaxWeight);
        if (i % 64 == 0) std::this_thread::yield();
      }
    });
  for (auto& s : setters) s.join();
  busy.set_weight(400);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop = true;
  for (auto& f : fibers) f.join();
  CHECK(busy.weight() == 400);
  const Stats st = rt.stats();
  CHECK(st.cookie(busy).cpu_ns > 0);
  CHECK(st.cookie(rival).cpu_ns > 0);
  CHECK(st.cookie(busy).weight == 400);
}

TEST_CASE("the stats and their table show a named cookie's name and weight", "[cookies]") {
  Runtime rt(topo("core:1 pu:2"));
  const Cookie named = Cookie::create(R"(tenant "A")", 300), plain = Cookie::create();
  const std::string label = std::to_string(named.value()) + R"( (tenant "A"))";
  rt.spawn([] { this_fiber::yield(); }, SpawnOptions{.cookie = named}).join();
  rt.spawn([] { this_fiber::yield(); }, SpawnOptions{.cookie = plain}).join();
  const Stats st = rt.stats();
  CHECK(st.cookie(named).name == R"(tenant "A")");
  CHECK(st.cookie(named).weight == 300);
  CHECK(st.cookie(plain).name.empty());
  const std::string table = st.to_table();
  INFO(table);
  std::string named_row, plain_row;
  for (std::size_t at = 0, end; at < table.size(); at = end + 1) {
    end = table.find('\n', at);
    const std::string line = table.substr(at, end - at);
    if (line.rfind(label + " ", 0) == 0) named_row = line;
    if (line.rfind(std::to_string(plain.value()) + " ", 0) == 0) plain_row = line;
  }
  CHECK(named_row.find(" 300 ") != std::string::npos); // its weight column
  CHECK(plain_row.find(" 100 ") != std::string::npos);
}
