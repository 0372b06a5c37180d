// SPDX-License-Identifier: Apache-2.0
// A worker's io_uring (liburing): fiber I/O, fiber timers, and the worker's
// sleep. The ring is created in its worker thread (a DEFER_TASKRUN ring can
// only be waited on by its creator) with SINGLE_ISSUER | DEFER_TASKRUN |
// COOP_TASKRUN where the kernel takes them, dropping flags one by one on
// EINVAL. An eventfd read is always armed, so any thread can wake the worker
// out of io_uring_wait_cqe by writing the eventfd.
#pragma once

#include <liburing.h>

#include <cstdint>
#include <atomic>
#include <functional>
#include <mutex>
#include <unordered_set>
#include <string>
#include <vector>

namespace coresched::detail {

struct Fiber;

namespace testing {
/// Test-only: how long a reap may hold SQEs back, in ns (default
/// IoRing::kMaxDeferNs), so a test can let a burst fill the submission queue.
extern std::atomic<std::uint64_t> max_io_defer_ns;
} // namespace testing

/// One in-flight operation. Lives on the waiting fiber's stack, or for a
/// multishot request in whatever object consumes its completions.
struct IoOp {
  Fiber* fiber = nullptr;
  std::int32_t result = 0;
  int pending = 1;        // CQEs still to come (2 with a linked timeout)
  bool timed_out = false;
  std::uint64_t seq = 0;  // unique per ring, so a late cancel cannot hit a reused stack slot
  /// Set for a multishot request: called on the owner thread for each of its
  /// CQEs (`last`: the kernel ended the request, no IORING_CQE_F_MORE) instead
  /// of waking `fiber`; it appends to `done` the fibers to wake. The ring no
  /// longer refers to the op once `last` is passed, so the handler may free it.
  void (*on_cqe)(IoOp* op, const io_uring_cqe& cqe, bool last, std::vector<Fiber*>& done) = nullptr;
};

class IoRing {
public:
  IoRing() = default;
  ~IoRing();
  IoRing(const IoRing&) = delete;
  IoRing& operator=(const IoRing&) = delete;

  /// Creates the ring on the calling thread. Throws std::runtime_error naming
  /// what the kernel refused or which opcode is missing.
  void init(unsigned entries);
  /// The setup flags the kernel accepted, as text (for the log).
  std::string flags_text() const;

  /// An SQE for `op` (submitting queued ones if the SQ is full).
  io_uring_sqe* prepare(IoOp* op);
  /// Links a timeout to the SQE prepared just before.
  void link_timeout(io_uring_sqe* sqe, IoOp* op, __kernel_timespec* ts);
  /// Asks the kernel to cancel `op` if operation `seq` is still in flight
  /// (any thread: queued, then done by the owner).
  void request_cancel(IoOp* op, std::uint64_t seq);
  /// Cancels every in-flight operation (shutdown).
  void cancel_all();
  /// Any thread: runs `fn` on the owner thread at its next reap, and wakes it
  /// if it sleeps; a busy owner gets to it at its next scheduling point that
  /// reaps (or at the ring's end). For work that only the owner may do and
  /// that can wait: unregistering a buffer ring.
  void post(std::function<void()> fn);
  /// Registers `entries` (a power of two) buffer slots at `ring` (page
  /// aligned) as a provided-buffer ring (owner thread); the group id, or a
  /// negative errno.
  int register_buf_ring(void* ring, unsigned entries);
  /// Unregisters group `bgid` (owner thread); its id may be used again.
  void unregister_buf_ring(int bgid);
  /// Submits queued SQEs.
  void submit();
  /// Processes completions without blocking; appends fibers whose ops
  /// finished. With `submit_now` false, queued SQEs may wait for a later
  /// reap (for up to kMaxDeferNs), unless the kernel has to be entered anyway
  /// to collect completions: one io_uring_enter then does both.
  void reap(std::vector<Fiber*>& done, bool submit_now = true);
  /// Blocks until a completion or a wake-up; then reaps like reap().
  void wait(std::vector<Fiber*>& done);
  /// As wait(), for at most `ns`; true if that time passed with no completion
  /// and no wake-up.
  bool wait_for(std::vector<Fiber*>& done, std::uint64_t ns);
  /// Any thread: makes wait() return.
  void wake() const noexcept;
  /// Any thread: the owner should reach a scheduling point soon, because the
  /// kernel holds completions that it has not collected (IORING_SQ_TASKRUN,
  /// never set where the ring lacks TASKRUN_FLAG; or a completion queue that
  /// overflowed) or it holds back SQEs.
  /// Whether the kernel raises IORING_SQ_TASKRUN in kernel_flags() when
  /// completions wait to be collected (TASKRUN_FLAG). Where it does, a busy
  /// worker's fiber sees them at its next preemption point and no tick is
  /// needed for them; where it does not, the ticker asks for a reap.
  bool flags_completions() const noexcept { return setup_flags_ & IORING_SETUP_TASKRUN_FLAG; }
  /// The word the kernel raises those flags in (this_fiber::preempt_point reads it).
  const unsigned* kernel_flags() const noexcept { return ring_.sq.kflags; }
  /// The flags of kernel_flags() that call for a reap.
  static constexpr unsigned kReapFlags = IORING_SQ_TASKRUN | IORING_SQ_CQ_OVERFLOW;
  bool needs_attention() const noexcept {
    const unsigned kflags = IO_URING_READ_ONCE(*ring_.sq.kflags);
    return deferring() || (kflags & IORING_SQ_CQ_OVERFLOW) ||
           ((setup_flags_ & IORING_SETUP_TASKRUN_FLAG) && (kflags & IORING_SQ_TASKRUN));
  }
  /// Whether SQEs are being held back to be submitted in a batch (owner thread only).
  bool deferring() const noexcept { return deferred_since_.load(std::memory_order_relaxed) != 0; }
  /// Operations in flight (any thread: the ticker reads it, see Ticker).
  unsigned inflight() const noexcept { return inflight_.load(std::memory_order_relaxed); }
  /// Any thread: cancellations or posted work wait for the owner.
  bool remote_pending() const noexcept { return remote_pending_.load(std::memory_order_relaxed); }

