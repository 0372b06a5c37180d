// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file io.hpp
/// Fiber-blocking I/O on the worker's I/O backend (io_uring, or epoll where
/// io_uring is forbidden: Options::io_backend). Each call suspends the calling
/// fiber (never its worker) until the operation completes. Errors
/// come back as values: a bad or closed fd is an error code, never a crash or
/// a hang. These are fiber-only calls (UsageError on a plain thread).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stop_token>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <system_error>

namespace coresched::io {

/// The outcome of one operation: a byte count or fd on success, else an error
/// (std::errc::timed_out for an expired timeout, operation_canceled for a
/// cancelled one or one cut short by Runtime::shutdown(), or the errno the
/// kernel returned, in std::system_category()).
struct Result {
  std::int64_t value = 0;  ///< Bytes transferred, or the new fd (accept, openat).
  std::error_code error;   ///< Empty on success.
  /// True on success.
  bool ok() const noexcept { return !error; }
  /// Same as ok().
  explicit operator bool() const noexcept { return ok(); }
};

/// Lets another fiber or thread cancel an operation in flight. Pass one to an
/// I/O call; cancel() makes that call return operation_canceled (if the
/// kernel had not completed it yet). One operation at a time: a call that
/// starts while another holds it is a UsageError.
class Cancellation {
public:
  /// Creates a handle with nothing cancelled yet.
  Cancellation() = default;
  /// Not copyable or movable: an operation in flight refers to the handle by address.
  Cancellation(const Cancellation&) = delete;
  /// Not assignable, for the same reason.
  Cancellation& operator=(const Cancellation&) = delete;
  /// Requests cancellation of the operation now in flight, if any; sticky, so
  /// an operation started later with this object is cancelled at once.
  /// Callable from any fiber or thread.
  void cancel() noexcept;
  /// Whether cancel() was called.
  bool cancelled() const noexcept;

private:
  friend struct CancellationAccess;
  mutable std::atomic<bool> busy_{false}; // guards the fields below (a tiny spin lock)
  bool cancelled_ = false;
  void* ring_ = nullptr;   // the worker ring the operation is in flight on
  void* op_ = nullptr;     // the operation
  std::uint64_t seq_ = 0;  // which operation (stack slots are reused)
};

/// Per-call options: a timeout for the operation, a cancellation handle
/// and/or a stop token.
struct OpOptions {
  std::optional<std::chrono::nanoseconds> timeout; ///< Fail with timed_out this long after submission.
  Cancellation* cancel = nullptr;                  ///< Lets another fiber or thread cancel it; must outlive the call.
  /// A stop request cancels the operation (operation_canceled), as
  /// `cancel->cancel()` would (it cancels `cancel` itself when one is given).
  std::stop_token stop;
};

/// read(2) at `offset` (-1: the file position).
Result read(int fd, std::span<std::byte> buf, std::int64_t offset = -1, OpOptions o = {});
/// write(2) at `offset` (-1: the file position).
Result write(int fd, std::span<const std::byte> buf, std::int64_t offset = -1, OpOptions o = {});
/// readv(2).
Result readv(int fd, std::span<const iovec> iov, std::int64_t offset = -1, OpOptions o = {});
/// writev(2).
Result writev(int fd, std::span<const iovec> iov, std::int64_t offset = -1, OpOptions o = {});
/// recv(2).
Result recv(int fd, std::span<std::byte> buf, int flags = 0, OpOptions o = {});
/// send(2); MSG_NOSIGNAL is always added, so a closed peer is EPIPE, not SIGPIPE.
Result send(int fd, std::span<const std::byte> buf, int flags = 0, OpOptions o = {});
/// accept4(2) with SOCK_CLOEXEC; value is the new fd.
Result accept(int fd, sockaddr* addr = nullptr, socklen_t* addrlen = nullptr, OpOptions o = {});
/// connect(2).
Result connect(int fd, const sockaddr* addr, socklen_t addrlen, OpOptions o = {});
/// Waits until `fd` has any of `events` (POLLIN, POLLOUT, ...); value is the revents.
Result poll(int fd, unsigned events, OpOptions o = {});
/// fsync(2).
Result fsync(int fd, OpOptions o = {});
/// openat(2) with O_CLOEXEC added; value is the new fd.
Result openat(int dirfd, const char* path, int flags, mode_t mode = 0, OpOptions o = {});
/// close(2), through the ring; takes no timeout or cancellation.
Result close(int fd);
/// Suspends the fiber until `deadline` on the ring's timer (CLOCK_MONOTONIC, the
/// steady clock); never wakes early. Succeeds when the deadline passes;
/// operation_canceled if `cancel` fires or the runtime shuts down first.
Result sleep_until(std::chrono::steady_clock::time_point deadline, Cancellation* cancel = nullptr);

} // namespace coresched::io
