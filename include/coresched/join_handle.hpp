// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file join_handle.hpp
/// JoinHandle<T>: the result of spawning a fiber, shaped like std::jthread.

#include <coresched/cookie.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace coresched {

/// Thrown on misuse: joining or detaching a handle that is not joinable, a
/// fiber joining itself, fiber-only calls from a plain thread, spawning after
/// shutdown, shutdown() from the runtime's own fiber, a zero-size stack, an
/// out-of-range pin_to_pu, invalid Options. A logic_error: fix the caller.
class UsageError : public std::logic_error {
public:
  /// Takes the message that what() returns.
  using std::logic_error::logic_error;
};

/// Thrown by JoinHandle::join() for a fiber that never ran: no stack could be
/// mapped for it (mmap failed; each started fiber holds two kernel mappings,
/// so tens of thousands of them meet the `vm.max_map_count` sysctl) and no
/// fiber of its runtime finished for a second while it waited, as happens
/// when every fiber that could free a stack waits for this one. Its callable
/// was destroyed without being called. Raise the limit (`sysctl -w
/// vm.max_map_count=...`) or keep fewer fibers started at once.
class StackError : public std::runtime_error {
public:
  /// Takes the message that what() returns.
  using std::runtime_error::runtime_error;
};

/// Per-spawn settings. Every field is optional.
struct SpawnOptions {
  /// Cookie of the new fiber; unset means inherit the spawning fiber's cookie
  /// (untagged when spawned from a plain thread).
  std::optional<Cookie> cookie;
  /// Usable stack size in bytes, rounded up to whole pages (a guard page comes
  /// on top); unset means Options::stack_size. The fiber may use this much
  /// (twice it is mapped, so that a join can run a child inline below its
  /// frames). Zero or more than 1 GiB is a UsageError.
  std::optional<std::size_t> stack_size;
  /// Pin the fiber to one PU (Topology::pus() index): it never migrates.
  /// An index past the last PU is a UsageError.
  std::optional<unsigned> pin_to_pu;
  /// Spawn detached: the returned handle is empty (not joinable) and the
  /// fiber's result or exception is discarded.
  bool detached = false;
};

/// Implementation details of spawning and joining, used by the templates below;
/// not part of the API and may change without notice.
namespace detail {

/// Type-erased body of a fiber. The runtime allocates it together with its
/// scheduling state (one allocation per spawn) and calls run() once.
///
/// Everything here that holds user state — the callable and its captures, the
/// result, the exception — is user code when destroyed, so it is destroyed by
/// the fiber itself while it still runs under its own cookie: the callable at
/// the end of run(), a result nobody will collect (detached fiber, handle
/// dropped first) by discard_result() before the fiber finishes. The runtime's
/// final ~Task() then destroys only what a handle took over or left empty.
class Task {
public:
  virtual ~Task() = default;
  /// Runs the callable, stores its result or exception, then destroys the callable.
  virtual void run() noexcept = 0;
  /// Instead of run(): stores `e` as the fiber's exception and destroys the
  /// callable without calling it (a fiber that could not start).
  virtual void fail(std::exception_ptr e) noexcept = 0;
  /// Destroys the result and the exception (nobody will collect them).
  virtual void discard_result() noexcept { error = nullptr; }
  std::exception_ptr error; ///< Set if the callable threw.
};

/// A task whose callable returns R.
template <class R> class ResultTask : public Task {
public:
  /// Also destroys the stored result.
  void discard_result() noexcept override {
    this->error = nullptr;
    result.reset();
  }
  std::optional<R> result; ///< Set if the callable returned.
};
template <> class ResultTask<void> : public Task {};

template <class F, class R> class TaskImpl final : public ResultTask<R> {
public:
  explicit TaskImpl(F&& f) { ::new (static_cast<void*>(&fn_)) F(std::move(f)); }
  ~TaskImpl() override {
    if (!ran_) fn_.~F(); // never ran (a spawn that failed after construction)
  }
  void run() noexcept override {
    try {
      if constexpr (std::is_void_v<R>) fn_();
      else this->result.emplace(fn_());
    } catch (...) {
      this->error = std::current_exception();
    }
    ran_ = true;
    fn_.~F(); // the captures' destructors are the fiber's own code: run them now, under its cookie
  }
  void fail(std::exception_ptr e) noexcept override {
    this->error = std::move(e);
    ran_ = true;
    fn_.~F(); // under the fiber's cookie, as in run()
  }
private:
  union { F fn_; }; // destroyed by run(), not by ~TaskImpl
  bool ran_ = false;
};

class Scheduler;

/// Allocates a fiber whose task is built in place by `construct`, and queues it.
/// Returns its task. Defined in the runtime.
Task* spawn_task(Scheduler* sched, const SpawnOptions& opts, std::size_t task_size,
                 std::size_t task_align, void (*construct)(void* where, void* arg), void* arg);
/// Blocks the calling fiber (or thread) until the task's fiber has finished.
void join_task(Task* t);
/// Drops the handle's reference; the fiber's memory goes when it has finished
/// too. A result or exception still stored is destroyed first, here if the
/// fiber has finished, or by the fiber itself when it does.
void release_task(Task* t) noexcept;
/// As release_task, for detach(): an exception that already ended the fiber
/// is logged before it is dropped (nobody else will ever see it).
void detach_task(Task* t) noexcept;
/// Drops the reference of a handle that joined and emptied the task itself.
void release_joined(Task* t) noexcept;
/// The fiber id of a task.
std::uint64_t task_fiber_id(const Task* t) noexcept;

template <class F> Task* spawn_callable(Scheduler* s, F&& f, const SpawnOptions& o) {
  using Fn = std::decay_t<F>;
  using R = std::invoke_result_t<Fn&>;
  using Impl = TaskImpl<Fn, R>;
  auto construct = [](void* where, void* arg) {
    ::new (where) Impl(std::move(*static_cast<Fn*>(arg)));
  };
  Fn local(std::forward<F>(f));
  return spawn_task(s, o, sizeof(Impl), alignof(Impl), construct, &local);
}

} // namespace detail

