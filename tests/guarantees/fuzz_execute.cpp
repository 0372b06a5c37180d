// SPDX-License-Identifier: Apache-2.0
// A fuzz program's fibers: each body runs its operations through the public
// API only and checks what the application can see. Every fiber body runs
// inside an oracle Scope holding the cookie the program believes the fiber
// has; every switch point goes through Scope::around().
#include "fuzz_execution.hpp"

#include <chrono>
#include <deque>
#include <stop_token>
#include <fcntl.h>
#include <thread>
#include <unistd.h>

namespace fuzz {

namespace {

/// What fibers throw: whose exception it is, and which throw (0: the fiber's last act).
struct Tagged {
  std::uint64_t seed;
  int fiber;
  std::uint64_t tag;
};

bool current_is(const Tagged& want) {
  const std::exception_ptr p = std::current_exception();
  if (!p) return false;
  try {
    std::rethrow_exception(p);
  } catch (const Tagged& t) {
    return t.seed == want.seed && t.fiber == want.fiber && t.tag == want.tag;
  } catch (...) {
    return false;
  }
}

/// Whose exception is being handled now, for failure messages.
std::string describe_current() {
  const std::exception_ptr p = std::current_exception();
  if (!p) return "none";
  try {
    std::rethrow_exception(p);
  } catch (const Tagged& t) {
    return "fiber " + std::to_string(t.fiber) + "'s (tag " + std::to_string(t.tag) + ")";
  } catch (...) {
    return "a foreign one";
  }
}

[[gnu::noinline]] int use_stack(std::size_t n) {
  volatile char* buf = static_cast<volatile char*>(__builtin_alloca(n));
  for (std::size_t i = 0; i < n; i += 256) buf[i] = static_cast<char>(i);
  return buf[n / 2];
}

struct ChannelCtx {
  ChannelCtx(std::size_t cap, int n, int dir) : ch(cap), items(n), to_peer(dir == 0) {}
  Channel<std::uint64_t> ch;
  int items;
  bool to_peer;
};
struct EventCtx {
  explicit EventCtx(int n) : rounds(n) {}
  Event ping, pong;
  int rounds;
};
struct PipeCtx {
  int w, items;
};

std::uint64_t triangle(int n) { return static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(n + 1) / 2; }

} // namespace

// ---- spawning and joining

auto Execution::Impl::spawn_fiber(int idx, Cookie expect, void* ctx, bool detached) -> JoinHandle<Result> {
  const FiberSpec& f = p.fibers[static_cast<std::size_t>(idx)];
  SpawnOptions o;
  if (f.cookie) o.cookie = p.cookies[static_cast<std::size_t>(*f.cookie)];
  o.pin_to_pu = f.pin;
  if (f.stack) o.stack_size = *f.stack * kStackFactor;
  o.detached = detached;
  auto fn = [this, idx, expect, ctx, probe = Probe(this, idx)]() { return body(idx, expect, ctx); };
  return (f.runtime ? *rt2 : *rt).spawn(std::move(fn), o); // across runtimes too: the cookie is inherited
}

Cookie Execution::Impl::expected_cookie(int child, const Scope* parent) const {
  const FiberSpec& f = p.fibers[static_cast<std::size_t>(child)];
  if (f.cookie) return p.cookies[static_cast<std::size_t>(*f.cookie)];
  return parent ? parent->cookie() : Cookie{};
}

/// Joins `h` (from fiber `self` through its scope, or from the main thread)
/// and checks it returns exactly the child's value or its own exception.
void Execution::Impl::check_join(Scope* s, int self, JoinHandle<Result>& h, int child, std::uint64_t expect) {
  const FiberSpec& c = p.fibers[static_cast<std::size_t>(child)];
  try {
    Result r = s ? at(*s, self, __LINE__, [&] { return h.join(); }) : h.join();
    r.adopt(self);
    if (c.throws) fail("join of " + who(child) + " returned a value, but that fiber threw");
    else if (r.value != expect)
      fail("join of " + who(child) + " returned " + std::to_string(r.value) + ", expected " + std::to_string(expect));
  } catch (const Tagged& t) {
    if (!c.throws || t.seed != p.seed || t.fiber != child || t.tag != 0)
      fail("join of " + who(child) + " threw the exception of fiber " + std::to_string(t.fiber) + " (tag " +
           std::to_string(t.tag) + ")" + (c.throws ? "" : "; it threw none"));
  } catch (const std::exception& e) {
    fail("join of " + who(child) + " threw " + e.what());
  }
}

void Execution::Impl::set_cookie(Scope& s, int self, Cookie c) {
  s.set_cookie(c);
  recs[static_cast<std::size_t>(self)].cookie.store(c.value());
}

/// What the program did agrees with what the runtime says.
void Execution::Impl::verify(const Scope& s, int self, const char* where) {
  const FiberSpec& f = p.fibers[static_cast<std::size_t>(self)];
  if (this_fiber::cookie() != s.cookie())
    fail(who(self) + " " + where + ": this_fiber::cookie() is " + std::to_string(this_fiber::cookie().value()) +
         ", the program's is " + std::to_string(s.cookie().value()));
  if (f.pin && s.pu() != static_cast<int>(*f.pin))
    fail(who(self) + " " + where + ": pinned to PU " + std::to_string(*f.pin) + " but runs on " +
         std::to_string(s.pu()));
  if (const int want = recs[static_cast<std::size_t>(self)].local.load(); want >= 0) {
    const LocalTag* t = local_tag.get();
    if (!t || t->self != self || t->value != want)
      fail(who(self) + " " + where + ": its FiberLocal value is " +
           (t ? "fiber " + std::to_string(t->self) + "'s " + std::to_string(t->value) : std::string("gone")) +
           ", not its own " + std::to_string(want));
  }
}

// ---- the fiber body

auto Execution::Impl::body(int self, Cookie believed, void* ctx) -> Result {
  Rec& r = recs[static_cast<std::size_t>(self)];
  const FiberSpec& f = p.fibers[static_cast<std::size_t>(self)];
  if (r.runs.fetch_add(1) != 0) fail(who(self) + " ran more than once");
  r.cookie.store(believed.value());
  Scope s(*oracle, believed, "fuzz fiber");
  verify(s, self, "at start");
  // A new fiber handles no exception, whoever spawned or joined it (an inline
  // join runs it on a joiner that may be inside a catch block or unwinding).
  if (std::current_exception() || std::uncaught_exceptions() != 0)
    fail(who(self) + " starts with an exception being handled (" + describe_current() + ") or " +
         std::to_string(std::uncaught_exceptions()) + " in flight");
  if (f.stack_use) (void)use_stack(f.stack_use);
  std::deque<Pending> pending;
  for (std::size_t i = 0; i < f.ops.size(); ++i) {
    r.op.store(static_cast<int>(i));
    run_op(s, self, f.ops[i], pending);
    verify(s, self, to_string(f.ops[i].kind));
    events.fetch_add(1, std::memory_order_relaxed);
  }
  r.op.store(-2);
  while (!pending.empty()) join_front(s, self, pending);
  const std::uint64_t value = role_action(s, self, ctx);
  if (f.long_wait != LongWait::none) long_wait(s, self, f.long_wait);
  r.done.store(1);
  if (f.throws) throw Tagged{p.seed, self, 0};
  // detach() or a dropped handle after the fiber finished hands the result to
  // the handle's owner (the runtime destroys it there, by design): inert.
  const bool handle_decides = f.join == JoinMode::drop || f.join == JoinMode::detach_call;
  return Result(handle_decides ? nullptr : this, self, value,
                f.join == JoinMode::detach_option ? "detached fiber's result destructor" : "result destructor");
}

void Execution::Impl::join_front(Scope& s, int self, std::deque<Pending>& pending) {
  Pending x = std::move(pending.front());
  pending.pop_front();
  check_join(&s, self, x.h, x.child, value_of(x.child));
}

void Execution::Impl::run_simple(Scope& s, int self, const Op& op) {
  switch (op.kind) {
  case OpKind::set_cookie: set_cookie(s, self, p.cookies[static_cast<std::size_t>(op.a)]); break;
  case OpKind::set_weight: p.cookies[static_cast<std::size_t>(op.a)].set_weight(static_cast<std::uint32_t>(op.b)); break;
  case OpKind::yield: s.yield(); break;
  case OpKind::preempt: s.preempt_point(); break;
  case OpKind::sleep: s.sleep_for(std::chrono::microseconds(op.a)); break;
  case OpKind::burn: s.burn(std::chrono::microseconds(op.a)); break;
  default: fail("not a simple op: " + std::string(to_string(op.kind))); break;
  }
}

void Execution::Impl::run_op(Scope& s, int self, const Op& op, std::deque<Pending>& pending) {
  switch (op.kind) {
  case OpKind::spawn: {
    auto h = at(s, self, __LINE__, [&] {
      return spawn_fiber(op.child, expected_cookie(op.child, &s), nullptr, op.join == JoinMode::detach_option);
    });
    switch (op.join) {
    case JoinMode::now: check_join(&s, self, h, op.child, value_of(op.child)); break;
    case JoinMode::later: pending.push_back({op.child, std::move(h)}); break;
    case JoinMode::drop: at(s, self, __LINE__, [&] { JoinHandle<Result> dropped = std::move(h); }); break;
    case JoinMode::detach_call: h.detach(); break;
    case JoinMode::detach_option:
      if (h.joinable()) fail("a detached spawn returned a joinable handle");
      break;
    }
    break;
  }
  case OpKind::join_pending:
    if (!pending.empty()) join_front(s, self, pending);
    break;
  case OpKind::mutex:
    at(s, self, __LINE__, [&] { mutexes[static_cast<std::size_t>(op.a)]->lock(); });
    holding_mutex(s, self, op);
    break;
  case OpKind::semaphore:
    at(s, self, __LINE__, [&] { sems[static_cast<std::size_t>(op.a)]->acquire(); });
    holding_unit(s, self, op);
    break;
  case OpKind::channel: channel(s, self, op); break;
  case OpKind::timed_wait: timed_wait(s, self, op); break;
  case OpKind::select: select_op(s, self, op); break;
  case OpKind::blocking_call: {
    const bool pinned = p.fibers[static_cast<std::size_t>(self)].pin.has_value();
    const std::string e = run_blocking_call(s, op, value_of(self), pinned);
    if (!e.empty()) fail(who(self) + ": " + e);
    break;
  }
  case OpKind::fiber_local:
    locals_made.fetch_add(1);
    local_tag.reset(new LocalTag{this, self, op.a}); // destroys the one it had, here
    recs[static_cast<std::size_t>(self)].local.store(op.a);
    break;
  case OpKind::event: {
    EventCtx ctx(op.a);
    auto h = at(s, self, __LINE__, [&] { return spawn_fiber(op.child, expected_cookie(op.child, &s), &ctx, false); });
    for (int i = 0; i < op.a; ++i) {
      ctx.ping.set();
      at(s, self, __LINE__, [&] { ctx.pong.wait(); });
      ctx.pong.reset();
    }
    check_join(&s, self, h, op.child, static_cast<std::uint64_t>(op.a));
    break;
  }
  case OpKind::pipe: pipe(s, self, op); break;
  case OpKind::wait_group: {
    WaitGroup wg;
    wg.add(static_cast<std::int64_t>(op.members.size()));
    for (int m : op.members) at(s, self, __LINE__, [&] { spawn_fiber(m, expected_cookie(m, &s), &wg, true); });
    at(s, self, __LINE__, [&] { wg.wait(); });
    break;
  }
  case OpKind::latch: {
    Latch latch(static_cast<std::ptrdiff_t>(op.members.size() + 1));
    std::vector<Pending> hs;
    for (int m : op.members)
      hs.push_back({m, at(s, self, __LINE__, [&] { return spawn_fiber(m, expected_cookie(m, &s), &latch, false); })});
    at(s, self, __LINE__, [&] { latch.arrive_and_wait(); });
    for (auto& x : hs) check_join(&s, self, x.h, x.child, value_of(x.child));
    break;
  }
  case OpKind::throw_catch: throw_catch(s, self, op); break;
  case OpKind::io_sleep: {
    const auto r = at(s, self, __LINE__, [&] { return io::sleep_until(std::chrono::steady_clock::now() + std::chrono::microseconds(op.a)); });
    if (!r) fail(who(self) + ": io::sleep_until failed: " + r.error.message());
    break;
  }
  default: run_simple(s, self, op); break;
  }
}

// Holding mutex op.a: checks it is ours alone, runs `inner`, unlocks.
void Execution::Impl::holding_mutex(Scope& s, int self, const Op& op) {
  const auto k = static_cast<std::size_t>(op.a);
  if (mutex_holder[k].exchange(self + 1) != 0) fail(who(self) + " got mutex " + std::to_string(k) + " while held");
  for (const Op& in : op.inner) run_simple(s, self, in);
  mutex_holder[k].store(0);
  mutexes[k]->unlock();
}

// Holding a unit of semaphore op.a: checks the count holds, runs `inner`, releases.
void Execution::Impl::holding_unit(Scope& s, int self, const Op& op) {
  const auto k = static_cast<std::size_t>(op.a);
  if (sem_holders[k].fetch_add(1) >= p.semaphore_units[k])
    fail(who(self) + " got a unit of semaphore " + std::to_string(k) + " beyond its count");
  for (const Op& in : op.inner) run_simple(s, self, in);
  sem_holders[k].fetch_sub(1);
  sems[k]->release();
}

// A timed lock or acquire may succeed or time out (holders run simple ops
// only, so it ends either way); a wait on what is never ready must time
// out, not before its time; a stopped wait must end, stopped.
void Execution::Impl::timed_wait(Scope& s, int self, const Op& op) {
  const auto d = std::chrono::microseconds(op.b);
  const auto k = static_cast<std::size_t>(op.a);
  const auto t0 = std::chrono::steady_clock::now();
  auto early = [&](const char* what) {
    if (std::chrono::steady_clock::now() - t0 < d)
      fail(who(self) + ": " + what + " timed out before its " + std::to_string(op.b) + " us");
  };
  switch (op.c) {
  case timed_mutex:
    if (at(s, self, __LINE__, [&] { return mutexes[k]->try_lock_for(d); })) holding_mutex(s, self, op);
    else early("Mutex::try_lock_for");
    break;
  case timed_semaphore:
    if (at(s, self, __LINE__, [&] { return sems[k]->try_acquire_for(d); })) holding_unit(s, self, op);
    else early("Semaphore::try_acquire_for");
    break;
  case timed_event: {
    Event never;
    if (at(s, self, __LINE__, [&] { return never.wait_for(d); })) fail(who(self) + ": an Event never set was seen set");
    early("Event::wait_for");
    break;
  }
  case timed_recv: {
    Channel<int> empty(static_cast<std::size_t>(op.a));
    if (at(s, self, __LINE__, [&] { return empty.recv_for(d); })) fail(who(self) + ": recv_for on an empty channel got an item");
    early("Channel::recv_for");
    break;
  }
  case stopped_event: {
    Event never;
    std::stop_source src;
    std::thread stopper([&] {
      std::this_thread::sleep_for(d);
      src.request_stop();
    });
    const bool set = at(s, self, __LINE__, [&] { return never.wait(src.get_token()); });
    stopper.join();
    if (set || !src.stop_requested()) fail(who(self) + ": a stopped Event::wait did not end stopped");
    break;
  }
  default: fail("unknown timed wait kind " + std::to_string(op.c)); break;
  }
}

// Selects over the program's shared channels and events (fuzz_select.cpp),
// beside a peer (if the op has one) that selects over the mirrored cases.
void Execution::Impl::select_op(Scope& s, int self, const Op& op) {
  JoinHandle<Result> h;
  if (op.child >= 0)
    h = at(s, self, __LINE__, [&] {
      return spawn_fiber(op.child, expected_cookie(op.child, &s), const_cast<Op*>(&op), false);
    });
  const std::string e = room->run(s, op, false, recs[static_cast<std::size_t>(self)].line);
  if (!e.empty()) fail(who(self) + ": " + e);
  if (op.child >= 0) check_join(&s, self, h, op.child, value_of(op.child));
}

void Execution::Impl::channel(Scope& s, int self, const Op& op) {
  ChannelCtx ctx(static_cast<std::size_t>(op.b), op.a, op.c);
  auto h = at(s, self, __LINE__, [&] { return spawn_fiber(op.child, expected_cookie(op.child, &s), &ctx, false); });
  std::uint64_t sum = 0;
  for (int i = 1; i <= op.a; ++i) {
    if (ctx.to_peer) {
      if (!at(s, self, __LINE__, [&] { return ctx.ch.send(static_cast<std::uint64_t>(i)); })) fail(who(self) + ": send failed");
    } else {
      const auto v = at(s, self, __LINE__, [&] { return ctx.ch.recv(); });
      if (!v) fail(who(self) + ": recv on an open channel returned nothing");
      else sum += *v;
    }
  }
  if (!ctx.to_peer && sum != triangle(op.a)) fail(who(self) + ": channel items lost or duplicated");
  check_join(&s, self, h, op.child, triangle(op.a));
  ctx.ch.close();
  if (ctx.ch.try_recv()) fail(who(self) + ": a drained closed channel still had an item");
}

void Execution::Impl::pipe(Scope& s, int self, const Op& op) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    fail("pipe2 failed");
    return;
  }
  PipeCtx ctx{fds[1], op.a};
  auto h = at(s, self, __LINE__, [&] { return spawn_fiber(op.child, expected_cookie(op.child, &s), &ctx, false); });
  for (int i = 1; i <= op.a; ++i) {
    std::uint64_t v = 0;
    const auto r = at(s, self, __LINE__, [&] { return io::read(fds[0], std::as_writable_bytes(std::span(&v, 1))); });
    if (!r || r.value != sizeof v || v != static_cast<std::uint64_t>(i))
      fail(who(self) + ": pipe read " + std::to_string(i) + " got " + std::to_string(v) + " (" + r.error.message() + ")");
  }
  check_join(&s, self, h, op.child, static_cast<std::uint64_t>(op.a));
  for (int fd : fds) {
    const auto r = at(s, self, __LINE__, [fd] { return io::close(fd); });
    if (!r) fail(who(self) + ": io::close failed: " + r.error.message());
  }
}

