// SPDX-License-Identifier: Apache-2.0
// coresched::io over the calling worker's Reactor: describe the operation,
// start it, and park the fiber until the worker's reaping wakes it (unless
// the backend completed it at once).
#include "reactor/reactor.hpp"
#include "sched/scheduler.hpp"
#include "platform/spin_lock.hpp"
#include "sched/worker.hpp"

#include <coresched/io.hpp>
#include <coresched/join_handle.hpp>
#include <coresched/this_fiber.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <immintrin.h>
#include <poll.h>
#include <fcntl.h>
#include <unistd.h>

namespace coresched::io {

// The runtime's view of a Cancellation.
struct CancellationAccess {
  static void lock(const Cancellation& c) noexcept {
    while (c.busy_.exchange(true, std::memory_order_acquire)) _mm_pause();
  }
  static void unlock(const Cancellation& c) noexcept { c.busy_.store(false, std::memory_order_release); }
  // Registers an operation; false if already cancelled.
  static bool attach(Cancellation& c, detail::Reactor* ring, detail::IoOp* op) noexcept {
    lock(c);
    const bool ok = !c.cancelled_;
    if (ok) {
      c.ring_ = ring;
      c.op_ = op;
      c.seq_ = op->seq;
    }
    unlock(c);
    return ok;
  }
  // Whether an operation is registered now (the handle serves one at a time).
  static bool in_use(const Cancellation& c) noexcept {
    lock(c);
    const bool v = c.op_ != nullptr;
    unlock(c);
    return v;
  }
  static void detach(Cancellation& c) noexcept {
    lock(c);
    c.ring_ = c.op_ = nullptr;
    unlock(c);
  }
  static bool cancel(Cancellation& c) noexcept {
    lock(c);
    c.cancelled_ = true;
    if (c.ring_) static_cast<detail::Reactor*>(c.ring_)->request_cancel(static_cast<detail::IoOp*>(c.op_), c.seq_);
    unlock(c);
    return true;
  }
  static bool cancelled(const Cancellation& c) noexcept {
    lock(c);
    const bool v = c.cancelled_;
    unlock(c);
    return v;
  }
};

void Cancellation::cancel() noexcept { CancellationAccess::cancel(*this); }
bool Cancellation::cancelled() const noexcept { return CancellationAccess::cancelled(*this); }

namespace {

detail::Worker& require_fiber(const char* what) {
  detail::Worker* w = detail::Worker::current();
  if (!w || !w->in_task())
    throw UsageError(std::string("coresched::io::") + what + "() called outside a fiber");
  return *w;
}

Result to_result(const detail::IoOp& op) {
  if (op.result >= 0) return {op.result, {}};
  if (op.timed_out) return {0, std::make_error_code(std::errc::timed_out)};
  if (op.result == -ECANCELED) return {0, std::make_error_code(std::errc::operation_canceled)};
  return {0, std::error_code(-op.result, std::system_category())};
}

// Runs one operation; the fiber parks until it completes. `why` is what a
// fiber dump reports it waits for.
Result run_op(const detail::WaitInfo& why, const OpOptions& o, const detail::IoRequest& req);

// A stop token becomes a cancellation: the caller's, or one of the call's own.
Result run(const detail::WaitInfo& why, const OpOptions& o, const detail::IoRequest& req) {
  if (!o.stop.stop_possible()) [[likely]]
    return run_op(why, o, req);
  Cancellation own;
  OpOptions with_cancel = o;
  if (!with_cancel.cancel) with_cancel.cancel = &own;
  Cancellation* c = with_cancel.cancel;
  const auto stop_op = [c]() noexcept { c->cancel(); };
  const std::stop_callback<decltype(stop_op)> on_stop(o.stop, stop_op);
  return run_op(why, with_cancel, req);
}

Result run_op(const detail::WaitInfo& why, const OpOptions& o, const detail::IoRequest& req) {
  detail::Worker& w = require_fiber(why.what);
  // A second operation would take the handle over, and cancel() then reach
  // only it: the first would run to its timeout, or for ever. Checked before anything
  // is started; two calls that start at the same instant on two workers can
  // still both pass.
  if (o.cancel && CancellationAccess::in_use(*o.cancel))
    throw UsageError(std::string("coresched: io::") + why.what +
                     ": its Cancellation is in use by another operation in flight (one at a time)");
  if (o.cancel && CancellationAccess::cancelled(*o.cancel)) return {0, std::make_error_code(std::errc::operation_canceled)};
  detail::Reactor& reactor = w.reactor();
  detail::IoOp op;
  op.fiber = w.running();
  op.req = req;
  if (reactor.start(&op, o.timeout)) {
    // Completed at once (the epoll backend): a scheduling point all the
    // same, so a fiber whose I/O never waits still gives way when asked.
    this_fiber::preempt_point();
    return to_result(op);
  }
  // Cancelled meanwhile, or begun after shutdown did: cancel it at once. A
  // worker cancels its in-flight I/O only once, when it first sees the
  // runtime stopping (Worker::poll_io); an operation begun after that pass
  // would otherwise wait for ever and keep shutdown waiting for its fiber.
  // This fiber runs on the thread that made that pass, so if the pass is
  // behind us it saw `stopping` before this load does.
  const bool refused = o.cancel && !CancellationAccess::attach(*o.cancel, &reactor, &op);
  if (refused || w.scheduler().stopping()) reactor.request_cancel(&op, op.seq);
  // The worker may stay busy with other fibers. Where the backend flags
  // completions (Reactor::flags_completions) the running fiber's next
  // preemption point collects them, as it submits what the worker holds back
  // for a batch (Worker::ask_back_for_io). Elsewhere the ticker asks for a
  // scheduling point: an io_uring that cannot flag needs it at the fine
  // period from now (also when nothing else is queued now: a fiber may
  // arrive or be stolen before the worker goes idle); an epoll worker that
  // stops polling is found overdue by the ticker's next tick.
  if (reactor.pokes_ticker()) w.scheduler().want_fine_ticks();
  op.fiber->state.store(detail::FiberState::parking, std::memory_order_release);
  w.park(why); // `w` may be another worker when we resume; only `op` is used below
  if (o.cancel) CancellationAccess::detach(*o.cancel);
  return to_result(op);
}

// An operation on `fd` (-1: none), named `what`.
Result run(const char* what, const OpOptions& o, const detail::IoRequest& req) {
  return run({.kind = detail::WaitKind::io, .what = what, .arg = req.fd}, o, req);
}

// A transfer's length as the kernel takes it: at most MAX_RW_COUNT (INT_MAX
// rounded down to a page), the most one read(2) or send(2) moves anyway, so
// a larger buffer gets a short count, as from the system call. Cast
// straight to a 32-bit length, 4 GiB + 5 bytes would go as 5 and 4 GiB as 0,
// and a write-everything loop would never get on.
unsigned transfer_len(std::size_t n) noexcept { return static_cast<unsigned>(std::min<std::size_t>(n, 0x7ffff000)); }

// An iovec count: more than IOV_MAX fails in the kernel (EINVAL); cast to 32
// bits, 2^32 + 1 vectors would go as one.
unsigned iov_count(std::size_t n) noexcept { return static_cast<unsigned>(std::min<std::size_t>(n, std::size_t{IOV_MAX} + 1)); }

} // namespace

using detail::IoKind;
using detail::IoRequest;

static void* bytes(std::span<const std::byte> b) noexcept { return const_cast<std::byte*>(b.data()); }

Result read(int fd, std::span<std::byte> buf, std::int64_t offset, OpOptions o) {
  return run("read", o, {.kind = IoKind::read, .fd = fd, .buf = buf.data(), .len = transfer_len(buf.size()), .offset = offset});
}

Result write(int fd, std::span<const std::byte> buf, std::int64_t offset, OpOptions o) {
  return run("write", o, {.kind = IoKind::write, .fd = fd, .buf = bytes(buf), .len = transfer_len(buf.size()), .offset = offset});
}

Result readv(int fd, std::span<const iovec> iov, std::int64_t offset, OpOptions o) {
  return run("readv", o, {.kind = IoKind::readv, .fd = fd, .iov = iov.data(), .iovcnt = iov_count(iov.size()), .offset = offset});
}

Result writev(int fd, std::span<const iovec> iov, std::int64_t offset, OpOptions o) {
  return run("writev", o, {.kind = IoKind::writev, .fd = fd, .iov = iov.data(), .iovcnt = iov_count(iov.size()), .offset = offset});
}

Result recv(int fd, std::span<std::byte> buf, int flags, OpOptions o) {
  return run("recv", o, {.kind = IoKind::recv, .fd = fd, .buf = buf.data(), .len = transfer_len(buf.size()), .flags = flags});
}

Result send(int fd, std::span<const std::byte> buf, int flags, OpOptions o) {
  return run("send", o,
             {.kind = IoKind::send, .fd = fd, .buf = bytes(buf), .len = transfer_len(buf.size()), .flags = flags | MSG_NOSIGNAL});
}

Result accept(int fd, sockaddr* addr, socklen_t* addrlen, OpOptions o) {
  return run("accept", o, {.kind = IoKind::accept, .fd = fd, .addr = addr, .addrlen = addrlen});
}

Result connect(int fd, const sockaddr* addr, socklen_t addrlen, OpOptions o) {
  return run("connect", o,
             {.kind = IoKind::connect, .fd = fd, .addr = const_cast<sockaddr*>(addr), .addr_len = addrlen});
}

Result poll(int fd, unsigned events, OpOptions o) {
  return run("poll", o, {.kind = IoKind::poll, .fd = fd, .events = events});
}

Result fsync(int fd, OpOptions o) { return run("fsync", o, {.kind = IoKind::fsync, .fd = fd}); }

Result openat(int dirfd, const char* path, int flags, mode_t mode, OpOptions o) {
  return run("openat", o, {.kind = IoKind::openat, .fd = dirfd, .flags = flags | O_CLOEXEC, .path = path, .mode = mode});
}

Result close(int fd) {
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer tracks file descriptors through its close(2) interceptor
  // and cannot see a close done by the ring. The next pipe/socket/open that
  // reuses the number in another fiber then looks like a race with the fd's
  // creation (a false report). So under TSan the close is the plain system
  // call, which is short and never blocks for long.
  require_fiber("close");
  if (::close(fd) == 0) return {0, {}};
  return {0, std::error_code(errno, std::system_category())};
#else
  return run("close", {}, {.kind = IoKind::close, .fd = fd});
#endif
}

Result sleep_until(std::chrono::steady_clock::time_point deadline, Cancellation* cancel) {
  // steady_clock is CLOCK_MONOTONIC, the clock both backends' timers use, so
  // the fiber never wakes before `deadline`.
  OpOptions o;
  o.cancel = cancel;
  const auto at = std::max<std::int64_t>(std::chrono::nanoseconds(deadline.time_since_epoch()).count(), 0);
  const detail::WaitInfo why{.kind = detail::WaitKind::sleep, .what = "sleep_until", .arg = at};
  Result r = run(why, o, {.kind = IoKind::sleep, .deadline_ns = static_cast<std::uint64_t>(at)});
  if (r.error.value() == ETIME && r.error.category() == std::system_category()) r.error.clear(); // the timer fired, as asked
  return r;
}

} // namespace coresched::io
