// SPDX-License-Identifier: Apache-2.0
// Generates a fuzz program from its seed: the fiber tree, each fiber's
// cookie / pin / stack / ending, and its operation list. Deterministic in the
// seed (a splitmix64 stream, no std:: distributions whose output differs
// between standard libraries).
#include "fuzz_program.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <string>

namespace fuzz {

const char* to_string(OpKind k) noexcept {
  switch (k) {
  case OpKind::spawn: return "spawn";
  case OpKind::join_pending: return "join_pending";
  case OpKind::set_cookie: return "set_cookie";
  case OpKind::yield: return "yield";
  case OpKind::preempt: return "preempt_point";
  case OpKind::sleep: return "sleep_for";
  case OpKind::burn: return "burn";
  case OpKind::mutex: return "mutex";
  case OpKind::semaphore: return "semaphore";
  case OpKind::channel: return "channel";
  case OpKind::event: return "event";
  case OpKind::pipe: return "pipe";
  case OpKind::wait_group: return "wait_group";
  case OpKind::latch: return "latch";
  case OpKind::throw_catch: return "throw_catch";
  case OpKind::io_sleep: return "io_sleep";
  case OpKind::set_weight: return "set_weight";
  case OpKind::timed_wait: return "timed_wait";
  case OpKind::fiber_local: return "fiber_local";
  case OpKind::blocking_call: return "blocking_call";
  case OpKind::select: return "select";
  }
  return "?";
}

namespace {

class Rng {
public:
  explicit Rng(std::uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n).
  int below(int n) noexcept { return n <= 1 ? 0 : static_cast<int>(next() % static_cast<std::uint64_t>(n)); }
  /// True with probability pct/100.
  bool chance(int pct) noexcept { return below(100) < pct; }

private:
  std::uint64_t s_;
};

constexpr int kMaxDepth = 4;

class Generator {
public:
  Generator(Program& p, unsigned pus, std::uint32_t without) : p_(p), rng_(p.seed), pus_(pus), without_(without) {}

  void run() {
    const int ncookies = 2 + rng_.below(4);
    wide_weights_ = on(f_weights) && Rng(p_.seed ^ 0x3E16B7u).chance(50);
    p_.cookies.push_back(coresched::Cookie{}); // untagged is a cookie like any other
    for (int i = 1; i < ncookies; ++i)
      p_.cookies.push_back(on(f_weights) && rng_.chance(50) ? coresched::Cookie::create("", weight())
                                                             : coresched::Cookie::create());
    p_.mutexes = 1 + rng_.below(3);
    for (int i = 0, n = 1 + rng_.below(2); i < n; ++i) p_.semaphore_units.push_back(1 + rng_.below(2));
    budget_ = 20 + rng_.below(180);
    shared_for_select();
    auto& o = p_.options;
    o.stall_threshold = std::chrono::milliseconds(0); // burns are deliberate; two PUs share each CPU here
    o.slice = std::chrono::microseconds(100 + 100 * rng_.below(10));
    o.policy = rng_.chance(50) ? coresched::FairnessPolicy::core_vruntime : coresched::FairnessPolicy::forceidle_balance;
    o.placement = rng_.chance(70) ? coresched::Placement::mask : coresched::Placement::scan;
    int nrivals = on(f_rivals) ? rng_.below(5) : 0;
    if (wide_weights_) nrivals = 0; // see weight()
    for (int i = 0; i < nrivals; ++i) {
      Program::Rival r{rng_.below(static_cast<int>(p_.cookies.size())), std::nullopt};
      if (rng_.chance(30) && on(f_pin)) r.pin = static_cast<unsigned>(rng_.below(static_cast<int>(pus_)));
      p_.rivals.push_back(r);
    }
    const int roots = 1 + rng_.below(5);
    for (int r = 0; r < roots && budget_ > 0; ++r) {
      const bool joined = rng_.chance(75) || !on(f_detach); // by the main thread, a plain thread
      p_.roots.push_back({fiber(-1, 0, Role::normal, joined ? JoinMode::now : JoinMode::detach_option), joined});
    }
    if (on(f_runtimes)) split_runtimes();
  }

