// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file sync.hpp
/// Synchronization primitives for fibers: Mutex, ConditionVariable, Event,
/// Semaphore, WaitGroup, Latch and a bounded or unbuffered Channel<T>.
///
/// A waiting fiber is suspended (its worker runs other fibers); a waiting plain
/// thread is blocked on a futex. Any mix of fibers, plain threads and
/// runtimes may share one primitive. Waits return only when their condition
/// holds: there are no spurious wake-ups. Waiters are served in FIFO order.
/// None of the types may be copied or moved, and none may be destroyed while
/// someone still waits on it.
///
/// Every wait also comes timed (`*_for`, `*_until`, the standard library's
/// names and results) and with a std::stop_token. A timed wait never returns
/// early; one whose time runs out, or whose token is stopped, leaves the
/// queue as if it had never come (what a racing release or send hands out
/// goes to the next waiter; nothing is lost). A stopped wait returns the
/// not-ready result (false, std::nullopt, std::cv_status::timeout) with
/// `st.stop_requested()` true; a stop token with no stop source never stops.
/// Negative or huge durations saturate; a time in the past still takes what
/// is ready now. When the runtime shuts down, its fibers' timed waits end at
/// once, timed out.

#include <coresched/join_handle.hpp> // UsageError

#include <atomic>
#include <chrono>
#include <condition_variable> // std::cv_status
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stop_token>
#include <string>
#include <type_traits>
#include <utility>

