// SPDX-License-Identifier: Apache-2.0
// The io_uring backend of a worker's Reactor (liburing): fiber I/O, fiber
// timers, and the worker's sleep. The ring is created in its worker thread (a DEFER_TASKRUN ring can
// only be waited on by its creator) with SINGLE_ISSUER | DEFER_TASKRUN |
// COOP_TASKRUN where the kernel takes them, dropping flags one by one on
// EINVAL. An eventfd read is always armed, so any thread can wake the worker
// out of io_uring_wait_cqe by writing the eventfd.
#pragma once

#include "reactor/reactor.hpp"

#include <liburing.h>

#include <cstdint>
#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace coresched::detail {

struct Fiber;

namespace testing {
/// Test-only: how long a reap may hold SQEs back, in ns (default
/// IoRing::kMaxDeferNs), so a test can let a burst fill the submission queue.
extern std::atomic<std::uint64_t> max_io_defer_ns;
} // namespace testing

/// Empty if an io_uring with every opcode the runtime uses can be set up by
/// this process; else why not ("io_uring_setup: Operation not permitted").
std::string io_uring_unavailable();

class IoRing final : public Reactor {
public:
  IoRing() = default;
  ~IoRing() override;
  IoRing(const IoRing&) = delete;
  IoRing& operator=(const IoRing&) = delete;

  /// Creates the ring on the calling thread. Throws std::runtime_error naming
  /// what the kernel refused or which opcode is missing.
  void init(unsigned entries);
  /// The setup flags the kernel accepted, as text (for the log).
  std::string flags_text() const;

  IoBackend backend() const noexcept override { return IoBackend::io_uring; }
  std::string describe() const override { return "io_uring, flags " + flags_text(); }
  /// Never completes at once: the SQE goes with the next submission.
  bool start(IoOp* op, std::optional<std::chrono::nanoseconds> timeout) override;
  void cancel_all() override;
  /// With `submit_now` false, queued SQEs may wait for a later reap (for up
  /// to kMaxDeferNs), unless the kernel has to be entered anyway to collect
  /// completions: one io_uring_enter then does both.
  void reap(std::vector<Fiber*>& done, bool submit_now = true) override;
  void wait(std::vector<Fiber*>& done) override;
  bool wait_for(std::vector<Fiber*>& done, std::uint64_t ns) override;
  /// Writes the eventfd whose read is always armed.
  void wake() const noexcept override;

  /// An SQE for `op` (submitting queued ones if the SQ is full).
  io_uring_sqe* prepare(IoOp* op);
  /// Registers `entries` (a power of two) buffer slots at `ring` (page
  /// aligned) as a provided-buffer ring (owner thread); the group id, or a
  /// negative errno.
  int register_buf_ring(void* ring, unsigned entries);
  /// Unregisters group `bgid` (owner thread); its id may be used again.
  void unregister_buf_ring(int bgid);
  /// Submits queued SQEs.
  void submit();

  /// How long a reap may leave an SQE unsubmitted. A bound in time, not in
  /// reaps: between two reaps a CPU-bound fiber may run a whole slice (the
  /// ticker then preempts it, see needs_attention()).
  static constexpr std::uint64_t kMaxDeferNs = 50'000;

private:
  void cancel_one(IoOp* op) override { queue_cancel(op); }
  /// Links a timeout to the SQE prepared just before.
  void link_timeout(io_uring_sqe* sqe, IoOp* op, __kernel_timespec* ts);
  void arm_wakeup();
  void complete(io_uring_cqe* cqe, std::vector<Fiber*>& done);
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
  // Buffer group ids start at 64. Linux 6.1 keeps groups 0-63 in an array
  // and, when one is unregistered, leaves its ring head where it was: a
  // ring registered again under that id starts at the old head, so the
  // kernel takes buffers the consumer still holds or never gave (every
  // stream after a runtime's first would read wrong bytes). Groups from 64
  // up are freed on unregistering and start
  // afresh. Later kernels reset the head either way.
  static constexpr int kFirstBgid = 64;
  int next_bgid_ = kFirstBgid;     // owner only: buffer group ids handed out
  std::vector<int> free_bgids_;    // and given back
};

} // namespace coresched::detail