  // The channels and events select ops meet over. From a stream of its own,
  // so that the rest of a seed's program does not depend on them.
  void shared_for_select() {
    Rng rng(p_.seed ^ 0x5E1EC7u);
    for (int i = 0, n = 1 + rng.below(3); i < n; ++i) p_.select_channels.push_back(rng.below(4));
    p_.select_events = 1 + rng.below(2);
  }

  // Half of the programs on machines of two cores or more run on two
  // runtimes, each on cores of its own. From a stream of its own, so that the
  // rest of a seed's program is the same as with one runtime.
  void split_runtimes() {
    Rng rng(p_.seed ^ 0x5EC0DD2u);
    if (!rng.chance(50)) return;
    const coresched::Topology t = coresched::Topology::discover(p_.options.topology);
    const std::size_t ncores = t.cores().size();
    if (ncores < 2) return;
    unsigned first_pus = 0;
    for (std::size_t c = 0; c < ncores; ++c)
      for (unsigned pu : t.cores()[c].pus) {
        const bool first = c < ncores / 2;
        std::string& list = p_.cpus[first ? 0 : 1];
        list += (list.empty() ? "" : ",") + std::to_string(t.pus()[pu].os_index);
        first_pus += first;
      }
    for (auto& r : p_.rivals)
      if (r.pin) r.pin = *r.pin % first_pus;
    for (auto& f : p_.fibers) {
      if (f.pin) f.pin = *f.pin % first_pus;
      else if (rng.chance(35)) f.runtime = 1;
    }
  }

private:
  // A new fiber spec (and, recursively, the fibers its operations spawn);
  // returns its index. `join` is how its spawner will treat it.
  int fiber(int parent, int depth, Role role, JoinMode join) {
    --budget_;
    const int idx = static_cast<int>(p_.fibers.size());
    p_.fibers.emplace_back();
    FiberSpec f;
    f.parent = parent;
    f.role = role;
    f.join = join;
    if (parent < 0 || rng_.chance(45)) f.cookie = rng_.below(static_cast<int>(p_.cookies.size()));
    if (rng_.chance(12) && on(f_pin)) f.pin = static_cast<unsigned>(rng_.below(static_cast<int>(pus_)));
    if (rng_.chance(25) && on(f_stack)) {
      static constexpr std::size_t kStacks[] = {32 * 1024, 128 * 1024, 256 * 1024, 512 * 1024};
      f.stack = kStacks[rng_.below(4)];
    }
    // Half of its stack at most (and 200 KiB), the rest for the body's own
    // frames. Each fiber is owed its whole ask wherever it runs, inline below
    // a joiner's frames too.
    const std::size_t size = f.stack.value_or(coresched::default_stack_size);
    const std::size_t room = std::min<std::size_t>(size / 2, 200 * 1024);
    if (size >= 128 * 1024 && rng_.chance(60)) f.stack_use = room;
    else if (size >= 64 * 1024 && rng_.chance(30)) f.stack_use = room / 2;
    const bool detached = join == JoinMode::detach_option || join == JoinMode::detach_call;
    if (role == Role::normal) {
      f.throws = rng_.chance(15) && on(f_throw);
      if (detached && !f.throws && rng_.chance(12) && on(f_long_wait)) f.long_wait = static_cast<LongWait>(1 + rng_.below(3));
    }
    const bool simple_only = role != Role::normal || depth >= kMaxDepth;
    const int nops = role == Role::normal ? 2 + rng_.below(10) : rng_.below(4);
    for (int i = 0; i < nops; ++i) f.ops.push_back(op(idx, depth, simple_only));
    p_.fibers[static_cast<std::size_t>(idx)] = std::move(f);
    return idx;
  }

  /// Weights up to 100:1 apart, or over the whole range (1 to 10,000) in
  /// programs without rivals. A rival is busy until the program ends, so a
  /// cookie of weight w beside one of weight r gets w / (w + r) of their core:
  /// at 1:10,000 the program's light fibers take 10,000 times their work in
  /// wall time, past any watchdog. That is the promise, not a hang; the
  /// programs' own fibers all end, so they may be weighted as far apart as
  /// the API allows.
  std::uint32_t weight() {
    static constexpr std::uint32_t kNarrow[] = {25, 50, 100, 150, 200, 500, 1000, 2500};
    static constexpr std::uint32_t kWide[] = {1, 10, 50, 100, 500, 1000, 5000, 10000};
    return (wide_weights_ ? kWide : kNarrow)[rng_.below(8)];
  }

