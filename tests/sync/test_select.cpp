// SPDX-License-Identifier: Apache-2.0
// select: exactly one case happens (a ready one at once, chosen uniformly
// among the ready; otherwise the first to become ready, the deadline or the
// stop request), cases not chosen have no effect, closed channels are ready,
// bad input is a UsageError, and under races nothing is lost or doubled.
#include <coresched/coresched.hpp>

#include "test_support.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

using namespace coresched;
using namespace std::chrono_literals;
using test_support::topo;

namespace {

// Runs `fn` in a fiber of `rt` and waits for it.
template <class F> void in_fiber(Runtime& rt, F fn) { rt.spawn(fn).join(); }

} // namespace

TEST_CASE("select takes a ready case at once: recv, send, event", "[select]") {
  Runtime rt(topo("core:2 pu:2"));
  in_fiber(rt, [] {
    Channel<int> in(1), out(1);
    Event ev;
    std::optional<int> got;
    int v = 7;
    bool sent = false;
    CHECK(in.try_send(5));
    CHECK(select({recv_case(in, got)}) == 0);
    CHECK(got == 5);
    CHECK(select({send_case(out, v, sent)}) == 0);
    CHECK(sent);
    CHECK(out.try_recv() == 7);
    ev.set();
    CHECK(select({event_case(ev)}) == 0);
    // Only one of several ready cases happens.
    CHECK(in.try_send(6));
    const int r = select({recv_case(in, got), event_case(ev), send_case(out, v, sent)});
    CHECK(r >= 0);
    CHECK(in.size() + out.size() == (r == 0 ? 0u : 1u) + (r == 2 ? 1u : 0u));
  });
}

TEST_CASE("select_for times out, never early, and leaves every case untouched", "[select]") {
  Runtime rt(topo("core:2 pu:2"));
  auto check = [] {
    Channel<std::string> full(1), unbuffered(0), empty(1);
    CHECK(full.try_send("x"));
    Event ev;
    std::optional<std::string> got = "stale";
    std::string v = "keep";
    bool sent = true;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(select_for({send_case(full, v, sent), send_case(unbuffered, v, sent), recv_case(empty, got),
                      event_case(ev)},
                     20ms) == kSelectTimedOut);
    CHECK(std::chrono::steady_clock::now() - t0 >= 20ms);
    CHECK(v == "keep");
    CHECK_FALSE(got); // emptied as the select started
    CHECK(full.size() == 1);
    CHECK(empty.size() == 0);
    CHECK(select_until({event_case(ev)}, std::chrono::steady_clock::now() - 1s) == kSelectTimedOut);
    CHECK(try_select({event_case(ev), recv_case(empty, got)}) == kSelectNone);
  };
  in_fiber(rt, check);
  check(); // a plain thread
}

TEST_CASE("a closed channel's cases are ready: recv gets nothing, send is not sent", "[select]") {
  Runtime rt(topo("core:1 pu:2"));
  in_fiber(rt, [] {
    Channel<int> ch(2);
    ch.close();
    std::optional<int> got = 1;
    int v = 3;
    bool sent = true;
    CHECK(select({recv_case(ch, got)}) == 0);
    CHECK_FALSE(got);
    CHECK(select({send_case(ch, v, sent)}) == 0);
    CHECK_FALSE(sent);
    CHECK(v == 3);
  });
}

TEST_CASE("select with no case: a UsageError without a deadline or stop token, else it waits for them",
          "[select]") {
  Runtime rt(topo("core:1 pu:2"));
  in_fiber(rt, [] {
    CHECK_THROWS_AS(select({}), UsageError);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(select_for({}, 5ms) == kSelectTimedOut);
    CHECK(std::chrono::steady_clock::now() - t0 >= 5ms);
    CHECK(try_select({}) == kSelectNone);
  });
  std::stop_source src;
  std::thread stopper([&] {
    std::this_thread::sleep_for(10ms);
    src.request_stop();
  });
  in_fiber(rt, [&] { CHECK(select({}, src.get_token()) == kSelectStopped); });
  stopper.join();
}

// A waiting select, ended by each kind of event, from a fiber and from a
// plain thread, with the selector a fiber or a plain thread.
TEST_CASE("a waiting select is ended by a send, a receive, a set, a close and a stop", "[select]") {
  Runtime rt(topo("core:2 pu:2"));
  for (const bool selector_fiber : {true, false}) {
    for (const bool waker_fiber : {true, false}) {
      for (int what = 0; what < 5; ++what) {
        INFO("selector in a fiber: " << selector_fiber << ", waker in a fiber: " << waker_fiber << ", event " << what);
        Channel<int> in(0), out(0);
        Event ev;
        std::stop_source src;
        std::optional<int> got;
        int v = 42;
        bool sent = false;
        std::atomic<int> result{-100};
        auto selector = [&] {
          result = select({recv_case(in, got), send_case(out, v, sent), event_case(ev)}, src.get_token());
        };
        std::optional<int> received;
        auto waker = [&] {
          std::this_thread::sleep_for(5ms);
          switch (what) {
          case 0: CHECK(in.send(9)); break;
          case 1: received = out.recv(); break;
          case 2: ev.set(); break;
          case 3: in.close(); break;
          default: src.request_stop();
          }
        };
        std::thread thread_selector, thread_waker;
        JoinHandle<void> fs, fw;
        if (selector_fiber) fs = rt.spawn(selector);
        else thread_selector = std::thread(selector);
        if (waker_fiber) fw = rt.spawn(waker);
        else thread_waker = std::thread(waker);
        if (selector_fiber) fs.join();
        else thread_selector.join();
        if (waker_fiber) fw.join();
        else thread_waker.join();
        const int expect[] = {0, 1, 2, 0, kSelectStopped};
        CHECK(result == expect[what]);
        if (what == 0) CHECK(got == 9);
        if (what == 1) CHECK((sent && received == 42));
        if (what != 1) CHECK_FALSE(sent);
        if (what == 3) CHECK_FALSE(got);
      }
    }
  }
}

