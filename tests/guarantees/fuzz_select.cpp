// SPDX-License-Identifier: Apache-2.0
// The fuzzer's select op. A program has a few channels (buffered and not,
// never closed) and events that every select op shares; an op selects over
// some of them, and over objects of its own that are always ready (an event
// set, a closed channel) or never (an event never set), for a few rounds,
// each bounded by a deadline, a try or a stop token that a plain thread
// stops: it cannot hang. Its peer, if it has one, selects over the mirrored
// cases (a send for a receive, and sets the events the op waits on), so that
// most selects meet another. Every select is a switch point of the fiber and
// goes through Scope::around().
//
// Each select checks its own result: exactly the chosen case happened (a
// chosen receive from an open channel got an item, one not chosen got none;
// a chosen send moved its item out and says so, one not chosen left it in
// place; a closed channel's cases are ready and move nothing), a select with
// a case always ready never times out, a deadline is never early, a stop
// only after the request. The program's ledger then checks that every item
// sent on a shared channel was received exactly once (settle()).
#include "fuzz_program.hpp"

#include <chrono>
#include <initializer_list>
#include <span>
#include <stop_token>
#include <thread>
#include <utility>

namespace fuzz {

using namespace coresched;

namespace {

using Clock = std::chrono::steady_clock;

// An item whose move empties its source (v 0): a send case that happened
// must have moved its item out, one that did not must have left it whole.
struct Item {
  explicit Item(std::uint64_t x) noexcept : v(x) {}
  Item(Item&& o) noexcept : v(std::exchange(o.v, 0)) {}
  Item& operator=(Item&&) = delete;
  std::uint64_t v;
};

// Every item offered carries the tag in its high bits: a received value
// without it is a moved-from item or garbage.
constexpr std::uint64_t kTagMask = 0xFFFFFull << 44;
constexpr std::uint64_t kTag = 0x5E1ECull << 44;

std::uint64_t mix(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Count, sum and a sum of hashes: equal for sent and received only if the
// same items went through (a lost item and a doubled one do not cancel out).
struct Ledger {
  std::atomic<std::uint64_t> n{0}, sum{0}, hashes{0};
  void add(std::uint64_t v) noexcept {
    n.fetch_add(1);
    sum.fetch_add(v);
    hashes.fetch_add(mix(v));
  }
};

constexpr std::size_t kMaxCases = 4; // fuzz_generate.cpp draws 0-4

// select_for, select_until and try_select take a braced list: the op's
// cases as one, by their number.
template <class F> int with_list(const std::vector<SelectCase>& c, F&& f) {
  switch (c.size()) {
  case 0:
    return f({});
  case 1:
    return f({c[0]});
  case 2:
    return f({c[0], c[1]});
  case 3:
    return f({c[0], c[1], c[2]});
  default:
    return f({c[0], c[1], c[2], c[3]});
  }
}

enum Tallied : int { t_recv, t_send, t_event, t_timed_out, t_stopped, t_none };

} // namespace

struct SelectRoom::Impl {
  explicit Impl(const Program& p)
      : sent(std::make_unique<Ledger[]>(p.select_channels.size())),
        received(std::make_unique<Ledger[]>(p.select_channels.size())),
        sets(std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(p.select_events))) {
    for (int cap : p.select_channels) chans.push_back(std::make_unique<Channel<Item>>(static_cast<std::size_t>(cap)));
    for (int i = 0; i < p.select_events; ++i) events.push_back(std::make_unique<Event>());
  }
  std::vector<std::unique_ptr<Channel<Item>>> chans;
  std::vector<std::unique_ptr<Event>> events;
  std::unique_ptr<Ledger[]> sent, received;           // per channel
  std::unique_ptr<std::atomic<std::uint64_t>[]> sets; // per event: how often a peer set it
  std::atomic<std::uint64_t> next{0};
  std::atomic<std::uint64_t> outcomes[6]{};
};

SelectRoom::SelectRoom(const Program& p) : impl_(std::make_unique<Impl>(p)) {}
SelectRoom::~SelectRoom() = default;

std::string SelectRoom::run(guarantees::Scope& s, const Op& op, bool peer, std::atomic<int>& where) {
  Impl& m = *impl_;
  std::string wrong;
  auto bad = [&](const std::string& w) {
    if (wrong.size() < 600) wrong += (wrong.empty() ? "" : "; ") + w;
  };
  // This side's cases: the op's, or for the peer the mirrored ones.
  std::vector<int> kinds, index;
  std::vector<int> to_set; // the peer sets these shared events before each select
  bool always_ready = false;
  for (int code : op.cases) {
    int kind = code / 8;
    if (peer && kind == sc_event) {
      to_set.push_back(code % 8);
      continue;
    }
    if (peer && (kind == sc_recv || kind == sc_send)) kind = kind == sc_recv ? sc_send : sc_recv;
    kinds.push_back(kind);
    index.push_back(code % 8);
    always_ready |= kind == sc_ready || kind == sc_closed_recv || kind == sc_closed_send;
  }
  const std::size_t n = std::min(kinds.size(), kMaxCases);
  const auto d = std::chrono::microseconds(op.b);
  Event never, ready(true);
  Channel<Item> closed(1);
  closed.close();
  std::optional<Item> got[kMaxCases];  // each receive case's
  std::optional<Item> item[kMaxCases]; // each send case's, offered again until it is sent
  std::uint64_t offered[kMaxCases] = {};
  bool ok[kMaxCases] = {};
  std::stop_source src;
  std::thread stopper;
  if (op.c == sb_stop)
    stopper = std::thread([&src, d] {
      std::this_thread::sleep_for(d);
      src.request_stop();
    });

  for (int round = 0; round < op.a; ++round) {
    for (int k : to_set) {
      m.sets[static_cast<std::size_t>(k)].fetch_add(1);
      m.events[static_cast<std::size_t>(k)]->set();
    }
    std::vector<SelectCase> cases;
    cases.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(index[i]);
      if ((kinds[i] == sc_send || kinds[i] == sc_closed_send) && !item[i]) {
        offered[i] = kTag | m.next.fetch_add(1);
        item[i].emplace(offered[i]);
      }
      ok[i] = kinds[i] == sc_closed_send; // a chosen case must flip it
      switch (kinds[i]) {
      case sc_recv:
        cases.push_back(recv_case(*m.chans[k], got[i]));
        break;
      case sc_send:
        cases.push_back(send_case(*m.chans[k], *item[i], ok[i]));
        break;
      case sc_event:
        cases.push_back(event_case(*m.events[k]));
        break;
      case sc_never:
        cases.push_back(event_case(never));
        break;
      case sc_ready:
        cases.push_back(event_case(ready));
        break;
      case sc_closed_recv:
        cases.push_back(recv_case(closed, got[i]));
        break;
      default:
        cases.push_back(send_case(closed, *item[i], ok[i]));
        break;
      }
    }
    const auto t0 = Clock::now();
    const auto until = t0 + d;
    int r = 0;
    where.store(kSelectLine + __LINE__);
    switch (op.c) {
    case sb_for:
      r = s.around(
          [&] { return with_list(cases, [&](std::initializer_list<SelectCase> l) { return select_for(l, d); }); });
      break;
    case sb_until:
      r = s.around([&] {
        return with_list(cases, [&](std::initializer_list<SelectCase> l) { return select_until(l, until); });
      });
      break;
    case sb_try:
      r = s.around([&] { return with_list(cases, [](std::initializer_list<SelectCase> l) { return try_select(l); }); });
      break;
    default:
      r = s.around([&] { return coresched::select(std::span<const SelectCase>(cases), src.get_token()); });
      break;
    }
    where.store(0);

    const std::string what = std::string(peer ? "its peer's " : "") + "select (" +
                             (op.c == sb_for     ? "select_for"
                              : op.c == sb_until ? "select_until"
                              : op.c == sb_try   ? "try_select"
                                                 : "select with a stop token") +
                             ", round " + std::to_string(round) + ")";
    const int special = op.c == sb_try ? kSelectNone : op.c == sb_stop ? kSelectStopped : kSelectTimedOut;
    if (r >= 0 && static_cast<std::size_t>(r) < n) {
      const int kind = kinds[static_cast<std::size_t>(r)];
      m.outcomes[kind == sc_recv || kind == sc_closed_recv   ? t_recv
                 : kind == sc_send || kind == sc_closed_send ? t_send
                                                             : t_event]
          .fetch_add(1);
    } else if (r == special) {
      m.outcomes[r == kSelectNone ? t_none : r == kSelectStopped ? t_stopped : t_timed_out].fetch_add(1);
      if (always_ready) bad(what + " returned " + std::to_string(r) + " with a case always ready");
      if (op.c == sb_for && r == kSelectTimedOut && Clock::now() - t0 < d) bad(what + " timed out early");
      if (op.c == sb_until && r == kSelectTimedOut && Clock::now() < until) bad(what + " timed out early");
      if (r == kSelectStopped && !src.stop_requested()) bad(what + " returned kSelectStopped before the stop request");
    } else {
      bad(what + " returned " + std::to_string(r) + " over " + std::to_string(n) + " cases");
    }
    for (std::size_t i = 0; i < n; ++i) {
      const bool chosen = static_cast<std::size_t>(r) == i && r >= 0;
      const auto k = static_cast<std::size_t>(index[i]);
      const std::string c = what + " case " + std::to_string(i);
      switch (kinds[i]) {
      case sc_recv:
        if (!chosen) {
          if (got[i]) bad(c + ", a receive not chosen, received an item");
        } else if (!got[i]) {
          bad(c + ", a chosen receive from an open channel, got nothing");
        } else if ((got[i]->v & kTagMask) != kTag) {
          bad(c + " received an item nobody sent (" + std::to_string(got[i]->v) + ")");
        } else {
          m.received[k].add(got[i]->v);
        }
        break;
      case sc_closed_recv:
        if (got[i]) bad(c + " received from a closed, empty channel");
        break;
      case sc_send:
        if (!chosen) {
          if (item[i]->v != offered[i]) bad(c + ", a send not chosen, moved its item");
          if (item[i]->v == 0) item[i].reset();
          break;
        }
        if (!ok[i]) bad(c + ", a chosen send to an open channel, says it did not send");
        if (item[i]->v != 0) bad(c + ", a chosen send, left its item in place");
        if (ok[i] && item[i]->v == 0) m.sent[k].add(offered[i]);
        item[i].reset();
        break;
      case sc_closed_send:
        if (chosen && ok[i]) bad(c + ", a send on a closed channel, says it sent");
        if (item[i]->v != offered[i]) bad(c + ", a send on a closed channel, moved its item");
        if (item[i]->v == 0) item[i].reset();
        break;
      case sc_event:
        if (!chosen) break;
        if (m.sets[k].load() == 0) bad(c + " chose a shared event nobody set");
        m.events[k]->reset(); // taken: the next select on it waits for another set
        break;
      case sc_never:
        if (chosen) bad(c + " chose an event never set");
        break;
      default:
        break;
      }
    }
    s.burn(std::chrono::microseconds(1 + round % 3));
  }
  if (stopper.joinable()) stopper.join(); // at most op.b microseconds
  return wrong;
}

std::string SelectRoom::settle() {
  Impl& m = *impl_;
  std::string wrong;
  for (std::size_t k = 0; k < m.chans.size(); ++k) {
    // What is still buffered was sent and is received here.
    while (auto x = m.chans[k]->try_recv()) {
      if ((x->v & kTagMask) != kTag)
        wrong += "shared channel " + std::to_string(k) + " held an item nobody sent; ";
      else
        m.received[k].add(x->v);
    }
    const Ledger &in = m.sent[k], &out = m.received[k];
    if (in.n.load() != out.n.load())
      wrong += "shared channel " + std::to_string(k) + " (capacity " + std::to_string(m.chans[k]->capacity()) +
               "): " + std::to_string(in.n.load()) + " items sent, " + std::to_string(out.n.load()) + " received; ";
    else if (in.sum.load() != out.sum.load() || in.hashes.load() != out.hashes.load())
      wrong += "shared channel " + std::to_string(k) + ": as many items received as sent, but not the same ones; ";
  }
  return wrong;
}

void SelectRoom::count(std::uint64_t (&out)[6]) const {
  for (int i = 0; i < 6; ++i) out[i] += impl_->outcomes[i].load();
}

} // namespace fuzz