  Op simple() {
    Op o;
    switch (rng_.below(6)) {
    case 0:
      o.kind = on(f_set_cookie) ? OpKind::set_cookie : OpKind::yield;
      o.a = rng_.below(static_cast<int>(p_.cookies.size()));
      if (on(f_weights) && o.a > 0 && rng_.chance(30)) {
        o.kind = OpKind::set_weight;
        o.b = static_cast<int>(weight());
      }
      break;
    case 1: o.kind = OpKind::yield; break;
    case 2: o.kind = OpKind::preempt; break;
    case 3: o.kind = OpKind::sleep; o.a = rng_.below(200); break;
    default: o.kind = OpKind::burn; o.a = 1 + rng_.below(50); break;
    }
    return o;
  }

  Op op(int self, int depth, bool simple_only) {
    if (simple_only || budget_ <= 0 || rng_.chance(35)) return simple();
    Op o;
    const int pick = rng_.below(100);
    auto child = [&](Role r, JoinMode j) { return fiber(self, depth + 1, r, j); };
    if (pick < 4) {
      // Short calls: each keeps its core from the other cookies while it lasts.
      if (!on(f_blocking)) return simple();
      o.kind = OpKind::blocking_call;
      o.a = rng_.below(300);
      o.b = rng_.chance(50) ? 0 : rng_.below(300);
      o.c = rng_.below(kCallKinds);
    } else if (pick < 28) {
      o.kind = OpKind::spawn;
      static constexpr JoinMode kModes[] = {JoinMode::now, JoinMode::now, JoinMode::now, JoinMode::later,
                                            JoinMode::later, JoinMode::drop, JoinMode::detach_option,
                                            JoinMode::detach_call};
      o.join = kModes[rng_.below(8)];
      if ((o.join == JoinMode::now && !on(f_join_now)) ||
          ((o.join == JoinMode::detach_option || o.join == JoinMode::detach_call) && !on(f_detach)))
        o.join = JoinMode::later;
      o.child = child(Role::normal, o.join);
    } else if (pick < 34) {
      o.kind = OpKind::join_pending;
    } else if (pick < 44) {
      o.kind = rng_.chance(50) ? OpKind::mutex : OpKind::semaphore;
      if (!on(o.kind == OpKind::mutex ? f_mutex : f_semaphore)) return simple();
      o.a = o.kind == OpKind::mutex ? rng_.below(p_.mutexes) : rng_.below(static_cast<int>(p_.semaphore_units.size()));
      for (int i = 0, n = 1 + rng_.below(3); i < n; ++i) o.inner.push_back(simple());
    } else if (pick < 52) {
      if (!on(f_channel)) return simple();
      o.kind = OpKind::channel;
      o.a = 1 + rng_.below(12);
      o.b = rng_.below(4);
      o.c = rng_.below(2);
      o.child = child(Role::channel_peer, JoinMode::now);
    } else if (pick < 58) {
      if (!on(f_event)) return simple();
      o.kind = OpKind::event;
      o.a = 1 + rng_.below(6);
      o.child = child(Role::event_peer, JoinMode::now);
    } else if (pick < 65) {
      if (!on(f_pipe)) return simple();
      o.kind = OpKind::pipe;
      o.a = 1 + rng_.below(8);
      o.child = child(Role::pipe_peer, JoinMode::now);
    } else if (pick < 70) {
      if (!on(f_wait_group) || !on(f_detach)) return simple();
      o.kind = OpKind::wait_group;
      for (int i = 0, n = 1 + rng_.below(4); i < n && budget_ > 0; ++i)
        o.members.push_back(child(Role::group_member, JoinMode::detach_option));
    } else if (pick < 75) {
      if (!on(f_latch)) return simple();
      o.kind = OpKind::latch;
      for (int i = 0, n = 1 + rng_.below(3); i < n && budget_ > 0; ++i)
        o.members.push_back(child(Role::latch_member, JoinMode::now));
    } else if (pick < 78) {
      if (!on(f_fiber_local)) return simple();
      o.kind = OpKind::fiber_local;
      o.a = rng_.below(1000);
    } else if (pick < 82) {
      if (!on(f_timed)) return simple();
      o.kind = OpKind::timed_wait;
      o.c = rng_.below(kTimedWaitKinds);
      o.a = o.c == timed_mutex ? rng_.below(p_.mutexes) : rng_.below(static_cast<int>(p_.semaphore_units.size()));
      o.b = rng_.below(200);
      if (o.c == timed_mutex || o.c == timed_semaphore)
        for (int i = 0, n = 1 + rng_.below(3); i < n; ++i) o.inner.push_back(simple());
    } else if (pick < 88) {
      if (!on(f_select)) return simple();
      o.kind = OpKind::select;
      o.a = 1 + rng_.below(6);
      o.b = rng_.below(300);
      o.c = rng_.below(kSelectBounds);
      for (int i = 0, n = rng_.below(5); i < n; ++i) o.cases.push_back(select_case());
      if (rng_.chance(70)) o.child = child(Role::select_peer, JoinMode::now);
    } else if (pick < 95) {
      if (!on(f_catch)) return simple();
      o.kind = OpKind::throw_catch;
      o.a = rng_.below(static_cast<int>(p_.cookies.size()));
      o.b = rng_.below(kCatchKinds);
      if (o.b == catch_join) o.child = child(Role::normal, JoinMode::now);
    } else {
      if (!on(f_io_sleep)) return simple();
      o.kind = OpKind::io_sleep;
      o.a = rng_.below(300);
    }
    return o;
  }

