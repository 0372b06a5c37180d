// SPDX-License-Identifier: Apache-2.0
// A core's state for the fiber dump (fiber_dump.cpp), read under its lock.
#include "core/core_coordinator.hpp"

#include "platform/clock.hpp"
#include "fiber/fiber.hpp"

#include <algorithm>
#include <immintrin.h>

namespace coresched::detail {

CoreSnapshot CoreCoordinator::snapshot(int patience_us) {
  CoreSnapshot snap;
  const std::uint64_t give_up = now_ns() + static_cast<std::uint64_t>(patience_us) * 1000;
  while (!(snap.locked = lock_.try_lock()) && now_ns() < give_up) _mm_pause();
  for (const auto& s : siblings_)
    snap.pus.push_back({s->running.load(std::memory_order_relaxed), false, false,
                        s->preempt.load(std::memory_order_relaxed), 0});
  if (!snap.locked) return snap;
  // The spawn ring's fibers join the queue, as at the owner's next pick, so
  // that they are listed and counted per cookie like every queued fiber
  // (on the ring they are not ours to read: a thief may take them meanwhile).
  drain_spawned_locked(0);
  snap.owner = owner_;
  snap.owner_since_ns = owner_since_;
  for (const auto& e : cookies_) snap.cookies.push_back({e.cookie, e.runnable, e.vruntime, e.waited});
  for (unsigned i = 0; i < size(); ++i) {
    const Sibling& s = *siblings_[i];
    snap.pus[i].forced_idle = s.forced_idle;
    snap.pus[i].sleeping = s.sleeping;
    snap.pus[i].queue = s.queue.size();
    snap.queued_total += s.queue.size();
    s.queue.for_each_cookie([&](std::uint64_t cookie, std::size_t n) {
      auto it = std::find_if(snap.runnable.begin(), snap.runnable.end(), [&](auto& r) { return r.first == cookie; });
      if (it == snap.runnable.end()) snap.runnable.emplace_back(cookie, n);
      else it->second += n;
    });
    s.queue.for_each([&](const Fiber& f) {
      if (snap.queued.size() < CoreSnapshot::kMaxQueued)
        snap.queued.push_back({i, f.id, f.cookie, f.pinned, f.fresh});
    });
  }
  lock_.unlock();
  return snap;
}

} // namespace coresched::detail