// Cases built once and reused, over a span, with every form of select.
TEST_CASE("reused cases: a closed channel's receive never shows the last select's item", "[select]") {
  Channel<int> ch(1);
  Event never;
  std::optional<int> got;
  const SelectCase cases[] = {recv_case(ch, got), event_case(never)};
  CHECK(ch.try_send(7));
  CHECK(select(cases) == 0);
  CHECK(got == 7);
  ch.close();
  CHECK(select_for(cases, 1s) == 0);
  CHECK_FALSE(got); // emptied as the select started; the closed channel gave nothing
  got = 9;
  CHECK(select_until(cases, std::chrono::steady_clock::now() + 1s) == 0);
  CHECK_FALSE(got);
  got = 9;
  CHECK(try_select(cases) == 0);
  CHECK_FALSE(got);
}

TEST_CASE("a send case that is not chosen sends nothing", "[select]") {
  Runtime rt(topo("core:2 pu:2"));
  Channel<int> unbuffered(0), other(1);
  in_fiber(rt, [&] {
    auto sender = rt.spawn([&] {
      this_fiber::sleep_for(5ms);
      return other.send(1); // checked below: one fiber asserts at a time
    });
    int v = 5;
    bool sent = false;
    std::optional<int> got;
    CHECK(select({send_case(unbuffered, v, sent), recv_case(other, got)}) == 1);
    CHECK(got == 1);
    CHECK_FALSE(sent);
    CHECK(v == 5);
    CHECK_FALSE(unbuffered.try_recv()); // nobody waits to send
    CHECK(sender.join());
  });
}

// Go's rule: among ready cases each is as likely. Rotating from a random
// start would give the first of two ready cases after an unready one twice
// the other's share.
TEST_CASE("select chooses uniformly among ready cases", "[select]") {
  Runtime rt(topo("core:1 pu:2"));
  in_fiber(rt, [] {
    Channel<int> a(1), b(1), never(1);
    std::optional<int> got;
    const int n = 30000;
    int count[3] = {0, 0, 0};
    for (int i = 0; i < n; ++i) {
      if (a.size() == 0) CHECK(a.try_send(0));
      if (b.size() == 0) CHECK(b.try_send(1));
      ++count[select({recv_case(never, got), recv_case(a, got), recv_case(b, got)})];
    }
    INFO("a " << count[1] << ", b " << count[2] << " of " << n);
    CHECK(count[0] == 0);
    CHECK(std::abs(count[1] - n / 2) < n / 50); // 2 %: over 10 standard deviations
  });
}

// Senders and selecting receivers over several channels, with timeouts and
// send cases racing: every item arrives exactly once.
TEST_CASE("selects racing with senders, receivers and timeouts lose and double nothing", "[select][stress]") {
  Runtime rt(topo("core:2 pu:2"));
  const int per = static_cast<int>(2000 * test_support::stress_scale()) + 50;
  Channel<int> c0(0), c1(4), c2(1);
  std::atomic<long> sum_in{0}, sum_out{0}, count_out{0};
  std::atomic<int> failed_sends{0}; // counted, not asserted: the fibers run at once, and Catch2 is not thread-safe
  std::atomic<int> senders_left{4};
  std::vector<JoinHandle<void>> hs;
  for (int s = 0; s < 4; ++s)
    hs.push_back(rt.spawn([&, s] {
      for (int i = 1; i <= per; ++i) {
        int v = s * 100000 + i;
        bool sent = false;
        // Alternately a plain send and a select of sends with a timeout.
        if (i % 2) {
          if (!(s % 2 ? c0 : c1).send(v)) ++failed_sends;
          sum_in += v;
          continue;
        }
        int r;
        do r = select_for({send_case(c0, v, sent), send_case(c2, v, sent)}, 100us);
        while (r == kSelectTimedOut);
        if (!sent) ++failed_sends;
        sum_in += v;
      }
      if (--senders_left == 0) {
        c0.close();
        c1.close();
        c2.close();
      }
    }));
  for (int r = 0; r < 3; ++r)
    hs.push_back(rt.spawn([&] {
      int open = 3;
      while (open > 0) {
        std::optional<int> a, b, c;
        const int k = select_for({recv_case(c0, a), recv_case(c1, b), recv_case(c2, c)}, 50us);
        if (k == kSelectTimedOut) continue;
        std::optional<int>& got = k == 0 ? a : k == 1 ? b : c;
        if (got) {
          sum_out += *got;
          ++count_out;
        } else if (c0.closed() && c1.closed() && c2.closed()) {
          // drain what is buffered, then stop
          while (auto x = c1.try_recv()) sum_out += *x, ++count_out;
          while (auto x = c2.try_recv()) sum_out += *x, ++count_out;
          open = 0;
        }
      }
    }));
  for (auto& h : hs) h.join();
  CHECK(failed_sends.load() == 0);
  CHECK(count_out.load() == 4L * per);
  CHECK(sum_out.load() == sum_in.load());
}