namespace coresched {

/// One case of a select (defined in select.hpp).
class SelectCase;

/// Implementation details shared by the primitives and the header-only
/// Channel<T>; not part of the API and may change without notice.
namespace detail {

struct Waiter; // a suspended fiber or blocked thread; defined in the runtime
struct SelectAccess; // builds select cases over the primitives (select.hpp)

/// A waiting sender's item, in its frame: the receiver that takes it moves
/// `*value` and sets `taken` before it wakes the sender.
struct SendSlot {
  void* value;
  bool taken = false;
};

/// The one select; see select.hpp.
int select_impl(const SelectCase* cases, std::size_t n, std::uint64_t deadline_ns, const std::stop_token* stop);

/// How a wait ended.
enum class WaitOutcome : std::uint8_t { notified, timed_out, stopped };

/// No deadline. Every deadline past INT64_MAX ns (292 years of uptime) is
/// this one: the clocks and time points that deadlines meet are signed.
inline constexpr std::uint64_t kNever = UINT64_MAX;

/// The steady clock now, in nanoseconds since its epoch (CLOCK_MONOTONIC).
inline std::uint64_t steady_now_ns() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

/// `from + d` in nanoseconds, rounded up (a wait is never early); kNever
/// from INT64_MAX on; a negative `d` (or a NaN) gives `from`.
template <class Rep, class Period>
std::uint64_t add_saturated(std::uint64_t from, const std::chrono::duration<Rep, Period>& d) noexcept {
  if (!(d > d.zero())) return from; // also a NaN
  const long double ns = std::chrono::duration<long double, std::nano>(d).count();
  const long double room = static_cast<long double>(INT64_MAX) - static_cast<long double>(from);
  if (!(ns < room)) return kNever;
  const auto whole = static_cast<std::uint64_t>(ns);
  return from + whole + (static_cast<long double>(whole) < ns ? 1 : 0);
}

/// The deadline `d` from now.
template <class Rep, class Period> std::uint64_t deadline_after(const std::chrono::duration<Rep, Period>& d) noexcept {
  return add_saturated(steady_now_ns(), d);
}

/// The deadline at `t`: exact for the steady clock; another clock's time
/// point is turned into a duration from its now (in long double: the
/// difference of two extreme time points overflows their own type).
template <class Clock, class Duration>
std::uint64_t deadline_at(const std::chrono::time_point<Clock, Duration>& t) noexcept {
  using ns = std::chrono::duration<long double, std::nano>;
  if constexpr (std::is_same_v<Clock, std::chrono::steady_clock>) return add_saturated(0, ns(t.time_since_epoch()));
  else return deadline_after(ns(t.time_since_epoch()) - ns(Clock::now().time_since_epoch()));
}

/// A test-and-test-and-set lock over a primitive's few words. Never held
/// across a suspension; spins briefly, then yields the thread.
class SyncLock {
public:
  void lock() noexcept {
    if (flag_.exchange(true, std::memory_order_acquire)) lock_slow();
  }
  void unlock() noexcept { flag_.store(false, std::memory_order_release); }
  /// Waits until nobody holds the lock. A primitive's destructor calls it:
  /// whoever released a waiter through a lock-free fast path may still be
  /// about to unlock, and its unlock is its last touch of the primitive.
  void wait_idle() const noexcept {
    while (flag_.load(std::memory_order_acquire)) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }

private:
  void lock_slow() noexcept;
  std::atomic<bool> flag_{false};
};

/// A FIFO of suspended fibers and blocked threads, guarded by a SyncLock the
/// owner holds. Exported for header-only templates (Channel<T>).
class WaitQueue {
public:
  /// True if nobody waits. Call with the lock held.
  bool empty() const noexcept { return head_ == nullptr; }
  /// Call with `lock` held: enqueues the caller carrying `slot`, releases
  /// `lock`, runs `after_unlock(arg)` if given, and suspends the calling fiber
  /// (or blocks the calling thread) until wake(). Returns without the lock.
  /// `what` names the primitive in a fiber dump (Runtime::dump).
  void wait(SyncLock& lock, void* slot = nullptr, void (*after_unlock)(void*) = nullptr, void* arg = nullptr,
            const char* what = "a sync primitive");
  /// As wait(), but gives up at `deadline_ns` (steady clock; kNever: never)
  /// or when `stop` (may be null) is stopped, and says which ended it. A
  /// waiter that gives up has left the queue.
  WaitOutcome wait_until(SyncLock& lock, std::uint64_t deadline_ns, const std::stop_token* stop, void* slot = nullptr,
                         void (*after_unlock)(void*) = nullptr, void* arg = nullptr,
                         const char* what = "a sync primitive");
  /// Call with the lock held: takes `w` out of the queue; false if it is not in it.
  bool unlink(Waiter* w) noexcept;
  /// Call with the lock held: removes and returns the oldest waiter, or null.
  Waiter* pop() noexcept;
  /// Call with the lock held: removes every waiter; returns them as a chain for wake_all().
  Waiter* pop_all() noexcept;
  /// The `slot` a removed waiter passed to wait() (read it before wake()).
  static void* slot(const Waiter* w) noexcept;
  /// Call without the lock: resumes a removed waiter. Its frame may vanish at once.
  static void wake(Waiter* w) noexcept;
  /// Call without the lock: resumes every waiter of a pop_all() chain.
  static void wake_all(Waiter* chain) noexcept;

private:
  friend int select_impl(const SelectCase* cases, std::size_t n, std::uint64_t deadline_ns, const std::stop_token* stop);
  void push(Waiter* w, void* slot, const char* what) noexcept; // at the tail, prepared to park
  Waiter* head_ = nullptr;
  Waiter* tail_ = nullptr;
};

/// The stoppable and timed forms of a primitive's wait(), for the
/// primitives whose wait has no result of its own (Event, WaitGroup, Latch):
/// each returns whether the condition holds. `Derived` provides
/// `bool wait_until_ns(std::uint64_t deadline_ns, const std::stop_token&)`.
template <class Derived> class TimedWaits {
public:
  /// Waits until the condition holds or `st` is stopped; true if it holds.
  bool wait(std::stop_token st) { return self().wait_until_ns(kNever, st); }
  /// Waits at most `d` (and while `st` is not stopped); true if the condition holds.
  template <class Rep, class Period> bool wait_for(const std::chrono::duration<Rep, Period>& d, std::stop_token st = {}) {
    return self().wait_until_ns(deadline_after(d), st);
  }
  /// Waits until `t` at the latest (and while `st` is not stopped); true if the condition holds.
  template <class Clock, class Duration>
  bool wait_until(const std::chrono::time_point<Clock, Duration>& t, std::stop_token st = {}) {
    return self().wait_until_ns(deadline_at(t), st);
  }

private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
};

} // namespace detail

/// A mutual-exclusion lock. When contended, ownership passes to the waiters
/// in FIFO order (no waiter starves). Usable with std::unique_lock and
/// std::lock_guard. Not recursive; unlock only what you locked.
class Mutex {
public:
  /// Creates an unlocked mutex.
  Mutex() noexcept = default;
  /// Not copyable or movable: waiters refer to the object by address.
  Mutex(const Mutex&) = delete;
  /// Not assignable, for the same reason.
  Mutex& operator=(const Mutex&) = delete;

