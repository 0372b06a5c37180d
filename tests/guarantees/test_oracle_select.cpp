// SPDX-License-Identifier: Apache-2.0
// Oracle scenario: select (select.hpp) moving items between fibers of three
// cookies through four channels, with event cases, timeouts (select_for,
// select_until, an empty select as a timed sleep), try_select and stop tokens,
// beside busy rivals of a fourth cookie. A fiber woken by a select (a case, its
// deadline or a stop) must run under its own cookie; every select is a switch
// point wrapped by Scope::around(), and the code after it burns inside its
// stamped interval so that a wake-up under the wrong cookie is seen.
// Besides isolation: every item arrives exactly once (a select that let two
// cases happen would lose one or hand one twice), a send case that did not
// happen leaves its item in place, and selects end in each of their outcomes.
#include "harness.hpp"

#include <catch2/catch.hpp>

#include <optional>
#include <stop_token>
#include <utility>
#include <vector>

using namespace coresched;
using namespace guarantees;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

// An item whose move empties its source (id 0): a send case that happened
// must have moved its item out, one that did not must have left it whole.
struct Item {
  explicit Item(std::uint64_t v) noexcept : id(v) {}
  Item(Item&& o) noexcept : id(std::exchange(o.id, 0)) {}
  Item& operator=(Item&&) = delete;
  std::uint64_t id; // 1..total, 0 once moved from
};

struct Tally {
  std::atomic<int> recv{0}, send{0}, event{0}, timed_out{0}, stopped{0}, none{0};
  std::atomic<int> drained_timeouts{0}; // the relays' selects on the drained inputs
};

} // namespace