/// Owns a spawned fiber until it is joined or detached, like std::jthread:
/// destroying a joinable handle joins it (and discards its result).
template <class T> class JoinHandle {
public:
  /// An empty handle: not joinable, id() is 0.
  JoinHandle() noexcept = default;
  /// Adopts a spawned task (null gives an empty handle). Used by Runtime::spawn;
  /// applications get handles from spawn() instead.
  explicit JoinHandle(detail::Task* t) noexcept : task_(static_cast<detail::ResultTask<T>*>(t)) {}
  /// Takes over `o`'s fiber; `o` becomes empty.
  JoinHandle(JoinHandle&& o) noexcept : task_(std::exchange(o.task_, nullptr)) {}
  /// Takes over `o`'s fiber; `o` becomes empty. A fiber this handle still owns is
  /// joined first (the caller waits for it) and its result discarded.
  JoinHandle& operator=(JoinHandle&& o) noexcept {
    if (this != &o) { reset(); task_ = std::exchange(o.task_, nullptr); }
    return *this;
  }
  /// Not copyable: exactly one handle owns a fiber and its result.
  JoinHandle(const JoinHandle&) = delete;
  /// Not assignable, for the same reason.
  JoinHandle& operator=(const JoinHandle&) = delete;
  /// Joins a still-joinable fiber (the caller waits for it, as in std::jthread)
  /// and discards its result or exception. detach() first to avoid the wait.
  ~JoinHandle() { reset(); }

  /// True until join() or detach().
  bool joinable() const noexcept { return task_ != nullptr; }

  /// Waits for the fiber (suspending the calling fiber, or blocking a plain
  /// thread), then returns its result or rethrows its exception. The handle
  /// is empty afterwards.
  /// @throws UsageError if not joinable (joined twice, detached, empty) or if
  /// the fiber tries to join itself.
  T join() {
    if (!task_) throw UsageError("coresched: join() on a handle that is not joinable (already joined or detached)");
    detail::join_task(task_);
    auto* t = std::exchange(task_, nullptr);
    struct Release { detail::Task* t; ~Release() { detail::release_joined(t); } } guard{t};
    // Take everything out, here in the joiner: the record's last reference
    // may be dropped by the fiber's worker while it runs another fiber, and
    // no destructor of the result or the exception may run there.
    if (t->error) std::rethrow_exception(std::exchange(t->error, nullptr));
    if constexpr (!std::is_void_v<T>) {
      T out = std::move(*t->result);
      t->result.reset();
      return out;
    }
  }

  /// Lets the fiber run on its own; its result is discarded and the handle
  /// becomes empty. An exception that ends it goes to
  /// Options::on_detached_exception (default: an error log line). The runtime's shutdown still waits for it.
  /// @throws UsageError if not joinable.
  void detach() {
    if (!task_) throw UsageError("coresched: detach() on a handle that is not joinable");
    detail::detach_task(std::exchange(task_, nullptr));
  }

  /// The fiber's id (0 for an empty handle).
  std::uint64_t id() const noexcept { return task_ ? detail::task_fiber_id(task_) : 0; }

private:
  void reset() noexcept {
    if (!task_) return;
    try { detail::join_task(task_); } catch (...) {}
    detail::release_task(std::exchange(task_, nullptr));
  }
  detail::ResultTask<T>* task_ = nullptr;
};

} // namespace coresched
