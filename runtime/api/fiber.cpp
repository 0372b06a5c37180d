// SPDX-License-Identifier: Apache-2.0
#include "fiber/fiber.hpp"

#include "sched/scheduler.hpp"
#include "sched/worker.hpp"

#include <new>

namespace coresched::detail {

void release_join(JoinRecord* j) noexcept {
  if (j->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  const bool recyclable = j->recyclable;
  j->task()->~Task();
  j->~JoinRecord();
  free_record(j, recyclable);
}

void free_record(void* mem, bool recyclable) noexcept {
  // Any worker's cache will do, even another runtime's: every recyclable
  // block comes from the one process-wide depot. A handle released on a plain
  // thread (perhaps after its runtime is gone) gives it to the depot itself.
  if (!recyclable) {
    ::operator delete(mem);
  } else if (Worker* w = Worker::current()) {
    w->records().put(mem);
  } else {
    spawn_records().give_one(mem);
  }
}

// The park/wake handshake: a fiber announces `parking` before it registers
// with whatever will wake it, so a wake that comes before it has switched
// out is remembered (parking -> runnable) and honoured by its worker.
void wake_fiber(Fiber* f) {
  for (;;) {
    FiberState s = f->state.load(std::memory_order_acquire);
    if (s == FiberState::parking) {
      if (f->state.compare_exchange_weak(s, FiberState::runnable, std::memory_order_acq_rel)) return;
    } else if (s == FiberState::parked) {
      if (f->state.compare_exchange_weak(s, FiberState::runnable, std::memory_order_acq_rel)) {
        f->owner->place(f);
        return;
      }
    } else {
      return; // already runnable, running or done
    }
  }
}

} // namespace coresched::detail
