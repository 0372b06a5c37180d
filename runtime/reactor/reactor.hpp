// SPDX-License-Identifier: Apache-2.0
// A worker's reactor: where its fibers' I/O, sleeps and timeouts wait, and
// where the worker itself sleeps when it has nothing to run. Two backends
// implement it, io_uring (IoRing) and epoll (EpollReactor); the runtime picks
// one at construction (choose_io_backend) and every worker makes its own.
//
// The words the hot paths read (needs_attention(), inflight(), the kernel
// flags word that preempt_point() watches) are plain members of this base, so
// that checking them costs no virtual call whichever backend runs.
#pragma once

#include <coresched/options.hpp>

#include "reactor/inflight_table.hpp"

#include <liburing.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <cstddef>
#include <mutex>
#include <optional>
#include <chrono>
#include <string>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <utility>
#include <vector>

namespace coresched::detail {

struct Fiber;
class BlockingPool;

/// What an operation does: one per coresched::io call.
enum class IoKind : std::uint8_t { read, write, readv, writev, recv, send, accept, connect, poll, fsync, openat, close, sleep };

/// An operation's arguments, as the io:: call received them.
struct IoRequest {
  IoKind kind = IoKind::sleep;
  int fd = -1;                  // the fd (openat: the dirfd)
  void* buf = nullptr;          // read/recv: where to; write/send: from where
  unsigned len = 0;             // bytes (already capped at what one system call moves)
  const iovec* iov = nullptr;   // readv/writev
  unsigned iovcnt = 0;
  std::int64_t offset = -1;     // -1: the file position
  int flags = 0;                // recv/send flags, openat flags
  unsigned events = 0;          // poll
  sockaddr* addr = nullptr;     // accept: where the peer's address goes; connect: the address
  socklen_t* addrlen = nullptr; // accept
  socklen_t addr_len = 0;       // connect
  const char* path = nullptr;   // openat
  mode_t mode = 0;
  std::uint64_t deadline_ns = 0; // sleep: CLOCK_MONOTONIC, absolute
};

/// One in-flight operation. Lives on the waiting fiber's stack, or for a
/// multishot request in whatever object consumes its completions.
struct IoOp {
  Fiber* fiber = nullptr;
  std::int32_t result = 0;
  int pending = 1;        // completions still to come (io_uring: 2 with a linked timeout)
  bool timed_out = false;
  std::uint64_t seq = 0;  // unique per reactor, so a late cancel cannot hit a reused stack slot
  IoRequest req;
  std::int32_t carried = 0; // epoll: bytes a file read got before its rest went to the pool
  /// io_uring only. Set for a multishot request: called on the owner thread
  /// for each of its CQEs (`last`: the kernel ended the request, no
  /// IORING_CQE_F_MORE) instead of waking `fiber`; it appends to `done` the
  /// fibers to wake. The ring no longer refers to the op once `last` is
  /// passed, so the handler may free it.
  void (*on_cqe)(IoOp* op, const io_uring_cqe& cqe, bool last, std::vector<Fiber*>& done) = nullptr;
  // io_uring only: the timeout's or sleep's time, which the kernel reads at
  // submission (perhaps a batch later), so it lives as long as the op.
  __kernel_timespec ts{};
  // epoll only: the op's timer (0: none) and its place in the timer heap,
  // and the next op waiting on the same fd.
  std::uint64_t expires_ns = 0;
  int heap_index = -1;
  IoOp* next_waiter = nullptr;
};

class Reactor {
public:
  /// The io_uring SQ flags that call for a reap (preempt_point() tests the
  /// watched word against them; an epoll reactor's word stays zero).
  static constexpr unsigned kReapFlags = IORING_SQ_TASKRUN | IORING_SQ_CQ_OVERFLOW;

  virtual ~Reactor() = default;
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  virtual IoBackend backend() const noexcept = 0;
  /// How it was set up, for the log.
  virtual std::string describe() const = 0;