  /// Acquires the lock, suspending the calling fiber (or blocking the thread) while it is held.
  void lock() {
    std::uint32_t s = 0;
    if (!state_.compare_exchange_strong(s, kLocked, std::memory_order_acquire)) lock_slow();
  }
  /// Acquires the lock if it is free; never waits.
  bool try_lock() noexcept {
    std::uint32_t s = 0;
    return state_.load(std::memory_order_relaxed) == 0 &&
           state_.compare_exchange_strong(s, kLocked, std::memory_order_acquire);
  }
  /// Acquires the lock, waiting at most `d`; false if it was not acquired
  /// in that time (then nothing changed).
  template <class Rep, class Period> bool try_lock_for(const std::chrono::duration<Rep, Period>& d) {
    return try_lock() || lock_until(detail::deadline_after(d));
  }
  /// Acquires the lock, waiting until `t` at the latest; false if it was not acquired.
  template <class Clock, class Duration> bool try_lock_until(const std::chrono::time_point<Clock, Duration>& t) {
    return try_lock() || lock_until(detail::deadline_at(t));
  }
  /// Releases the lock, handing it to the oldest waiter if there is one.
  void unlock() noexcept {
    std::uint32_t s = kLocked;
    if (!state_.compare_exchange_strong(s, 0, std::memory_order_release)) unlock_slow();
  }

private:
  static constexpr std::uint32_t kLocked = 1, kQueued = 2;
  void lock_slow();
  bool lock_until(std::uint64_t deadline_ns);
  void unlock_slow() noexcept;
  std::atomic<std::uint32_t> state_{0}; // kLocked | kQueued; never kQueued alone
  detail::SyncLock lk_;
  detail::WaitQueue q_;
};

/// A condition variable for Mutex. wait() returns only after a notify (no
/// spurious wake-ups), with the mutex locked again.
class ConditionVariable {
public:
  /// Creates a condition variable with no waiters.
  ConditionVariable() noexcept = default;
  /// Not copyable or movable: waiters refer to the object by address.
  ConditionVariable(const ConditionVariable&) = delete;
  /// Not assignable, for the same reason.
  ConditionVariable& operator=(const ConditionVariable&) = delete;

  /// Atomically unlocks `m` (which the caller holds) and waits for a notify; relocks `m` before returning.
  void wait(Mutex& m);
  /// Waits until `pred()` is true; `pred` is evaluated with `m` held.
  template <class Pred> void wait(Mutex& m, Pred pred) {
    while (!pred()) wait(m);
  }
  /// As wait(Mutex&), on the mutex of a std::unique_lock that owns it.
  /// @throws UsageError if `lk` does not own its mutex.
  void wait(std::unique_lock<Mutex>& lk) {
    if (!lk.owns_lock()) throw UsageError("coresched: ConditionVariable::wait on a unique_lock that is not locked");
    wait(*lk.mutex());
  }
  /// As wait(Mutex&, pred), on the mutex of a std::unique_lock that owns it.
  template <class Pred> void wait(std::unique_lock<Mutex>& lk, Pred pred) {
    while (!pred()) wait(lk);
  }
  /// As wait(lk), giving up at `t`: std::cv_status::timeout if no notify
  /// came by then. `lk`'s mutex is locked again either way.
  template <class Clock, class Duration>
  std::cv_status wait_until(std::unique_lock<Mutex>& lk, const std::chrono::time_point<Clock, Duration>& t) {
    return wait_until_ns(lk, detail::deadline_at(t), {}) == detail::WaitOutcome::notified ? std::cv_status::no_timeout
                                                                                          : std::cv_status::timeout;
  }
  /// As wait_until(lk, t), for at most `d`.
  template <class Rep, class Period>
  std::cv_status wait_for(std::unique_lock<Mutex>& lk, const std::chrono::duration<Rep, Period>& d) {
    return wait_until_ns(lk, detail::deadline_after(d), {}) == detail::WaitOutcome::notified ? std::cv_status::no_timeout
                                                                                             : std::cv_status::timeout;
  }
  /// Waits until `pred()` holds, `t` passes or `st` is stopped; returns pred().
  template <class Clock, class Duration, class Pred>
  bool wait_until(std::unique_lock<Mutex>& lk, const std::chrono::time_point<Clock, Duration>& t, Pred pred,
                  std::stop_token st = {}) {
    return wait_pred(lk, detail::deadline_at(t), st, pred);
  }
  /// Waits until `pred()` holds, `d` passes or `st` is stopped; returns pred().
  template <class Rep, class Period, class Pred>
  bool wait_for(std::unique_lock<Mutex>& lk, const std::chrono::duration<Rep, Period>& d, Pred pred,
                std::stop_token st = {}) {
    return wait_pred(lk, detail::deadline_after(d), st, pred);
  }
  /// Waits until `pred()` holds or `st` is stopped; returns pred() (as
  /// std::condition_variable_any::wait with a stop token).
  template <class Pred> bool wait(std::unique_lock<Mutex>& lk, std::stop_token st, Pred pred) {
    return wait_pred(lk, detail::kNever, st, pred);
  }
  /// Wakes the oldest waiter, if any.
  void notify_one() noexcept;
  /// Wakes every waiter.
  void notify_all() noexcept;

private:
  detail::WaitOutcome wait_until_ns(std::unique_lock<Mutex>& lk, std::uint64_t deadline_ns, const std::stop_token& st);
  template <class Pred>
  bool wait_pred(std::unique_lock<Mutex>& lk, std::uint64_t deadline_ns, const std::stop_token& st, Pred& pred) {
    while (!pred())
      if (wait_until_ns(lk, deadline_ns, st) != detail::WaitOutcome::notified) return pred();
    return true;
  }
  detail::SyncLock lk_;
  detail::WaitQueue q_;
};

/// A manual-reset event: once set(), every wait() returns at once until reset().
class Event : public detail::TimedWaits<Event> {
public:
  /// Creates the event cleared (or set).
  explicit Event(bool initially_set = false) noexcept : set_(initially_set) {}
  /// Safe as soon as wait() has returned, even while set() is still returning.
  ~Event() { lk_.wait_idle(); }
  /// Not copyable or movable: waiters refer to the object by address.
  Event(const Event&) = delete;
  /// Not assignable, for the same reason.
  Event& operator=(const Event&) = delete;