  // Mostly cases over the shared objects, which other fibers' selects (the
  // peer's above all) make ready; now and then one that is always ready.
  int select_case() {
    const int pick = rng_.below(100);
    const int kind = pick < 32 ? sc_recv : pick < 64 ? sc_send : pick < 84 ? sc_event : pick < 91 ? sc_never
                   : pick < 94 ? sc_ready : pick < 97 ? sc_closed_recv : sc_closed_send;
    const int index = kind == sc_recv || kind == sc_send ? rng_.below(static_cast<int>(p_.select_channels.size()))
                      : kind == sc_event                 ? rng_.below(p_.select_events)
                                                         : 0;
    return kind * 8 + index;
  }

  bool on(Feature f) const noexcept { return (without_ & f) == 0; }

  Program& p_;
  Rng rng_;
  unsigned pus_;
  std::uint32_t without_;
  bool wide_weights_ = false; // weight()
  int budget_ = 0;
};

} // namespace

Program generate(std::uint64_t seed, const std::string& topology, unsigned pus, std::uint32_t without) {
  Program p;
  p.seed = seed;
  p.options.topology = topology;
  Generator(p, pus, without).run();
  return p;
}

namespace {
constexpr std::pair<const char*, Feature> kFeatures[] = {
    {"stack", f_stack},         {"pin", f_pin},           {"throw", f_throw},       {"catch", f_catch},
    {"long-wait", f_long_wait}, {"rivals", f_rivals},     {"mutex", f_mutex},       {"semaphore", f_semaphore},
    {"channel", f_channel},     {"event", f_event},       {"pipe", f_pipe},         {"wait-group", f_wait_group},
    {"latch", f_latch},         {"io-sleep", f_io_sleep}, {"set-cookie", f_set_cookie}, {"detach", f_detach},
    {"join-now", f_join_now},   {"runtimes", f_runtimes}, {"weights", f_weights},
    {"timed", f_timed},         {"fiber-local", f_fiber_local}, {"blocking", f_blocking},
    {"select", f_select},
};
} // namespace

std::uint32_t parse_features(const std::string& csv) {
  std::uint32_t bits = 0;
  std::size_t at = 0;
  while (at <= csv.size()) {
    const std::size_t end = std::min(csv.find(',', at), csv.size());
    const std::string name = csv.substr(at, end - at);
    at = end + 1;
    if (name.empty()) continue;
    bool found = false;
    for (const auto& [n, f] : kFeatures)
      if (name == n) {
        bits |= f;
        found = true;
      }
    if (!found) throw std::invalid_argument("unknown feature '" + name + "' (known: " + feature_names() + ")");
  }
  return bits;
}

std::string feature_names() {
  std::string s;
  for (const auto& [n, f] : kFeatures) s += (s.empty() ? "" : ",") + std::string(n);
  return s;
}

std::string Program::describe() const {
  std::size_t ops = 0;
  int throwing = 0, waiting = 0, pinned = 0, stacks = 0;
  for (const auto& f : fibers) {
    ops += f.ops.size();
    throwing += f.throws;
    waiting += f.long_wait != LongWait::none;
    pinned += f.pin.has_value();
    stacks += f.stack.has_value();
  }
  std::string weights; // as created, or as a set_weight left them
  for (const auto& c : cookies)
    if (c.weight() != coresched::Cookie::kDefaultWeight)
      weights += (weights.empty() ? " (" : ", ") + std::string("cookie ") + c.label() + " weight " + std::to_string(c.weight());
  if (!weights.empty()) weights += ")";
  return "seed " + std::to_string(seed) + " topology \"" + options.topology + "\" policy " +
         coresched::to_string(options.policy) + " placement " + coresched::to_string(options.placement) + " slice " +
         std::to_string(options.slice.count()) + "us: " + std::to_string(fibers.size()) + " fibers (" +
         std::to_string(roots.size()) + " roots, " + std::to_string(throwing) + " throwing, " +
         std::to_string(waiting) + " left waiting for shutdown, " + std::to_string(pinned) + " pinned, " +
         std::to_string(stacks) + " with a stack size), " + std::to_string(ops) + " ops, " +
         std::to_string(cookies.size()) + " cookies" + weights + ", " + std::to_string(rivals.size()) + " rivals" +
         (cpus[1].empty() ? "" : ", two runtimes (cpus " + cpus[0] + " | " + cpus[1] + ")");
}

namespace {
const char* to_string(JoinMode j) {
  static constexpr const char* kNames[] = {"join now", "join later", "drop handle", "detached", "detach()"};
  return kNames[static_cast<int>(j)];
}
std::string op_text(const Op& o) {
  std::string t = to_string(o.kind);
  t += "(a=" + std::to_string(o.a) + " b=" + std::to_string(o.b) + " c=" + std::to_string(o.c);
  if (o.child >= 0) t += " child=" + std::to_string(o.child);
  if (o.kind == OpKind::spawn) t += std::string(" ") + to_string(o.join);
  for (int m : o.members) t += " member=" + std::to_string(m);
  for (const Op& in : o.inner) t += " [" + op_text(in) + "]";
  static constexpr const char* kCases[] = {"recv", "send", "event", "never", "ready", "closed-recv", "closed-send"};
  for (int c : o.cases) t += std::string(" case=") + kCases[c / 8] + (c / 8 <= sc_event ? std::to_string(c % 8) : "");
  return t + ")";
}
} // namespace

std::string Program::dump() const {
  static constexpr const char* kRoles[] = {"normal", "channel peer", "event peer", "pipe peer", "group member",
                                           "latch member", "select peer"};
  static constexpr const char* kWaits[] = {"", " ends waiting (sleep)", " ends waiting (io read)",
                                           " ends waiting (io sleep)"};
  std::string s = describe() + "\n";
  s += "select: " + std::to_string(select_events) + " shared event(s), shared channels of capacity";
  for (int c : select_channels) s += " " + std::to_string(c);
  s += "\n";
  for (const auto& r : rivals)
    s += "rival: cookie " + std::to_string(r.cookie) + (r.pin ? ", pinned to PU " + std::to_string(*r.pin) : "") + "\n";
  for (const auto& r : roots) s += "root fiber " + std::to_string(r.fiber) + (r.joined ? " joined by main\n" : " detached\n");
  for (std::size_t i = 0; i < fibers.size(); ++i) {
    const FiberSpec& f = fibers[i];
    s += "fiber " + std::to_string(i) + ": parent " + std::to_string(f.parent) + ", " + kRoles[static_cast<int>(f.role)] +
         ", " + to_string(f.join) + ", cookie " + (f.cookie ? std::to_string(*f.cookie) : std::string("inherited"));
    if (f.pin) s += ", pinned to PU " + std::to_string(*f.pin);
    if (f.runtime) s += ", in the second runtime";
    if (f.stack) s += ", stack " + std::to_string(*f.stack / 1024) + " KiB";
    if (f.stack_use) s += ", uses " + std::to_string(f.stack_use / 1024) + " KiB";
    if (f.throws) s += ", throws";
    s += kWaits[static_cast<int>(f.long_wait)];
    s += "\n";
    for (const Op& o : f.ops) s += "    " + op_text(o) + "\n";
  }
  return s;
}

} // namespace fuzz