  // Owner thread.
  /// Starts `op` (op->req says what; op->fiber waits for it) with an optional
  /// timeout. True if it completed at once (op->result holds the outcome and
  /// nothing is in flight); else the fiber parks next and a reap wakes it.
  virtual bool start(IoOp* op, std::optional<std::chrono::nanoseconds> timeout) = 0;
  /// Cancels every in-flight operation (shutdown).
  virtual void cancel_all() = 0;
  /// Collects what completed without blocking; appends their fibers to
  /// `done`. With `submit_now` false the backend may batch system calls (hold
  /// submissions back, skip a poll) for a bounded time.
  virtual void reap(std::vector<Fiber*>& done, bool submit_now = true) = 0;
  /// Blocks until a completion or a wake-up; then reaps like reap().
  virtual void wait(std::vector<Fiber*>& done) = 0;
  /// As wait(), for at most `ns`; true if that time passed with no completion
  /// and no wake-up.
  virtual bool wait_for(std::vector<Fiber*>& done, std::uint64_t ns) = 0;

  // Any thread.
  /// Makes wait() return.
  virtual void wake() const noexcept = 0;
  /// Cancels `op` if operation `seq` is still in flight (queued, then done by
  /// the owner).
  void request_cancel(IoOp* op, std::uint64_t seq);
  /// Runs `fn` on the owner thread at its next reap, and wakes it if it
  /// sleeps. For work only the owner may do and that can wait.
  void post(std::function<void()> fn);

  /// Whether the backend raises a reap flag in kernel_flags() when
  /// completions wait to be collected. Where it does, a busy worker's fiber
  /// sees them at its next preemption point; where not, the ticker asks.
  bool flags_completions() const noexcept { return flags_completions_; }
  /// Whether a fiber's wait must poke the ticker to its fine period: where
  /// completions are neither flagged nor looked for by the ticker unasked
  /// (an io_uring without TASKRUN_FLAG). The ticker runs while any worker is
  /// busy and asks an epoll worker that has not polled (overdue()) itself.
  bool pokes_ticker() const noexcept { return pokes_ticker_; }
  /// Whether deferring() means submissions held back, which the next fiber
  /// must be asked back for at its first preemption point (io_uring); an
  /// epoll reactor holds none (a fiber that used up its slice is preceded
  /// by a poll in Worker::before_run instead).
  bool asks_back() const noexcept { return asks_back_; }
  /// The word those flags are raised in (this_fiber::preempt_point reads it).
  const unsigned* kernel_flags() const noexcept { return attention_word_; }
  /// Any thread: the owner should reach a scheduling point soon (completions
  /// flagged, or submissions held back).
  bool needs_attention() const noexcept {
    return deferring() || (__atomic_load_n(attention_word_, __ATOMIC_RELAXED) & attention_mask_);
  }
  /// Any thread (the ticker): whether the owner should be asked to look now:
  /// completions flagged, or something held unattended for overdue_after_ns_
  /// (io_uring: SQEs held back, at once; epoll: waits not polled for
  /// EpollReactor::kMaxPollGapNs, which a worker that switches fibers never
  /// reaches, so an I/O server's workers are left alone and the ticker need
  /// not run at its fine period for them).
  bool overdue(std::uint64_t now) const noexcept {
    if (__atomic_load_n(attention_word_, __ATOMIC_RELAXED) & attention_mask_) return true;
    const std::uint64_t since = deferred_since_.load(std::memory_order_relaxed);
    // (`now` may be older than `since`: the ticker read its clock first.)
    return since != 0 && (overdue_after_ns_ == 0 || (now > since && now - since >= overdue_after_ns_));
  }
  /// Whether submissions are being held back for a batch (any thread).
  bool deferring() const noexcept { return deferred_since_.load(std::memory_order_relaxed) != 0; }
  /// Operations in flight (any thread: the ticker reads it).
  unsigned inflight() const noexcept { return inflight_.load(std::memory_order_relaxed); }
  /// Cancellations or posted work wait for the owner (any thread).
  bool remote_pending() const noexcept { return remote_pending_.load(std::memory_order_relaxed); }

protected:
  Reactor() = default;
  /// Gives `op` its sequence number and counts it in flight.
  void track(IoOp* op) {
    op->seq = inflight_ops_.add(op);
    publish_inflight();
  }
  void untrack(IoOp* op) {
    inflight_ops_.remove(op->seq);
    publish_inflight();
  }
  /// Whether `op` is still in flight as operation `seq` (reads only the
  /// table: `op` may be gone).
  bool tracked(const IoOp* op, std::uint64_t seq) const { return inflight_ops_.contains(op, seq); }
  /// Runs what other threads queued: posted work, and cancellations of ops
  /// still in flight (cancel_one()).
  void drain_remote();
  /// Cancels one tracked op (owner thread).
  virtual void cancel_one(IoOp* op) = 0;