  /// Sets the event and releases every waiter.
  void set() noexcept;
  /// Clears the event; later waits block until the next set().
  void reset() noexcept;
  /// Waits until the event is set.
  void wait();
  /// Also wait(std::stop_token), wait_for(d, st) and wait_until(t, st):
  /// true if the event is set.
  using detail::TimedWaits<Event>::wait;
  /// Whether the event is set now.
  bool is_set() const noexcept { return set_.load(std::memory_order_acquire); }

private:
  friend class detail::TimedWaits<Event>;
  friend struct detail::SelectAccess;
  bool wait_until_ns(std::uint64_t deadline_ns, const std::stop_token& st);
  std::atomic<bool> set_;
  detail::SyncLock lk_;
  detail::WaitQueue q_;
};

/// A counting semaphore. release() hands units to waiters in FIFO order.
class Semaphore {
public:
  /// Creates the semaphore holding `initial` units (>= 0).
  /// @throws UsageError if `initial` is negative.
  explicit Semaphore(std::ptrdiff_t initial = 0);
  /// Safe as soon as acquire() has returned, even while release() is still returning.
  ~Semaphore() { lk_.wait_idle(); }
  /// Not copyable or movable: waiters refer to the object by address.
  Semaphore(const Semaphore&) = delete;
  /// Not assignable, for the same reason.
  Semaphore& operator=(const Semaphore&) = delete;

