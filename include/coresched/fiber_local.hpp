// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file fiber_local.hpp
/// Fiber-local storage: a FiberLocal<T> holds one value per fiber, as a
/// thread_local holds one per thread. A fiber sees its own value across
/// suspensions and moves between workers, where a thread_local would show
/// whichever fiber last ran on that worker's thread. A child fiber starts
/// with none (also one joined inline, on its parent's stack). A value is
/// destroyed when its fiber ends, in that fiber (so under its cookie: a
/// destructor is the tenant's code), or by reset().

#include <coresched/join_handle.hpp> // UsageError

#include <cstddef>
#include <memory>

namespace coresched {

/// Implementation details of FiberLocal; not part of the API and may change
/// without notice.
namespace detail {
/// One fiber's value for one key: the object and how to destroy it.
struct LocalValue {
  void* ptr = nullptr;
  void (*destroy)(void*) noexcept = nullptr;
};
/// A key of its own for a new FiberLocal (process-wide; never reused).
std::size_t new_local_key() noexcept;
/// The calling fiber's value for `key`, or null. UsageError outside a fiber.
void* local_get(std::size_t key);
/// Sets the calling fiber's value for `key`; returns the one it replaces
/// (not destroyed). UsageError outside a fiber.
LocalValue local_exchange(std::size_t key, LocalValue v);
} // namespace detail

/// One value of type T per fiber (Boost.Fiber's fiber_specific_ptr is the
/// model). Usually a static or a global; the object itself may be used from
/// every fiber at once. Every member is a UsageError on a plain thread.
/// Destroying a FiberLocal does not destroy the fibers' values: each goes
/// when its fiber ends.
template <class T> class FiberLocal {
public:
  /// A new fiber-local variable; every fiber's value starts null.
  FiberLocal() noexcept : key_(detail::new_local_key()) {}
  /// Not copyable: the key is the variable.
  FiberLocal(const FiberLocal&) = delete;
  /// Not assignable, for the same reason.
  FiberLocal& operator=(const FiberLocal&) = delete;

  /// The calling fiber's value (null until reset() gives it one).
  T* get() const { return static_cast<T*>(detail::local_get(key_)); }
  /// The calling fiber's value; it must have one.
  T* operator->() const { return get(); }
  /// The calling fiber's value; it must have one.
  T& operator*() const { return *get(); }
  /// Gives the calling fiber `p` (owned from now on, deleted when the fiber
  /// ends), destroying the value it had. If it throws (outside a fiber, or
  /// out of memory), `p` is deleted.
  void reset(T* p = nullptr) {
    std::unique_ptr<T> owned(p);
    const detail::LocalValue old = detail::local_exchange(key_, {p, p ? &destroy : nullptr});
    (void)owned.release();
    if (old.ptr) old.destroy(old.ptr);
  }
  /// Takes the calling fiber's value back without destroying it; the fiber
  /// has none afterwards.
  T* release() { return static_cast<T*>(detail::local_exchange(key_, {}).ptr); }

private:
  static void destroy(void* p) noexcept { delete static_cast<T*>(p); }
  std::size_t key_;
};

} // namespace coresched