  // The table's size, for the ticker to read: written by the owner only
  // (a plain store, not a locked RMW).
  std::atomic<unsigned> inflight_{0};
  void publish_inflight() noexcept {
    inflight_.store(static_cast<unsigned>(inflight_ops_.size()), std::memory_order_relaxed);
  }
  // When submissions were first held back; 0: none. Owner writes, any reads.
  std::atomic<std::uint64_t> deferred_since_{0};
  bool flags_completions_ = false;
  bool pokes_ticker_ = true;
  bool asks_back_ = true;
  std::uint64_t overdue_after_ns_ = 0;
  const unsigned* attention_word_ = &kZeroWord;
  unsigned attention_mask_ = 0;
  InflightTable<IoOp> inflight_ops_; // owner thread only

private:
  static constexpr unsigned kZeroWord = 0;
  std::mutex remote_mu_;
  std::vector<std::pair<IoOp*, std::uint64_t>> cancels_; // guarded by remote_mu_
  std::vector<std::function<void()>> posted_;             // guarded by remote_mu_
  std::atomic<bool> remote_pending_{false};

protected:
  /// Posted work not yet run (the destructor of a backend runs it).
  void run_leftover_posts();
};

/// A worker's reactor, built in place inside the worker: the words its
/// switch path reads (inflight(), deferring()) are then at a fixed offset
/// from the worker. Through a pointer each would cost a load more, and yield
/// would go over its instruction budget (bench/budget). Holds either backend.
class ReactorSlot {
public:
  ReactorSlot() = default;
  ~ReactorSlot() {
    if (made_) get()->~Reactor();
  }
  ReactorSlot(const ReactorSlot&) = delete;
  ReactorSlot& operator=(const ReactorSlot&) = delete;

  /// Builds an `R` here (once); `R`'s Reactor base must sit at its start.
  template <class R, class... Args> R& emplace(Args&&... args) {
    static_assert(sizeof(R) <= kBytes && alignof(R) <= kAlign, "ReactorSlot too small for this backend");
    R* r = new (bytes_) R(std::forward<Args>(args)...);
    made_ = true;
    return *r;
  }
  Reactor* get() noexcept { return std::launder(reinterpret_cast<Reactor*>(bytes_)); }
  const Reactor* get() const noexcept { return std::launder(reinterpret_cast<const Reactor*>(bytes_)); }
  Reactor* operator->() noexcept { return get(); }
  const Reactor* operator->() const noexcept { return get(); }

private:
  static constexpr std::size_t kBytes = 768, kAlign = 64;
  alignas(kAlign) std::byte bytes_[kBytes];
  bool made_ = false;
};

/// The backend a runtime uses and why ("requested", or why not io_uring).
struct IoBackendChoice {
  IoBackend backend;
  std::string reason;
};
/// Resolves Options::io_backend (automatic: CORESCHED_IO_BACKEND, then a
/// probe of io_uring on the calling thread). A forced io_uring that cannot
/// start, or an unknown name, is a UsageError naming why.
IoBackendChoice choose_io_backend(IoBackend requested);

/// Builds a reactor of `backend` in `slot` for the calling thread (its
/// owner). `pool` runs the epoll backend's blocking work. Throws
/// std::runtime_error naming what the kernel refused.
void make_reactor(ReactorSlot& slot, IoBackend backend, BlockingPool& pool);

} // namespace coresched::detail