  /// Takes one unit, waiting while there is none.
  void acquire();
  /// Takes one unit if one is available; never waits.
  bool try_acquire() noexcept {
    std::ptrdiff_t c = count_.load(std::memory_order_relaxed);
    while (c > 0)
      if (count_.compare_exchange_weak(c, c - 1, std::memory_order_acquire, std::memory_order_relaxed)) return true;
    return false;
  }
  /// Takes one unit unless `st` is stopped first; true if it took one.
  bool acquire(std::stop_token st) { return try_acquire() || acquire_until(detail::kNever, st); }
  /// Takes one unit, waiting at most `d` (and while `st` is not stopped); true if it took one.
  template <class Rep, class Period>
  bool try_acquire_for(const std::chrono::duration<Rep, Period>& d, std::stop_token st = {}) {
    return try_acquire() || acquire_until(detail::deadline_after(d), st);
  }
  /// Takes one unit, waiting until `t` at the latest (and while `st` is not stopped); true if it took one.
  template <class Clock, class Duration>
  bool try_acquire_until(const std::chrono::time_point<Clock, Duration>& t, std::stop_token st = {}) {
    return try_acquire() || acquire_until(detail::deadline_at(t), st);
  }
  /// Adds `n` units (>= 0), waking up to `n` waiters.
  /// @throws UsageError if `n` is negative, or if the count would pass
  /// PTRDIFF_MAX (the count is left unchanged).
  void release(std::ptrdiff_t n = 1);
  /// The units available now (a snapshot).
  std::ptrdiff_t available() const noexcept { return count_.load(std::memory_order_relaxed); }

private:
  bool acquire_until(std::uint64_t deadline_ns, const std::stop_token& st);
  std::atomic<std::ptrdiff_t> count_; // never > 0 while someone waits
  detail::SyncLock lk_;
  detail::WaitQueue q_;
};

/// Waits for a group of tasks, like Go's sync.WaitGroup: add() before
/// starting work, done() when each finishes, wait() until the count is zero.
/// A cache line of its own (64 bytes): tasks on every worker count it down,
/// and the waiter's other stack variables must not share its line (1M
/// detached spawns counting down a WaitGroup on the spawner's stack: the
/// spawner's own writes beside it would take 13 % of the workers' time).
class alignas(64) WaitGroup : public detail::TimedWaits<WaitGroup> {
public:
  /// Creates a wait group with a count of zero.
  WaitGroup() noexcept = default;
  /// Safe as soon as wait() has returned, even while the last done() is still returning.
  ~WaitGroup() { lk_.wait_idle(); }
  /// Not copyable or movable: waiters refer to the object by address.
  WaitGroup(const WaitGroup&) = delete;
  /// Not assignable, for the same reason.
  WaitGroup& operator=(const WaitGroup&) = delete;

  /// Adds `delta` (may be negative) to the count; at zero every waiter is released.
  /// @throws UsageError if the count would become negative or pass INT64_MAX
  /// (the count is left unchanged).
  void add(std::int64_t delta = 1);
  /// Subtracts one from the count.
  /// @throws UsageError if the count is already zero.
  void done() { add(-1); }
  /// Waits until the count is zero.
  void wait();
  /// Also wait(std::stop_token), wait_for(d, st) and wait_until(t, st): true at zero.
  using detail::TimedWaits<WaitGroup>::wait;
  /// The count now (a snapshot).
  std::int64_t count() const noexcept { return count_.load(std::memory_order_relaxed); }

private:
  friend class detail::TimedWaits<WaitGroup>;
  bool wait_until_ns(std::uint64_t deadline_ns, const std::stop_token& st);
  std::atomic<std::int64_t> count_{0};
  detail::SyncLock lk_;
  detail::WaitQueue q_;
};

/// A single-use countdown, like std::latch: waits return once the count reaches zero.
/// A cache line of its own, as WaitGroup.
class alignas(64) Latch : public detail::TimedWaits<Latch> {
public:
  /// Creates the latch with `expected` arrivals to wait for (>= 0).
  /// @throws UsageError if `expected` is negative.
  explicit Latch(std::ptrdiff_t expected);
  /// Safe as soon as wait() has returned, even while the last count_down() is still returning.
  ~Latch() { lk_.wait_idle(); }
  /// Not copyable or movable: waiters refer to the object by address.
  Latch(const Latch&) = delete;
  /// Not assignable, for the same reason.
  Latch& operator=(const Latch&) = delete;

  /// Decrements the count by `n`; at zero every waiter is released.
  /// @throws UsageError if `n` is negative or exceeds the count (the count is
  /// left unchanged).
  void count_down(std::ptrdiff_t n = 1);
  /// Whether the count has reached zero.
  bool try_wait() const noexcept { return count_.load(std::memory_order_acquire) == 0; }
  /// Waits until the count reaches zero.
  void wait();
  /// Also wait(std::stop_token), wait_for(d, st) and wait_until(t, st): true at zero.
  using detail::TimedWaits<Latch>::wait;
  /// count_down(n), then wait().
  void arrive_and_wait(std::ptrdiff_t n = 1) {
    count_down(n);
    wait();
  }

private:
  friend class detail::TimedWaits<Latch>;
  bool wait_until_ns(std::uint64_t deadline_ns, const std::stop_token& st);
  std::atomic<std::ptrdiff_t> count_;
  detail::SyncLock lk_;
  detail::WaitQueue q_;
};

} // namespace coresched

#include <coresched/channel.hpp> // Channel<T>: one of the primitives this header offers
