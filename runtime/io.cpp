// SPDX-License-Identifier: Apache-2.0
// coresched::io over the calling worker's IoRing: prepare an SQE, park the
// fiber, and let the worker's completion reaping wake it.
#include "io_ring.hpp"
#include "scheduler.hpp"
#include "spin_lock.hpp"
#include "worker.hpp"

#include <coresched/io.hpp>
#include <coresched/join_handle.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <immintrin.h>
#include <poll.h>
#include <unistd.h>

namespace coresched::io {

// The runtime's view of a Cancellation.
struct CancellationAccess {
  static void lock(const Cancellation& c) noexcept {
    while (c.busy_.exchange(true, std::memory_order_acquire)) _mm_pause();
  }
  static void unlock(const Cancellation& c) noexcept { c.busy_.store(false, std::memory_order_release); }
  // Registers an operation; false if already cancelled.
  static bool attach(Cancellation& c, detail::IoRing* ring, detail::IoOp* op) noexcept {
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
    if (c.ring_) static_cast<detail::IoRing*>(c.ring_)->request_cancel(static_cast<detail::IoOp*>(c.op_), c.seq_);
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

__kernel_timespec to_timespec(std::chrono::nanoseconds d) {
  if (d.count() < 0) d = std::chrono::nanoseconds(0);
  return {static_cast<long long>(d.count() / 1'000'000'000), static_cast<long long>(d.count() % 1'000'000'000)};
}

Result to_result(const detail::IoOp& op) {
  if (op.result >= 0) return {op.result, {}};
  if (op.timed_out) return {0, std::make_error_code(std::errc::timed_out)};
  if (op.result == -ECANCELED) return {0, std::make_error_code(std::errc::operation_canceled)};
  return {0, std::error_code(-op.result, std::system_category())};
}

// Runs one operation: `prep` fills the SQE; the fiber parks until it completes.
// `why` is what a fiber dump reports it waits for.
template <class Prep> Result run(const detail::WaitInfo& why, const OpOptions& o, Prep prep) {
  detail::Worker& w = require_fiber(why.what);
  // A second operation took the handle over, and cancel() then reached only
  // it: the first ran to its timeout, or for ever (helper-20). Checked
  // before anything is queued; two calls that start at the same instant on
  // two workers can still both pass.
  if (o.cancel && CancellationAccess::in_use(*o.cancel))
    throw UsageError(std::string("coresched: io::") + why.what +
                     ": its Cancellation is in use by another operation in flight (one at a time)");
  detail::IoRing& ring = w.ring();
  detail::IoOp op;
  op.fiber = w.running();
  io_uring_sqe* sqe = ring.prepare(&op);
  prep(sqe);
  __kernel_timespec ts{};
  if (o.timeout) {
    ts = to_timespec(*o.timeout);
    ring.link_timeout(sqe, &op, &ts);
  }
  // Cancelled before it started, or begun after shutdown did: cancel it at
  // once, through the ring (the SQE is queued already). A worker cancels its
  // in-flight I/O only once, when it first sees the runtime stopping
  // (Worker::poll_io); an operation begun after that pass would otherwise
  // wait for ever and keep shutdown waiting for its fiber. This fiber runs on
  // the thread that made that pass, so if the pass is behind us it saw
  // `stopping` before this load does.
  const bool refused = o.cancel && !CancellationAccess::attach(*o.cancel, &ring, &op);
  if (refused || w.scheduler().stopping()) ring.request_cancel(&op, op.seq);
  // The worker may stay busy with other fibers. The completion then reaches
  // it at its running fiber's next preemption point, where the ring flags it
  // (IoRing::flags_completions); and the SQE, if the worker holds it back
  // for a batch, at the first preemption point of the fiber it runs next
  // (Worker::ask_back_for_io). Where the ring cannot flag completions the
  // ticker asks for a scheduling point within a quarter slice. Also when
  // nothing else is queued now: a fiber may arrive or be stolen before the
  // worker goes idle (a review found this when the poke was made conditional).
  if (!ring.flags_completions()) w.scheduler().want_fine_ticks();
  op.fiber->state.store(detail::FiberState::parking, std::memory_order_release);
  w.park(why); // submits the SQE, now or with the worker's next batch (Worker::poll_io) // `w` may be another worker when we resume; only `op` is used below
  if (o.cancel) CancellationAccess::detach(*o.cancel);
  return to_result(op);
}

// An operation on `fd` (-1: none), named `what`.
template <class Prep> Result run(const char* what, std::int64_t fd, const OpOptions& o, Prep prep) {
  return run({.kind = detail::WaitKind::io, .what = what, .arg = fd}, o, prep);
}

// A transfer's length as the kernel takes it: at most MAX_RW_COUNT (INT_MAX
// rounded down to a page), the most one read(2) or send(2) moves anyway, so
// a larger buffer gets a short count, as from the system call. Cast
// straight to the SQE's 32-bit length, 4 GiB + 5 bytes went as 5 and 4 GiB
// as 0 (helper-20): a write-everything loop never got on.
unsigned transfer_len(std::size_t n) noexcept { return static_cast<unsigned>(std::min<std::size_t>(n, 0x7ffff000)); }

// An iovec count: more than IOV_MAX fails in the kernel (EINVAL); cast to 32
// bits, 2^32 + 1 vectors would have gone as one.
unsigned iov_count(std::size_t n) noexcept { return static_cast<unsigned>(std::min<std::size_t>(n, std::size_t{IOV_MAX} + 1)); }

} // namespace

Result read(int fd, std::span<std::byte> buf, std::int64_t offset, OpOptions o) {
  return run("read", fd, o, [&](io_uring_sqe* s) {
    io_uring_prep_read(s, fd, buf.data(), transfer_len(buf.size()), static_cast<__u64>(offset));
  });
}

Result write(int fd, std::span<const std::byte> buf, std::int64_t offset, OpOptions o) {
  return run("write", fd, o, [&](io_uring_sqe* s) {
    io_uring_prep_write(s, fd, buf.data(), transfer_len(buf.size()), static_cast<__u64>(offset));
  });
}

Result readv(int fd, std::span<const iovec> iov, std::int64_t offset, OpOptions o) {
  return run("readv", fd, o, [&](io_uring_sqe* s) {
    io_uring_prep_readv(s, fd, iov.data(), iov_count(iov.size()), static_cast<__u64>(offset));
  });
}

Result writev(int fd, std::span<const iovec> iov, std::int64_t offset, OpOptions o) {
  return run("writev", fd, o, [&](io_uring_sqe* s) {
    io_uring_prep_writev(s, fd, iov.data(), iov_count(iov.size()), static_cast<__u64>(offset));
  });
}

Result recv(int fd, std::span<std::byte> buf, int flags, OpOptions o) {
  return run("recv", fd, o, [&](io_uring_sqe* s) { io_uring_prep_recv(s, fd, buf.data(), transfer_len(buf.size()), flags); });
}

Result send(int fd, std::span<const std::byte> buf, int flags, OpOptions o) {
  return run("send", fd, o,
             [&](io_uring_sqe* s) { io_uring_prep_send(s, fd, buf.data(), transfer_len(buf.size()), flags | MSG_NOSIGNAL); });
}

Result accept(int fd, sockaddr* addr, socklen_t* addrlen, OpOptions o) {
  return run("accept", fd, o, [&](io_uring_sqe* s) { io_uring_prep_accept(s, fd, addr, addrlen, SOCK_CLOEXEC); });
}

Result connect(int fd, const sockaddr* addr, socklen_t addrlen, OpOptions o) {
  return run("connect", fd, o, [&](io_uring_sqe* s) { io_uring_prep_connect(s, fd, addr, addrlen); });
}

Result poll(int fd, unsigned events, OpOptions o) {
  return run("poll", fd, o, [&](io_uring_sqe* s) { io_uring_prep_poll_add(s, fd, events); });
}

Result fsync(int fd, OpOptions o) {
  return run("fsync", fd, o, [&](io_uring_sqe* s) { io_uring_prep_fsync(s, fd, 0); });
}

Result openat(int dirfd, const char* path, int flags, mode_t mode, OpOptions o) {
  return run("openat", dirfd, o, [&](io_uring_sqe* s) { io_uring_prep_openat(s, dirfd, path, flags | O_CLOEXEC, mode); });
}

Result close(int fd) {
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer tracks file descriptors through its close(2) interceptor
  // and cannot see a close done by the ring. The next pipe/socket/open that
  // reuses the number in another fiber then looks like a race with the fd's
  // creation (a false report: fuzzer "core:2 pu:2" in CI). So under TSan the
  // close is the plain system call, which is short and never blocks for long.
  require_fiber("close");
  if (::close(fd) == 0) return {0, {}};
  return {0, std::error_code(errno, std::system_category())};
#else
  return run("close", fd, {}, [&](io_uring_sqe* s) { io_uring_prep_close(s, fd); });
#endif
}

Result sleep_until(std::chrono::steady_clock::time_point deadline, Cancellation* cancel) {
  // steady_clock is CLOCK_MONOTONIC, the clock of an absolute io_uring timeout,
  // so the fiber never wakes before `deadline`.
  const auto ts = to_timespec(deadline.time_since_epoch());
  OpOptions o;
  o.cancel = cancel;
  const detail::WaitInfo why{.kind = detail::WaitKind::sleep,
                             .what = "sleep_until",
                             .arg = static_cast<std::int64_t>(deadline.time_since_epoch().count())};
  Result r = run(why, o, [&](io_uring_sqe* s) {
    io_uring_prep_timeout(s, const_cast<__kernel_timespec*>(&ts), 0, IORING_TIMEOUT_ABS);
  });
  if (r.error.value() == ETIME && r.error.category() == std::system_category()) r.error.clear(); // the timer fired, as asked
  return r;
}

} // namespace coresched::io
