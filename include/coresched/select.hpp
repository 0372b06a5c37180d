// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file select.hpp
/// select: wait for the first of several channel receives, channel sends and
/// events, with a timeout or a stop token, as Go's `select` does.
///
///     std::optional<Request> req;
///     bool sent = false;
///     switch (coresched::select_for({coresched::recv_case(requests, req),
///                                    coresched::send_case(replies, reply, sent),
///                                    coresched::event_case(quit)}, 100ms)) {
///     case 0: ...   // req holds a request, or is empty: `requests` is closed
///     case 1: ...   // sent says whether `replies` took `reply` (false: closed)
///     case 2: ...   // quit is set
///     case coresched::kSelectTimedOut: ...
///     }
///
/// Exactly one case happens: the others have no effect (a send case that is
/// not chosen leaves its value where it was). When several cases are ready,
/// one is chosen at random, uniformly, so none of them starves. A receive
/// from a closed channel and a send to one are ready (they report it as
/// above), as in Go. A case is built over a primitive that must outlive the
/// call. Fibers and plain threads may select; the same channel may appear in
/// several cases.

#include <coresched/channel.hpp>
#include <coresched/sync.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <stop_token>

namespace coresched {

/// select's result when its time ran out before any case was ready.
inline constexpr int kSelectTimedOut = -1;
/// select's result when its stop token was stopped first.
inline constexpr int kSelectStopped = -2;
/// try_select's result when no case was ready.
inline constexpr int kSelectNone = -3;

/// One case of a select: built by recv_case(), send_case() or event_case(),
/// and valid while the objects it names live.
class SelectCase {
private:
  friend struct detail::SelectAccess;
  friend int detail::select_impl(const SelectCase* cases, std::size_t n, std::uint64_t deadline_ns,
                                 const std::stop_token* stop);
  SelectCase() = default;
  detail::SyncLock* lock_ = nullptr;   // the primitive's lock
  detail::WaitQueue* queue_ = nullptr; // where the case waits
  void* target_ = nullptr;             // the Channel<T> or Event
  void* data_ = nullptr;               // recv: the std::optional<T>; send: the T
  bool* sent_ = nullptr;               // send: whether the value was taken
  // Under *lock_: does the case's operation now if it needs no wait (true);
  // `wake` gets a waiter to wake once the locks are released.
  bool (*try_now_)(const SelectCase&, detail::Waiter*& wake) = nullptr;
  // A receive case: empties its `out` as the select starts (a case reused
  // across selects must not show the last one's item as received).
  void (*clear_)(const SelectCase&) noexcept = nullptr;
  const char* what_ = "";
  bool send_ = false; // its waiter carries a detail::SendSlot over data_
};

/// Implementation details of select; not part of the API and may change
/// without notice.
namespace detail {

/// Builds cases over the primitives' private parts.
struct SelectAccess {
  template <class T> static SelectCase recv(Channel<T>& ch, std::optional<T>& out) {
    SelectCase c;
    c.lock_ = &ch.lk_;
    c.queue_ = &ch.receivers_;
    c.target_ = &ch;
    c.data_ = &out;
    c.what_ = "select: Channel recv";
    c.clear_ = [](const SelectCase& self) noexcept { static_cast<std::optional<T>*>(self.data_)->reset(); };
    c.try_now_ = [](const SelectCase& self, Waiter*& wake) {
      auto& chan = *static_cast<Channel<T>*>(self.target_);
      return chan.recv_locked(*static_cast<std::optional<T>*>(self.data_), wake) != Channel<T>::Step::wait;
    };
    return c;
  }
  template <class T> static SelectCase send(Channel<T>& ch, T& value, bool& sent) {
    SelectCase c;
    c.lock_ = &ch.lk_;
    c.queue_ = &ch.senders_;
    c.target_ = &ch;
    c.data_ = &value;
    c.sent_ = &sent;
    c.send_ = true;
    c.what_ = "select: Channel send";
    c.try_now_ = [](const SelectCase& self, Waiter*& wake) {
      auto& chan = *static_cast<Channel<T>*>(self.target_);
      const auto step = chan.send_locked(*static_cast<T*>(self.data_), wake);
      if (step == Channel<T>::Step::wait) return false;
      *self.sent_ = step == Channel<T>::Step::done;
      return true;
    };
    return c;
  }
  static SelectCase event(Event& ev) {
    SelectCase c;
    c.lock_ = &ev.lk_;
    c.queue_ = &ev.q_;
    c.target_ = &ev;
    c.what_ = "select: Event";
    c.try_now_ = [](const SelectCase& self, Waiter*&) {
      return static_cast<Event*>(self.target_)->set_.load(std::memory_order_relaxed);
    };
    return c;
  }
};

/// The select of `n` cases until `deadline_ns` (kNever: no time limit; 0:
/// only what is ready now) or until `stop` (may be null) is stopped.
int select_impl(const SelectCase* cases, std::size_t n, std::uint64_t deadline_ns, const std::stop_token* stop);

} // namespace detail

/// A case that receives from `ch` into `out`, which every select it is in
/// empties as it starts (left empty when chosen: `ch` is closed and drained).
template <class T> SelectCase recv_case(Channel<T>& ch, std::optional<T>& out) {
  return detail::SelectAccess::recv(ch, out);
}
/// A case that sends `value` on `ch`: moved from only if `sent` reads true
/// afterwards (false: `ch` is closed, and `value` is untouched).
template <class T> SelectCase send_case(Channel<T>& ch, T& value, bool& sent) {
  return detail::SelectAccess::send(ch, value, sent);
}
/// A case that is ready while `ev` is set.
inline SelectCase event_case(Event& ev) { return detail::SelectAccess::event(ev); }

/// Waits until one of `cases` happens (or `st` is stopped: kSelectStopped);
/// returns its index. With no case and a token that cannot stop it would
/// wait for ever: a UsageError.
inline int select(std::span<const SelectCase> cases, std::stop_token st = {}) {
  return detail::select_impl(cases.data(), cases.size(), detail::kNever, &st);
}
/// select() over a braced list of cases.
inline int select(std::initializer_list<SelectCase> cases, std::stop_token st = {}) {
  return detail::select_impl(cases.begin(), cases.size(), detail::kNever, &st);
}
/// As select(), waiting at most `d`: kSelectTimedOut if no case happened.
template <class Rep, class Period>
int select_for(std::span<const SelectCase> cases, const std::chrono::duration<Rep, Period>& d, std::stop_token st = {}) {
  return detail::select_impl(cases.data(), cases.size(), detail::deadline_after(d) | 1, &st);
}
/// select_for() over a braced list of cases.
template <class Rep, class Period>
int select_for(std::initializer_list<SelectCase> cases, const std::chrono::duration<Rep, Period>& d,
               std::stop_token st = {}) {
  return detail::select_impl(cases.begin(), cases.size(), detail::deadline_after(d) | 1, &st);
}
/// As select(), waiting until `t` at the latest: kSelectTimedOut if no case happened.
template <class Clock, class Duration>
int select_until(std::span<const SelectCase> cases, const std::chrono::time_point<Clock, Duration>& t,
                 std::stop_token st = {}) {
  return detail::select_impl(cases.data(), cases.size(), detail::deadline_at(t) | 1, &st);
}
/// select_until() over a braced list of cases.
template <class Clock, class Duration>
int select_until(std::initializer_list<SelectCase> cases, const std::chrono::time_point<Clock, Duration>& t,
                 std::stop_token st = {}) {
  return detail::select_impl(cases.begin(), cases.size(), detail::deadline_at(t) | 1, &st);
}
/// The case that is ready now, chosen at random among those that are (Go's
/// `select` with a `default`), or kSelectNone.
inline int try_select(std::span<const SelectCase> cases) { return detail::select_impl(cases.data(), cases.size(), 0, nullptr); }
/// try_select() over a braced list of cases.
inline int try_select(std::initializer_list<SelectCase> cases) {
  return detail::select_impl(cases.begin(), cases.size(), 0, nullptr);
}

} // namespace coresched
