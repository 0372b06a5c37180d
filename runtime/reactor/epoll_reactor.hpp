// SPDX-License-Identifier: Apache-2.0
// The epoll backend of a worker's Reactor, for where io_uring is forbidden
// (container seccomp profiles, kernel.io_uring_disabled) or incomplete.
//
// An operation is first tried at once without blocking (MSG_DONTWAIT,
// RWF_NOWAIT, a zero-timeout poll, a non-blocking connect or accept); what
// completes there returns to the fiber without parking it. What would block
// waits for its fd's readiness (EPOLLONESHOT, re-armed by every wait, so an
// fd closed and reused behind our back can never leave a fiber waiting on a
// registration that is gone) and is tried again when it comes. Work that
// readiness cannot wait for (regular files, openat, fsync) runs on the
// runtime's BlockingPool. Sleeps and timeouts are a heap of deadlines that
// the worker's epoll_pwait2 sleeps towards; an eventfd wakes it.
#pragma once

#include "platform/indexed_heap.hpp"
#include "reactor/reactor.hpp"

#include <algorithm>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace coresched::detail {

class EpollReactor final : public Reactor {
public:
  explicit EpollReactor(BlockingPool& pool) : pool_(pool) {}
  ~EpollReactor() override;

  /// Creates the epoll instance and the wake-up eventfd on the calling
  /// thread; throws std::runtime_error naming what failed.
  void init();

  IoBackend backend() const noexcept override { return IoBackend::epoll; }
  std::string describe() const override;
  /// True when the operation completed at once (op->result holds it; the
  /// op is not in flight and the fiber need not park).
  bool start(IoOp* op, std::optional<std::chrono::nanoseconds> timeout) override;
  void cancel_all() override;
  /// With `submit_now` false, epoll is polled only if kMaxPollGapNs have
  /// passed since it last was (timers, offloaded work and cancellations are
  /// always looked at).
  void reap(std::vector<Fiber*>& done, bool submit_now = true) override;
  void wait(std::vector<Fiber*>& done) override;
  bool wait_for(std::vector<Fiber*>& done, std::uint64_t ns) override;
  void wake() const noexcept override;

  /// While other fibers are runnable, how long fd events may wait for a poll.
  static constexpr std::uint64_t kMaxPollGapNs = 50'000;

private:
  // How an operation goes on once it cannot complete at once.
  enum class Next { done, wait_in, wait_out, offload };
  /// Tries `op` without blocking; sets op->result when done.
  Next attempt(IoOp* op);
  /// Does `op` the blocking way (on a pool thread); returns the result.
  static int run_blocking(const IoRequest& r);
  void cancel_one(IoOp* op) override;
  /// Takes `op` off its fd's waiters, or out of the pool's queue; false if
  /// a pool thread runs it already (its result then stands).
  bool withdraw(IoOp* op);

  // Readiness waits: the ops waiting on one fd, and the events armed for them.
  struct FdWait {
    IoOp* head = nullptr;
    unsigned armed = 0;
    bool registered = false; // added to the epoll set (and not known to be gone)
    bool drained = false;    // its last read was short, and no event came since
  };
  /// The fd's entry, or null where it has none yet (a lookup on every
  /// operation: fds are small numbers, so a table indexed by them, not a hash).
  FdWait* find_fd(int fd) noexcept {
    return fd >= 0 && static_cast<std::size_t>(fd) < fds_.size() ? &fds_[static_cast<std::size_t>(fd)] : nullptr;
  }
  const FdWait* find_fd(int fd) const noexcept { return const_cast<EpollReactor*>(this)->find_fd(fd); }
  /// The fd's entry, made where it has none.
  FdWait& fd_entry(int fd) {
    const auto i = static_cast<std::size_t>(fd);
    if (i >= fds_.size()) fds_.resize(std::max<std::size_t>(i + 1, fds_.size() * 2));
    return fds_[i];
  }
  bool skip_try(const IoRequest& r) const;
  void wait_on_fd(IoOp* op, unsigned events);
  /// (Re-)arms `fd` for its waiters; `newest` just joined them (null: none).
  void arm(int fd, FdWait& w, IoOp* newest);
  /// Ends every waiter of `w` but `keep` with `result`.
  void end_waiters_but(FdWait& w, IoOp* keep, int result);
  /// io::close(fd): its waiters end with EBADF, its entry goes.
  void drop_fd(int fd);
  /// A read of a regular file got `got` bytes of more, before its end:
  /// true, with the request moved on to the rest (for the pool).
  bool rest_of_file(IoOp* op, int got);
  bool unlink_from_fd(IoOp* op);
  void on_ready(int fd, std::vector<Fiber*>& done);

  // Offloaded ops: the pool thread writes only the task, never the op (whose
  // fiber may be gone once it is abandoned).
  struct Offload;
  struct Inbox; // offloaded tasks that finished, for the owner
  void offload(IoOp* op);
  void collect_offloaded(std::vector<Fiber*>& done);

  // Timers: ops by expires_ns.
  void timer_add(IoOp* op, std::uint64_t at);
  void timer_remove(IoOp* op);
  void expire(std::uint64_t now, std::vector<Fiber*>& done);

  /// Ends `op` with `result` at the next reap (its timer and fd wait are
  /// gone already); op->pending 0 marks it ended.
  void end_later(IoOp* op, int result);
  /// Ends `op` with `result` (timer and fd wait removed) and wakes its fiber.
  void finish(IoOp* op, int result, std::vector<Fiber*>& done);
  void note_unpolled() noexcept;
  /// Collects cancellations, posted work and offloaded results.
  void collect(std::vector<Fiber*>& done);
  /// Wakes the fibers of ops ended by end_later().
  void collect_ended(std::vector<Fiber*>& done);
  /// Polls epoll for at most `ns` (0: do not block; UINT64_MAX: until an event).
  bool poll(std::uint64_t ns, std::vector<Fiber*>& done);

  BlockingPool& pool_;
  int epfd_ = -1;
  int event_fd_ = -1;
  bool have_pwait2_ = true;
  std::uint64_t last_poll_ns_ = 0;
  unsigned fd_waiters_ = 0;
  std::vector<FdWait> fds_; // by fd; an entry of a fd never waited on is empty
  IndexedHeap<IoOp, &IoOp::expires_ns, &IoOp::heap_index> timers_;
  std::vector<IoOp*> cancelled_; // ended by cancel_one() or a failed arm(): woken at the next reap
  std::unordered_map<IoOp*, std::shared_ptr<Offload>> offloaded_;
  std::shared_ptr<Inbox> inbox_;
};

} // namespace coresched::detail