  /// How long a reap may leave an SQE unsubmitted. A bound in time, not in
  /// reaps: between two reaps a CPU-bound fiber may run a whole slice (the
  /// ticker then preempts it, see needs_attention()).
  static constexpr std::uint64_t kMaxDeferNs = 50'000;

private:
  void arm_wakeup();
  void complete(io_uring_cqe* cqe, std::vector<Fiber*>& done);
  void drain_remote();
  /// Queues a cancellation of `op` by its user_data (submitted with the next batch).
  void queue_cancel(IoOp* op);
  /// Whether completions wait in the kernel until we enter it.
  bool events_pending() const noexcept;
  /// Queued SQEs were submitted.
  void submitted() noexcept;
  /// Starts or continues deferring the queued SQEs; false once they have waited kMaxDeferNs.
  bool defer_submission() noexcept;

  io_uring ring_{};
  bool ready_ = false;
  unsigned setup_flags_ = 0;
  int event_fd_ = -1;
  std::uint64_t event_value_ = 0;
  // Written by the owner only (so a load and a store, not a locked RMW);
  // atomic because the ticker reads it.
  std::atomic<unsigned> inflight_{0};
  void add_inflight(int d) noexcept { inflight_.store(inflight_.load(std::memory_order_relaxed) + d, std::memory_order_relaxed); }
  // When a reap first left queued SQEs unsubmitted; 0: none. Written by the
  // owner only; atomic because the ticker reads it (needs_attention()).
  std::atomic<std::uint64_t> deferred_since_{0};
  std::uint64_t next_seq_ = 1;
  std::unordered_set<IoOp*> inflight_ops_; // owner thread only
  std::mutex remote_mu_;
  std::vector<std::pair<IoOp*, std::uint64_t>> cancels_; // guarded by remote_mu_
  std::vector<std::function<void()>> posted_;             // guarded by remote_mu_
  std::atomic<bool> remote_pending_{false};
  // Buffer group ids start at 64. Linux 6.1 keeps groups 0-63 in an array
  // and, when one is unregistered, leaves its ring head where it was: a
  // ring registered again under that id starts at the old head, so the
  // kernel takes buffers the consumer still holds or never gave (seen in
  // the SMT guest's 6.1 kernel: every stream after a runtime's first read
  // wrong bytes). Groups from 64 up are freed on unregistering and start
  // afresh. Later kernels reset the head either way.
  static constexpr int kFirstBgid = 64;
  int next_bgid_ = kFirstBgid;     // owner only: buffer group ids handed out
  std::vector<int> free_bgids_;    // and given back
};

} // namespace coresched::detail
