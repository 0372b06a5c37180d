// SPDX-License-Identifier: Apache-2.0
// FiberLocal's storage: a fiber's values are a vector indexed by key, made
// at its first reset() and hung off its join record (which lives as long as
// the fiber runs, and has room for one more pointer where the fiber record
// has none). The fiber destroys them itself as its user code ends
// (Worker::run_to_completion), so every destructor runs under its cookie.
#include "fiber/local_values.hpp"

#include "fiber/join_record.hpp"
#include "sched/worker.hpp"

#include <coresched/fiber_local.hpp>

#include <algorithm>
#include <atomic>
#include <new>
#include <string>
#include <utility>

namespace coresched::detail {

namespace {
std::atomic<std::size_t> next_key{0};

[[noreturn, gnu::cold, gnu::noinline]] void outside_fiber(const char* what) {
  throw UsageError(std::string("coresched: FiberLocal::") + what + " called outside a fiber (a FiberLocal holds "
                   "one value per fiber; use thread_local on plain threads)");
}

// The running fiber's join record. tls_worker, not Worker::current(): no
// switch can come between the read and the use here, and it keeps get() to
// a dozen instructions (the out-of-line current() and the string of the
// error path would double them).
JoinRecord& calling_fiber(const char* what) {
  Worker* w = tls_worker;
  if (!w || !w->in_task()) [[unlikely]]
    outside_fiber(what);
  return *w->running()->join;
}
} // namespace

std::size_t new_local_key() noexcept { return next_key.fetch_add(1, std::memory_order_relaxed); }

void* local_get(std::size_t key) {
  const auto* v = static_cast<const LocalValues*>(calling_fiber("get").locals);
  return v && key < v->size() ? (*v)[key].ptr : nullptr;
}

LocalValue local_exchange(std::size_t key, LocalValue value) {
  JoinRecord& j = calling_fiber("reset");
  auto* v = static_cast<LocalValues*>(j.locals);
  if (!v || key >= v->size()) {
    if (!value.ptr) return {};
    if (!v) j.locals = v = new LocalValues;
    v->resize(std::max<std::size_t>(key + 1, 2 * v->size()));
  }
  return std::exchange((*v)[key], value);
}

// A destructor may give its fiber a new value (a logger that reopens
// itself, say): pass over the values until none is left, then free them.
void destroy_locals(JoinRecord& j) noexcept {
  auto* v = static_cast<LocalValues*>(j.locals);
  for (bool any = true; any;) {
    any = false;
    for (std::size_t k = 0; k < v->size(); ++k) { // a destructor may grow `v`: index, no iterators
      const LocalValue value = std::exchange((*v)[k], LocalValue{});
      if (!value.ptr) continue;
      value.destroy(value.ptr);
      any = true;
    }
  }
  delete v;
  j.locals = nullptr;
}

} // namespace coresched::detail