// A suspension inside the catch block: other fibers on this worker throw and
// catch their own exceptions meanwhile; ours must still be the one handled.
void Execution::Impl::throw_catch(Scope& s, int self, const Op& op) {
  const Tagged mine{p.seed, self, 1 + events.fetch_add(1, std::memory_order_relaxed)};
  try {
    throw mine;
  } catch (const Tagged& e) {
    switch (op.b) {
    case catch_yield: s.yield(); break;
    case catch_sleep: s.sleep_for(30us); break;
    case catch_mutex:
      at(s, self, __LINE__, [&] { mutexes[0]->lock(); });
      s.yield();
      mutexes[0]->unlock();
      break;
    case catch_io_sleep: at(s, self, __LINE__, [] { (void)io::sleep_until(std::chrono::steady_clock::now() + 20us); }); break;
    case catch_set_cookie: set_cookie(s, self, p.cookies[static_cast<std::size_t>(op.a)]); break;
    case catch_join: {
      auto h = at(s, self, __LINE__, [&] { return spawn_fiber(op.child, expected_cookie(op.child, &s), nullptr, false); });
      check_join(&s, self, h, op.child, value_of(op.child));
      break;
    }
    }
    if (e.tag != mine.tag || !current_is(mine))
      fail(who(self) + ": after suspending in a catch block, current_exception() is " + describe_current() +
           ", not its own");
    try {
      throw;
    } catch (const Tagged& again) {
      if (again.tag != mine.tag || again.fiber != self) fail(who(self) + ": `throw;` rethrew another fiber's exception");
      s.yield();
      if (!current_is(mine)) fail(who(self) + ": current_exception() changed in a nested catch");
    } catch (...) {
      fail(who(self) + ": `throw;` rethrew something else");
    }
  }
  if (std::current_exception())
    fail(who(self) + ": after its catch block, current_exception() is still " + describe_current());
}

