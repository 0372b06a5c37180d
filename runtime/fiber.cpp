// SPDX-License-Identifier: Apache-2.0
#include "fiber.hpp"

#include "scheduler.hpp"
#include "worker.hpp"

#include <new>

namespace coresched::detail {

void release_fiber(Fiber* f) noexcept {
  if (f->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  const bool recyclable = f->recyclable;
  const Scheduler* owner = f->owner;
  f->task()->~Task();
  f->~Fiber();
  free_record(f, recyclable, owner);
}

void free_record(void* mem, bool recyclable, const Scheduler* owner) noexcept {
  // A handle may outlive its runtime, so `owner` is only compared, never
  // followed: a worker of the same runtime proves the runtime is alive.
  Worker* w = recyclable ? Worker::current() : nullptr;
  if (w && &w->scheduler() == owner) w->records().put(mem);
  else ::operator delete(mem);
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