// Producers (cookies A and B) offer two items at once on two input channels
// (unbuffered and buffered) with select_for; relays (cookie C) select over
// both inputs and a "producers done" event with select_for, forward each item
// to one of two output channels with select_until, and drain the inputs with
// try_select once the event is set, then time out on the drained inputs
// with select_until and select_for; consumers (A and B) select over both
// outputs and a pulse event (set by a C fiber that sleeps in empty
// select_for calls) with no deadline, until a plain thread stops their token.
TEST_CASE("select moves items between cookies exactly once, with events, timeouts and stop tokens",
          "[oracle][sync][select]") {
  const std::string spec = GUARANTEE_TOPOLOGIES;
  INFO(spec);
  Harness h(spec);
  const Cookie a = Cookie::create(), b = Cookie::create(), c = Cookie::create();
  h.start_rivals({Cookie::create()}, 1);
  const int per_producer = scaled(300);
  const int total = 2 * per_producer;
  Channel<Item> in0(0), in1(2), out0(1), out1(0);
  Event producers_done, pulse;
  std::stop_source stop;
  std::vector<std::atomic<int>> seen(static_cast<std::size_t>(total) + 1);
  std::atomic<int> wrong{0}, sent{0}, received{0}, stray{0}, pulses_seen{0};
  std::atomic<std::uint64_t> sent_sum{0}, received_sum{0};
  Tally tally;
  auto bad = [&](const char* what) {
    if (wrong.fetch_add(1) < 5) UNSCOPED_INFO(what);
  };

  auto producer = [&](int p, Cookie mine) {
    return [&, p, mine] {
      Scope s(h.oracle, mine, "select producer");
      std::uint64_t next = static_cast<std::uint64_t>(p * per_producer + 1);
      const std::uint64_t end = next + static_cast<std::uint64_t>(per_producer);
      std::optional<Item> item[2];
      auto refill = [&] {
        for (auto& it : item)
          if (!it && next < end) it.emplace(next++);
      };
      refill();
      for (unsigned round = 0; item[0] || item[1]; ++round) {
        const auto d = std::chrono::microseconds(20 + (round * 37 + static_cast<unsigned>(p) * 11) % 120);
        const std::uint64_t before[2] = {item[0] ? item[0]->id : 0, item[1] ? item[1]->id : 0};
        bool ok[2] = {false, false};
        const auto t0 = Clock::now();
        int r;
        if (item[0] && item[1]) {
          r = s.around([&] {
            return select_for({send_case(in0, *item[0], ok[0]), send_case(in1, *item[1], ok[1])}, d);
          });
        } else {
          const int k = item[0] ? 0 : 1;
          r = s.around([&] { return select_for({send_case(k ? in1 : in0, *item[k], ok[k])}, d); });
          if (r == 0) r = k;
        }
        if (r == kSelectTimedOut) {
          tally.timed_out.fetch_add(1);
          if (Clock::now() - t0 < d) bad("producer: select_for timed out early");
        } else if (r == 0 || r == 1) {
          tally.send.fetch_add(1);
          if (!ok[r] || item[r]->id != 0) {
            bad("producer: the chosen send case did not send, or left its item in place");
          } else {
            sent.fetch_add(1);
            sent_sum.fetch_add(before[r]);
          }
          item[r].reset();
        } else {
          bad("producer: select_for returned neither a case nor kSelectTimedOut");
        }
        for (int k = 0; k < 2; ++k)
          if (item[k] && item[k]->id != before[k]) bad("producer: a send case that did not happen moved its item");
        s.burn(3us);
        if (round % 16 == 15) s.sleep_for(300us); // the relays time out meanwhile
        refill();
      }
    };
  };

  auto relay = [&] {
    Scope s(h.oracle, c, "select relay");
    // Sends `it` on either output (the same item in both cases: only one may take it).
    auto forward = [&](Item& it) {
      for (unsigned n = 0;; ++n) {
        const std::uint64_t id = it.id;
        bool ok[2] = {false, false};
        const auto until = Clock::now() + std::chrono::microseconds(30 + n % 4 * 40);
        const int r = s.around([&] {
          return select_until({send_case(out0, it, ok[0]), send_case(out1, it, ok[1])}, until);
        });
        if (r == kSelectTimedOut) {
          tally.timed_out.fetch_add(1);
          if (Clock::now() < until) bad("relay: select_until timed out early");
          if (it.id != id) bad("relay: a send select that timed out moved its item");
          continue;
        }
        if ((r != 0 && r != 1) || !ok[r] || it.id != 0)
          bad("relay: a forwarding select went wrong");
        else
          tally.send.fetch_add(1);
        return;
      }
    };
    // Checks a receiving select's result over got[0], got[1]; forwards the item.
    auto took = [&](int r, std::optional<Item>(&got)[2]) {
      if (!got[r] || got[1 - r]) {
        bad("relay: the chosen recv case is empty, or the other one received too");
        return;
      }
      tally.recv.fetch_add(1);
      s.burn(2us);
      forward(*got[r]);
    };
    for (unsigned round = 0;; ++round) {
      std::optional<Item> got[2];
      const auto d = std::chrono::microseconds(20 + round % 5 * 30);
      const auto t0 = Clock::now();
      const int r = s.around([&] {
        return select_for({recv_case(in0, got[0]), recv_case(in1, got[1]), event_case(producers_done)}, d);
      });
      if (r == 0 || r == 1) {
        took(r, got);
      } else if (r == 2) {
        tally.event.fetch_add(1);
        if (got[0] || got[1]) bad("relay: the event case was chosen but a recv case received");
        break;
      } else if (r == kSelectTimedOut) {
        tally.timed_out.fetch_add(1);
        if (Clock::now() - t0 < d) bad("relay: select_for timed out early");
        if (got[0] || got[1]) bad("relay: a select that timed out received");
      } else {
        bad("relay: select_for returned neither a case nor kSelectTimedOut");
      }
    }
    // The producers are done: what is left is buffered, taken without waiting.
    for (;;) {
      std::optional<Item> got[2];
      const int r = s.around([&] { return try_select({recv_case(in0, got[0]), recv_case(in1, got[1])}); });
      if (r == kSelectNone) {
        tally.none.fetch_add(1);
        if (got[0] || got[1]) bad("relay: try_select found nothing but received");
        break;
      }
      if (r != 0 && r != 1) {
        bad("relay: try_select returned neither a case nor kSelectNone");
        break;
      }
      took(r, got);
    }
    // The inputs are empty for good now (the producers are joined, and the
    // other relay takes nothing new): selects on them time out, by deadline
    // and by duration, however fast the items flowed above.
    std::optional<Item> got[2];
    const int by_deadline = s.around([&] {
      return select_until({recv_case(in0, got[0]), recv_case(in1, got[1])}, Clock::now());
    });
    const int by_duration = s.around([&] { return select_for({recv_case(in0, got[0]), recv_case(in1, got[1])}, 50us); });
    if (by_deadline != kSelectTimedOut || by_duration != kSelectTimedOut || got[0] || got[1])
      bad("relay: a select on the drained inputs did not time out, or received");
    else
      tally.drained_timeouts.fetch_add(2);
  };

  auto consumer = [&](Cookie mine) {
    return [&, mine] {
      Scope s(h.oracle, mine, "select consumer");
      for (;;) {
        std::optional<Item> got[2];
        const int r = s.around([&] {
          return select({recv_case(out0, got[0]), recv_case(out1, got[1]), event_case(pulse)}, stop.get_token());
        });
        if (r == kSelectStopped) {
          tally.stopped.fetch_add(1);
          if (!stop.stop_requested()) bad("consumer: kSelectStopped before the stop request");
          if (got[0] || got[1]) bad("consumer: a stopped select received");
          return;
        }
        if (r == 2) {
          tally.event.fetch_add(1);
          pulses_seen.fetch_add(1);
          pulse.reset();
          if (got[0] || got[1]) bad("consumer: the event case was chosen but a recv case received");
          s.burn(2us);
          continue;
        }
        if ((r != 0 && r != 1) || !got[r] || got[1 - r]) {
          bad("consumer: select returned a wrong case, or not exactly the chosen case received");
          continue;
        }
        tally.recv.fetch_add(1);
        const std::uint64_t id = got[r]->id;
        if (id == 0 || id > static_cast<std::uint64_t>(total))
          stray.fetch_add(1);
        else if (seen[id].fetch_add(1) != 0)
          bad("consumer: an item arrived twice");
        received_sum.fetch_add(id);
        received.fetch_add(1);
        s.burn(3us);
      }
    };
  };

  auto pulser = [&] {
    Scope s(h.oracle, c, "select pulser");
    for (;;) {
      const auto t0 = Clock::now();
      const int r = s.around([&] { return select_for({}, 200us, stop.get_token()); });
      if (r == kSelectStopped) {
        tally.stopped.fetch_add(1);
        return;
      }
      if (r != kSelectTimedOut)
        bad("pulser: an empty select_for returned neither kSelectTimedOut nor kSelectStopped");
      else if (Clock::now() - t0 < 200us)
        bad("pulser: an empty select_for timed out early");
      tally.timed_out.fetch_add(1);
      pulse.set();
      s.burn(2us);
    }
  };

  std::vector<JoinHandle<void>> producers, relays, rest;
  producers.push_back(h.rt.spawn(producer(0, a), SpawnOptions{.cookie = a}));
  producers.push_back(h.rt.spawn(producer(1, b), SpawnOptions{.cookie = b}));
  for (int k = 0; k < 2; ++k) relays.push_back(h.rt.spawn(relay, SpawnOptions{.cookie = c}));
  rest.push_back(h.rt.spawn(consumer(a), SpawnOptions{.cookie = a}));
  rest.push_back(h.rt.spawn(consumer(b), SpawnOptions{.cookie = b}));
  rest.push_back(h.rt.spawn(pulser, SpawnOptions{.cookie = c}));
  for (auto& f : producers) f.join();
  producers_done.set();
  for (auto& f : relays) f.join();
  // Everything forwarded is on its way to a consumer; a lost item never comes.
  const bool all = wait_for([&] { return received.load() >= total; }, 10s);
  // The items may all flow before any deadline passes (a slow sanitizer run,
  // a timer checked late); the pulser's empty select_for must still time out
  // and a consumer see its event before the stop, or that path went untested.
  const bool pulsed = wait_for([&] { return pulses_seen.load() > 0; }, 10s);
  stop.request_stop();
  for (auto& f : rest) f.join();
  h.stop_rivals();
  int left = 0;
  for (Channel<Item>* ch : {&in0, &in1, &out0, &out1})
    while (ch->try_recv()) ++left;
  int missing = 0, doubled = 0;
  for (int i = 1; i <= total; ++i) {
    missing += seen[static_cast<std::size_t>(i)].load() == 0;
    doubled += seen[static_cast<std::size_t>(i)].load() > 1;
  }
  INFO("selects: " << tally.recv << " recv, " << tally.send << " send, " << tally.event << " event, " << tally.timed_out
                   << " timed out, " << tally.stopped << " stopped, " << tally.none << " none");
  INFO(received << " of " << total << " items received, " << missing << " missing, " << doubled << " doubled, " << stray
                << " stray, " << left << " left in channels");
  CHECK(all);
  CHECK(pulsed);
  CHECK(wrong == 0);
  CHECK(sent == total);
  CHECK(received == total);
  CHECK(missing == 0);
  CHECK(doubled == 0);
  CHECK(stray == 0);
  CHECK(left == 0);
  const auto triangle = static_cast<std::uint64_t>(total) * static_cast<std::uint64_t>(total + 1) / 2;
  CHECK(sent_sum == triangle);
  CHECK(received_sum == triangle);
  CHECK(tally.recv > 0);
  CHECK(tally.send > 0);
  CHECK(tally.event > 0);
  CHECK(tally.timed_out > 0);
  CHECK(tally.drained_timeouts == 4);
  CHECK(tally.stopped == 3);
  CHECK(tally.none > 0);
  CHECK_ISOLATED(h);
}
