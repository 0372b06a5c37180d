// SPDX-License-Identifier: Apache-2.0
// coresched::this_fiber over the worker running the calling fiber.
#include "sched/scheduler.hpp"
#include "sched/worker.hpp"

#include <coresched/io.hpp>
#include <coresched/sync.hpp>
#include <coresched/this_fiber.hpp>

#include <stop_token>
#include <thread>

namespace coresched::this_fiber {

namespace {
// Reading the thread-local directly is safe here: no switch has happened yet
// in this call. Code after a switch must use Worker::current().
detail::Worker& require_fiber(const char* what) {
  detail::Worker* w = detail::tls_worker;
  if (!w || !w->in_task())
    throw UsageError(std::string("coresched::this_fiber::") + what + "() called outside a fiber");
  return *w;
}
} // namespace

bool in_fiber() noexcept {
  detail::Worker* w = detail::Worker::current();
  return w && w->in_task();
}

void yield() { require_fiber("yield").yield(); }

// Out of line on purpose: the caller must re-read the thread-local after any
// switch, which the compiler guarantees only across a real call.
// Two reasons to stop: the worker's flag (a slice over, a rival cookie's
// turn), or completions the kernel holds for this worker's ring, such as a
// sleeping fiber's timer. Without the second a fiber woken by a completion
// would wait for the ticker to set the first, up to a quarter slice.
void preempt_point() noexcept {
  // Both words read and or-ed, one branch: fewer instructions than testing
  // them in turn (the instruction budget of this path is 14). The flag is
  // read through its byte, which a bool holds as 0 or 1, so that the compiler
  // does not turn it into a bool first.
  const detail::PreemptWatch watch = detail::tls_watch;
  const unsigned stop = __atomic_load_n(reinterpret_cast<const unsigned char*>(watch.flag), __ATOMIC_RELAXED);
  const unsigned io = IO_URING_READ_ONCE(*watch.io_flags) & detail::Reactor::kReapFlags;
  if ((stop | io) == 0) [[likely]]
    return;
  detail::Worker* w = detail::Worker::current();
  if (w && w->in_task()) w->preempt();
}

void sleep_until(std::chrono::steady_clock::time_point t) {
  detail::Worker* w = detail::Worker::current();
  if (!w || !w->in_task()) {
    std::this_thread::sleep_until(t);
    return;
  }
  if (w->scheduler().stopping()) { // shutting down: sleeps end at once
    w->yield();
    return;
  }
  (void)io::sleep_until(t); // returns early only when the runtime shuts down
}

// Saturated: now() + nanoseconds::max() overflowed into the past, and the
// longest sleep returned at once.
void sleep_for(std::chrono::nanoseconds d) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point now = Clock::now();
  sleep_until(d > Clock::time_point::max() - now ? Clock::time_point::max() : now + d);
}

// A stoppable sleep is a timed wait on an event nobody sets: its stop
// request wakes the fiber straight from the requester (a Cancellation of an
// io::sleep_until would go through the worker's reactor, two hops more:
// p50 130-190 us against 30-40 us, coresched-stop-latency-bench).
bool sleep_until(std::chrono::steady_clock::time_point t, std::stop_token st) {
  if (!st.stop_possible()) {
    sleep_until(t);
    return true;
  }
  Event never;
  (void)never.wait_until(t, st);
  return !st.stop_requested() || std::chrono::steady_clock::now() >= t;
}

bool sleep_for(std::chrono::nanoseconds d, std::stop_token st) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point now = Clock::now();
  return sleep_until(d > Clock::time_point::max() - now ? Clock::time_point::max() : now + d, std::move(st));
}

std::uint64_t id() noexcept {
  detail::Worker* w = detail::Worker::current();
  return w && w->in_task() ? w->running()->id : 0;
}

Cookie cookie() noexcept {
  detail::Worker* w = detail::Worker::current();
  return w && w->in_task() ? Cookie::from_value(w->running()->cookie) : Cookie{};
}

void set_cookie(Cookie c) {
  detail::Worker& w = require_fiber("set_cookie");
  detail::check_cookie(c.value());
  w.set_cookie(c.value());
}

Location location() {
  const detail::Worker& w = require_fiber("location");
  return Location{w.index(), w.pu().core, w.pu().llc, w.pu().cpu};
}

} // namespace coresched::this_fiber
