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
#include "scheduler.hpp"
#include "worker.hpp"

#include <coresched/blocking_call.hpp>
#include <coresched/sync.hpp>

#include <pthread.h>
#include <sched.h>

namespace coresched::detail {

namespace {

struct Call {
  void (*fn)(void*) noexcept;
  void* arg;
  CoreCoordinator* held = nullptr; // the core claimed for the call; null: none needed
  cpu_set_t cpus{};
  Event done{false};
};

// On the helper thread. After done.set() the frame may be gone: the fiber
// returns as soon as it sees the event set.
void run_on_helper(void* p) noexcept {
  auto& c = *static_cast<Call*>(p);
  pthread_setaffinity_np(pthread_self(), sizeof(c.cpus), &c.cpus); // best effort: as the worker's pinning
  c.fn(c.arg);
  if (c.held) {
    WakeList wakes;
    c.held->lock().lock();
    c.held->release_hold_locked(wakes);
    c.held->lock().unlock();
    wakes.notify();
  }
  c.done.set();
}

} // namespace

void run_blocking(void (*fn)(void*) noexcept, void* arg) {
  Worker* w = Worker::current();
  if (!w || !w->in_task()) return fn(arg); // a plain thread (or a helper: a nested call) just runs it
  Scheduler& sched = w->scheduler();
  Call c{fn, arg};
  CPU_ZERO(&c.cpus);
  for (unsigned pu : sched.topology().cores()[w->pu().core].pus) CPU_SET(sched.topology().pus()[pu].cpu, &c.cpus);
  CoreCoordinator& core = w->core();
  if (!core.single_pu()) {
    core.lock().lock();
    core.hold_locked(w->running()->cookie);
    core.lock().unlock();
    c.held = &core;
  }
  sched.call_threads().run(run_on_helper, &c);
  c.done.wait();
}

} // namespace coresched::detail
