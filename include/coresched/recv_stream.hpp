// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file recv_stream.hpp
/// Receiving from a socket with one standing request: a multishot recv whose
/// buffers the kernel picks from a ring the stream owns. Where io::recv()
/// submits a request (and, when no data is there yet, arms a poll) for every
/// message, a RecvStream submits once, and each message that arrives is a
/// completion with no system call of its own. On the epoll backend a stream
/// is one buffer of `buffer_size` bytes and next() a recv into it: the same
/// results, one copy.

#include <coresched/io.hpp>

#include <chrono>
#include <cstddef>
#include <span>

namespace coresched::io {

namespace detail_stream {
/// The runtime's side of a stream (runtime/io/recv_stream.cpp).
struct State;
} // namespace detail_stream

/// A stream of the data arriving on a connected socket (TCP, a stream
/// socketpair, ...). Create it in a fiber; it registers `buffers` buffers of
/// `buffer_size` bytes with that fiber's worker's io_uring, and the kernel
/// fills them as data comes (Linux 6.0 or later; on an older kernel the first
/// next() returns the kernel's error). The fiber, or the stream, may move to
/// another worker: completions are handed over to it there.
///
/// Data that arrives while all buffers are full stays in the socket, and the
/// request is started again once next() has given buffers back (if the
/// stream's worker is busy meanwhile, within a tick of the slice ticker).
///
/// Destroy the stream before its Runtime; destruction is safe on any thread
/// and never waits (the standing request is cancelled and its buffers freed
/// by the worker that owns them). Not thread-safe: one fiber calls next() at a
/// time. A stream may be moved; a moved-from stream is empty.
class RecvStream {
public:
  /// Starts receiving on `fd` (not taken over: the caller still closes it,
  /// after the stream is gone). `buffers` is rounded up to a power of two and
  /// must be 1..32768; `buffer_size` 1..1 GiB. Throws UsageError outside a
  /// fiber or for a bad size; an fd that is not a connected socket shows as
  /// the first next()'s error.
  explicit RecvStream(int fd, std::size_t buffer_size = 4096, unsigned buffers = 4);
  /// Cancels the standing request; the buffers are freed once the kernel has
  /// let go of them. Never blocks.
  ~RecvStream();
  /// Takes the stream over; `other` is left empty.
  RecvStream(RecvStream&& other) noexcept;
  /// Ends this stream (as the destructor does) and takes `other` over.
  RecvStream& operator=(RecvStream&& other) noexcept;
  /// Not copyable: the stream owns its buffers and its request.
  RecvStream(const RecvStream&) = delete;
  /// Not copyable.
  RecvStream& operator=(const RecvStream&) = delete;

  /// Waits for the next chunk of data and points `data` at it: valid until
  /// the next call of next() or the stream's end, which give its buffer back
  /// to the kernel. value is its size; 0 when the peer has closed the
  /// connection. Errors as io.hpp's: the socket's errno, operation_canceled
  /// after cancel() or Runtime::shutdown(). After 0 or an error the stream has
  /// ended and every later call returns the same. UsageError outside a fiber
  /// or on an empty stream.
  Result next(std::span<const std::byte>& data);
  /// As next(), waiting at most `timeout` (zero or negative: only what is
  /// there now; a huge one saturates):
  /// timed_out if no data came in that time. The stream goes on: what
  /// arrives later is for the next call.
  Result next(std::span<const std::byte>& data, std::chrono::nanoseconds timeout);

  /// Any thread: ends the stream; a next() waiting now or later returns
  /// operation_canceled (data already received is delivered first).
  void cancel() noexcept;

private:
  Result next_until(std::span<const std::byte>& data, std::uint64_t deadline_ns);
  detail_stream::State* state_ = nullptr;
};

} // namespace coresched::io