// What a partner fiber does once its own ops are done; returns its value.
std::uint64_t Execution::Impl::role_action(Scope& s, int self, void* ctx) {
  switch (p.fibers[static_cast<std::size_t>(self)].role) {
  case Role::normal: break;
  case Role::channel_peer: {
    auto& c = *static_cast<ChannelCtx*>(ctx);
    std::uint64_t sum = 0;
    for (int i = 1; i <= c.items; ++i) {
      if (c.to_peer) {
        const auto v = at(s, self, __LINE__, [&] { return c.ch.recv(); });
        if (v) sum += *v;
      } else if (at(s, self, __LINE__, [&] { return c.ch.send(static_cast<std::uint64_t>(i)); })) {
        sum += static_cast<std::uint64_t>(i);
      }
    }
    return sum;
  }
  case Role::event_peer: {
    auto& e = *static_cast<EventCtx*>(ctx);
    for (int i = 0; i < e.rounds; ++i) {
      at(s, self, __LINE__, [&] { e.ping.wait(); });
      e.ping.reset();
      s.burn(2us);
      e.pong.set();
    }
    return static_cast<std::uint64_t>(e.rounds);
  }
  case Role::pipe_peer: {
    auto& pc = *static_cast<PipeCtx*>(ctx);
    for (int i = 1; i <= pc.items; ++i) {
      const std::uint64_t v = static_cast<std::uint64_t>(i);
      const auto r = at(s, self, __LINE__, [&] { return io::write(pc.w, std::as_bytes(std::span(&v, 1))); });
      if (!r || r.value != sizeof v) fail(who(self) + ": pipe write failed: " + r.error.message());
    }
    return static_cast<std::uint64_t>(pc.items);
  }
  case Role::group_member: static_cast<WaitGroup*>(ctx)->done(); break; // its last touch of the group
  case Role::select_peer: {
    const std::string e = room->run(s, *static_cast<const Op*>(ctx), true, recs[static_cast<std::size_t>(self)].line);
    if (!e.empty()) fail(who(self) + ": " + e);
    break;
  }
  case Role::latch_member: at(s, self, __LINE__, [&] { static_cast<Latch*>(ctx)->arrive_and_wait(); }); break;
  }
  return value_of(self);
}

// A detached fiber's last act: a wait that only shutdown ends.
void Execution::Impl::long_wait(Scope& s, int self, LongWait how) {
  recs[static_cast<std::size_t>(self)].long_waiting.store(true); // no switch point from here to the wait
  const auto far = std::chrono::steady_clock::now() + 1h;
  io::Result r;
  switch (how) {
  case LongWait::sleep: at(s, self, __LINE__, [] { this_fiber::sleep_for(1h); }); break;
  case LongWait::io_read: {
    std::byte b[8];
    r = at(s, self, __LINE__, [&] { return io::read(idle_pipe[0], b); });
    break;
  }
  case LongWait::io_sleep: r = at(s, self, __LINE__, [&] { return io::sleep_until(far); }); break;
  case LongWait::none: break;
  }
  if (how != LongWait::sleep && r.error != std::errc::operation_canceled)
    fail(who(self) + ": a wait cut short by shutdown returned '" + r.error.message() + "', not operation_canceled");
  if (std::chrono::steady_clock::now() >= far) fail(who(self) + ": shutdown did not end its wait");
  s.burn(5us);
}

} // namespace fuzz
