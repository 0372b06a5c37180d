// SPDX-License-Identifier: Apache-2.0
// coresched::blocking_call: the call runs on a helper thread (CallThreads)
// while its fiber waits on an Event, so the worker goes on with its other
// fibers and timers.
//
// Isolation. The call is user code of the fiber's cookie, and nothing in user
// space sees when a helper thread is on a CPU. So the helper runs only on the
// CPUs of the fiber's core, and the core stays claimed for the cookie from
// before the call starts until after it returns (CoreCoordinator::hold_locked,
// taken while the fiber itself still runs the cookie there): every sibling
// runs that cookie or nothing meanwhile, whichever of them the kernel gives
// the helper. This holds with or without the kernel's CONFIG_SCHED_CORE. A
// single-PU core has no sibling to keep off, so it holds nothing.
//
// Fairness. A call starts only within its cookie's turn on the core
// (try_hold_locked); otherwise its fiber yields, and the core passes to the
// cookie that leads once the calls in flight have returned. Without this, a
// tenant whose fibers make short calls back to back would keep the core held
// for good, and a busy tenant beside it would get none of it.
#include "platform/call_threads.hpp"
#include "sched/scheduler.hpp"
#include "sched/worker.hpp"

#include <coresched/blocking_call.hpp>
#include <coresched/sync.hpp>

#include <cerrno>
#include <pthread.h>
#include <sched.h>

namespace coresched::detail {

thread_local constinit const std::uint64_t* tls_call_cookie = nullptr;

namespace {

struct Call {
  void (*fn)(void*) noexcept;
  void* arg;
  std::uint64_t cookie = 0;
  CoreCoordinator* held = nullptr; // the core claimed for the call; null: none needed
  cpu_set_t cpus{};
  int error = 0; // errno as the call left it
  Event done{false};
};

void release(CoreCoordinator* core) noexcept {
  if (!core) return;
  WakeList wakes;
  core->lock().lock();
  core->release_hold_locked(wakes);
  core->lock().unlock();
  wakes.notify();
}

// On the helper thread. After done.set() the frame may be gone: the fiber
// returns as soon as it sees the event set.
void run_on_helper(void* p) noexcept {
  auto& c = *static_cast<Call*>(p);
  pthread_setaffinity_np(pthread_self(), sizeof(c.cpus), &c.cpus); // best effort: as the worker's pinning
  tls_call_cookie = &c.cookie; // fibers the call spawns are its tenant's
  errno = 0;
  c.fn(c.arg);
  c.error = errno;
  tls_call_cookie = nullptr;
  release(c.held);
  c.done.set();
}

// Claims the fiber's core for its cookie (none on a single-PU core), waiting
// for the cookie's turn if another leads; returns the worker it runs on then.
Worker* claim_core(Worker* w, Call& c) {
  for (;;) {
    CoreCoordinator& core = w->core();
    if (core.single_pu()) break;
    core.lock().lock();
    const bool held = core.try_hold_locked(c.cookie);
    core.lock().unlock();
    if (held) {
      c.held = &core;
      break;
    }
    w->yield();
    w = Worker::current();
  }
  const Topology& topo = w->scheduler().topology();
  CPU_ZERO(&c.cpus);
  for (unsigned pu : topo.cores()[w->pu().core].pus) CPU_SET(topo.pus()[pu].cpu, &c.cpus);
  return w;
}

} // namespace

void run_blocking(void (*fn)(void*) noexcept, void* arg) {
  Worker* w = Worker::current();
  if (!w || !w->in_task()) return fn(arg); // a plain thread (or a helper: a nested call) just runs it
  Call c{fn, arg};
  c.cookie = w->running()->cookie;
  w = claim_core(w, c);
  try {
    w->scheduler().call_threads().run(run_on_helper, &c);
  } catch (...) {
    release(c.held); // nothing of the call ran
    throw;
  }
  c.done.wait();
  errno = c.error;
}

} // namespace coresched::detail
