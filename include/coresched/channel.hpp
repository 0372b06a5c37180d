// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file channel.hpp
/// Channel<T>: a bounded or unbuffered channel between fibers and threads,
/// with the waits and conventions of sync.hpp (which includes this header).

#include <coresched/sync.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <type_traits>
#include <utility>

namespace coresched {

/// A bounded multi-producer multi-consumer FIFO channel. send() waits while
/// the channel is full, recv() while it is empty. After close(), sends fail
/// and receives drain what is buffered, then return std::nullopt.
///
/// Capacity 0 makes it unbuffered (a rendezvous, like a Go `chan T` without a
/// buffer): send() returns only once a receiver has taken the value, the value
/// moves straight from the sender's frame to the receiver, try_send()
/// succeeds only if a receiver is already waiting and try_recv() only if a
/// sender is. close() fails the waiting senders (their values stay with them)
/// and gives waiting receivers std::nullopt, as in the buffered mode.
/// T must be nothrow move-constructible and nothrow destructible (checked at
/// compile time).
template <class T> class Channel {
  static_assert(std::is_nothrow_move_constructible_v<T> && std::is_nothrow_destructible_v<T>,
                "coresched::Channel<T> needs a nothrow move constructor and destructor");

public:
  /// Creates an open channel buffering up to `capacity` items; 0 makes it
  /// unbuffered (every send waits for a receiver). The buffer is allocated
  /// here, whole.
  /// @throws UsageError when a buffer of `capacity` items cannot be allocated.
  explicit Channel(std::size_t capacity) : cap_(capacity) {
    if (capacity == 0) return;
    try {
      if (capacity > PTRDIFF_MAX / sizeof(std::optional<T>)) throw std::bad_array_new_length();
      buf_ = std::make_unique<std::optional<T>[]>(capacity);
    } catch (const std::bad_alloc&) {
      throw UsageError("coresched: Channel capacity " + std::to_string(capacity) + " is more than can be allocated (" +
                       std::to_string(sizeof(std::optional<T>)) + " bytes an item)");
    }
  }
  /// Not copyable or movable: waiters refer to the object by address.
  Channel(const Channel&) = delete;
  /// Not assignable, for the same reason.
  Channel& operator=(const Channel&) = delete;

  /// Sends `v`, waiting while the channel is full (unbuffered: until a
  /// receiver takes it). Returns false (and leaves `v` untouched) if the
  /// channel is or becomes closed before it was taken.
  bool send(T&& v) { return send_impl(v, detail::kNever, {}); }
  /// Sends a copy of `v`; see send(T&&).
  bool send(const T& v) {
    T copy(v);
    return send_impl(copy, detail::kNever, {});
  }
  /// As send(T&&), giving up when `st` is stopped; false (and `v`
  /// untouched) if it was not sent.
  bool send(T&& v, std::stop_token st) { return send_impl(v, detail::kNever, st); }
  /// As send(T&&), waiting at most `d` (and while `st` is not stopped);
  /// false (and `v` untouched) if it was not sent.
  template <class Rep, class Period>
  bool send_for(T&& v, const std::chrono::duration<Rep, Period>& d, std::stop_token st = {}) {
    return send_impl(v, detail::deadline_after(d) | 1, st);
  }
  /// As send(T&&), waiting until `t` at the latest (and while `st` is not
  /// stopped); false (and `v` untouched) if it was not sent.
  template <class Clock, class Duration>
  bool send_until(T&& v, const std::chrono::time_point<Clock, Duration>& t, std::stop_token st = {}) {
    return send_impl(v, detail::deadline_at(t) | 1, st);
  }
  /// Sends a copy of `v`; see send_for(T&&, d, st).
  template <class Rep, class Period>
  bool send_for(const T& v, const std::chrono::duration<Rep, Period>& d, std::stop_token st = {}) {
    T copy(v);
    return send_impl(copy, detail::deadline_after(d) | 1, st);
  }
  /// Sends a copy of `v`; see send_until(T&&, t, st).
  template <class Clock, class Duration>
  bool send_until(const T& v, const std::chrono::time_point<Clock, Duration>& t, std::stop_token st = {}) {
    T copy(v);
    return send_impl(copy, detail::deadline_at(t) | 1, st);
  }
  /// Sends `v` only if that needs no wait. Returns false (and leaves `v`
  /// untouched) if the channel is full or closed (unbuffered: unless a
  /// receiver is waiting).
  bool try_send(T&& v) { return send_impl(v, kTry, {}); }
  /// Sends a copy of `v` only if that needs no wait; see try_send(T&&).
  bool try_send(const T& v) {
    T copy(v);
    return send_impl(copy, kTry, {});
  }
  /// Receives the oldest item, waiting while the channel is empty and open.
  /// Returns std::nullopt once the channel is closed and drained.
  std::optional<T> recv() { return recv_impl(detail::kNever, {}); }
  /// As recv(), giving up when `st` is stopped (std::nullopt then).
  std::optional<T> recv(std::stop_token st) { return recv_impl(detail::kNever, st); }
  /// As recv(), waiting at most `d` (and while `st` is not stopped);
  /// std::nullopt if nothing came (closed() tells whether it was closed).
  template <class Rep, class Period>
  std::optional<T> recv_for(const std::chrono::duration<Rep, Period>& d, std::stop_token st = {}) {
    return recv_impl(detail::deadline_after(d) | 1, st);
  }
  /// As recv(), waiting until `t` at the latest (and while `st` is not
  /// stopped); std::nullopt if nothing came.
  template <class Clock, class Duration>
  std::optional<T> recv_until(const std::chrono::time_point<Clock, Duration>& t, std::stop_token st = {}) {
    return recv_impl(detail::deadline_at(t) | 1, st);
  }
  /// Receives the oldest item if one is there now (unbuffered: from a waiting
  /// sender); std::nullopt otherwise.
  std::optional<T> try_recv() { return recv_impl(kTry, {}); }
  /// Closes the channel: waiting senders fail, waiting receivers get
  /// std::nullopt, buffered items can still be received. Idempotent.
  void close() noexcept {
    lk_.lock();
    closed_ = true;
    detail::Waiter* s = senders_.pop_all();
    detail::Waiter* r = receivers_.pop_all();
    lk_.unlock();
    detail::WaitQueue::wake_all(s);
    detail::WaitQueue::wake_all(r);
  }
  /// Whether close() was called.
  bool closed() const noexcept {
    lk_.lock();
    const bool c = closed_;
    lk_.unlock();
    return c;
  }
  /// Items buffered now (a snapshot).
  std::size_t size() const noexcept {
    lk_.lock();
    const std::size_t n = size_;
    lk_.unlock();
    return n;
  }
  /// The capacity given at construction (0: unbuffered).
  std::size_t capacity() const noexcept { return cap_; }

private:
  // A deadline of 0 means "do not wait" (the timed calls' deadlines are made
  // odd, so a time point at the clock's epoch cannot read as a try).
  static constexpr std::uint64_t kTry = 0;

  // Waits in `q` until `deadline` (kNever: for ever) or until `st` is
  // stopped; the untimed wait skips the deadline's bookkeeping.
  void wait_in(detail::WaitQueue& q, std::uint64_t deadline, const std::stop_token& st, void* slot, const char* what) {
    if (deadline == detail::kNever && !st.stop_possible()) q.wait(lk_, slot, nullptr, nullptr, what);
    else q.wait_until(lk_, deadline, st.stop_possible() ? &st : nullptr, slot, nullptr, nullptr, what);
  }

  // How far an operation got under the lock without waiting: done, failed
  // (the channel is closed; a receive also found nothing buffered), or it
  // has to wait.
  enum class Step : unsigned char { done, failed, wait };

  // Under lk_: the send as far as it goes without waiting (done: `v` moved
  // into the buffer or to a waiting receiver). `wake`: a waiter to wake once
  // lk_ is released. A waiting select takes part only if its case is chosen
  // (WaitQueue::pop claims it first), so its value moves only then.
  Step send_locked(T& v, detail::Waiter*& wake) {
    if (closed_) return Step::failed;
    if ((wake = receivers_.pop())) { // the buffer is empty: hand over directly
      static_cast<std::optional<T>*>(detail::WaitQueue::slot(wake))->emplace(std::move(v));
      return Step::done;
    }
    if (size_ < cap_) {
      buf_[(head_ + size_) % cap_].emplace(std::move(v));
      ++size_;
      return Step::done;
    }
    return Step::wait;
  }

  // Under lk_: the receive as far as it goes without waiting (done: `out`
  // holds the oldest item); `wake` as for send_locked.
  Step recv_locked(std::optional<T>& out, detail::Waiter*& wake) {
    if (size_ > 0) {
      std::optional<T>& front = buf_[head_];
      out.emplace(std::move(*front));
      front.reset();
      head_ = (head_ + 1) % cap_;
      --size_;
      if ((wake = senders_.pop())) { // the buffer was full: move the oldest sender's value in
        auto* slot = static_cast<detail::SendSlot*>(detail::WaitQueue::slot(wake));
        buf_[(head_ + size_) % cap_].emplace(std::move(*static_cast<T*>(slot->value)));
        ++size_;
        slot->taken = true;
      }
      return Step::done;
    }
    // Nothing buffered. A sender can wait here only in an unbuffered channel
    // (a buffered one has senders waiting only while full): take its value
    // straight from its frame, which stays alive until we wake it.
    if ((wake = senders_.pop())) {
      auto* slot = static_cast<detail::SendSlot*>(detail::WaitQueue::slot(wake));
      out.emplace(std::move(*static_cast<T*>(slot->value)));
      slot->taken = true;
      return Step::done;
    }
    return closed_ ? Step::failed : Step::wait;
  }

  bool send_impl(T& v, std::uint64_t deadline, const std::stop_token& st) {
    lk_.lock();
    detail::Waiter* wake = nullptr;
    const Step step = send_locked(v, wake);
    if (step != Step::wait || deadline == kTry) {
      lk_.unlock();
      if (wake) detail::WaitQueue::wake(wake);
      return step == Step::done;
    }
    detail::SendSlot slot{&v};
    // A receiver takes the value, or close(), the deadline or `st` releases us.
    wait_in(senders_, deadline, st, &slot, "Channel send");
    return slot.taken;
  }

  std::optional<T> recv_impl(std::uint64_t deadline, const std::stop_token& st) {
    std::optional<T> out;
    lk_.lock();
    detail::Waiter* wake = nullptr;
    if (recv_locked(out, wake) != Step::wait || deadline == kTry) {
      lk_.unlock();
      if (wake) detail::WaitQueue::wake(wake);
      return out;
    }
    // A sender fills `out`; close(), the deadline or `st` leave it empty.
    wait_in(receivers_, deadline, st, &out, "Channel recv");
    return out;
  }

  friend struct detail::SelectAccess;

  const std::size_t cap_;
  std::unique_ptr<std::optional<T>[]> buf_; // null when unbuffered
  std::size_t head_ = 0, size_ = 0;
  bool closed_ = false;
  mutable detail::SyncLock lk_;
  // Senders wait only when full (unbuffered: always, until a receiver comes),
  // receivers only when empty.
  detail::WaitQueue senders_, receivers_;
};

} // namespace coresched
