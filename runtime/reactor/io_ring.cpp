// SPDX-License-Identifier: Apache-2.0
#include "reactor/io_ring.hpp"

#include "platform/clock.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <sys/eventfd.h>
#include <unistd.h>

namespace coresched::detail {

namespace testing {
std::atomic<std::uint64_t> max_io_defer_ns{IoRing::kMaxDeferNs};
} // namespace testing

namespace {
// user_data tags in the low bits (IoOp is at least 4-byte aligned).
constexpr std::uint64_t kTagOp = 0, kTagWakeup = 1, kTagTimeout = 2, kTagIgnore = 3, kTagMask = 3;

std::uint64_t tagged(const void* p, std::uint64_t tag) { return reinterpret_cast<std::uint64_t>(p) | tag; }

std::string errno_text(int err) { return std::strerror(err); }

// Opcodes the fiber I/O API relies on.
struct Required {
  int op;
  const char* name;
};
constexpr Required kRequired[] = {
    {IORING_OP_READ, "READ"},       {IORING_OP_WRITE, "WRITE"},     {IORING_OP_READV, "READV"},
    {IORING_OP_WRITEV, "WRITEV"},   {IORING_OP_RECV, "RECV"},       {IORING_OP_SEND, "SEND"},
    {IORING_OP_ACCEPT, "ACCEPT"},   {IORING_OP_CONNECT, "CONNECT"}, {IORING_OP_POLL_ADD, "POLL_ADD"},
    {IORING_OP_FSYNC, "FSYNC"},     {IORING_OP_OPENAT, "OPENAT"},   {IORING_OP_CLOSE, "CLOSE"},
    {IORING_OP_TIMEOUT, "TIMEOUT"}, {IORING_OP_LINK_TIMEOUT, "LINK_TIMEOUT"},
    {IORING_OP_ASYNC_CANCEL, "ASYNC_CANCEL"},
};
} // namespace

std::string io_uring_unavailable() {
  io_uring ring{};
  const int rc = io_uring_queue_init(4, &ring, 0);
  if (rc < 0) return "io_uring_setup: " + errno_text(-rc);
  std::string why;
  if (io_uring_probe* probe = io_uring_get_probe_ring(&ring)) {
    std::string missing;
    for (const auto& r : kRequired)
      if (!io_uring_opcode_supported(probe, r.op)) missing += std::string(missing.empty() ? "" : ", ") + r.name;
    io_uring_free_probe(probe);
    if (!missing.empty()) why = "the kernel's io_uring lacks opcode(s) " + missing;
  } else {
    why = "io_uring_register(PROBE) failed";
  }
  io_uring_queue_exit(&ring);
  return why;
}

IoRing::~IoRing() {
  run_leftover_posts();
  if (ready_) io_uring_queue_exit(&ring_);
  if (event_fd_ >= 0) ::close(event_fd_);
}

void IoRing::init(unsigned entries) {
  // Prefer the cheapest mode, falling back where the kernel says EINVAL.
  // TASKRUN_FLAG makes the kernel raise IORING_SQ_TASKRUN when completions
  // wait for us to enter it; without it a busy worker would never see them.
  constexpr unsigned kSingle = IORING_SETUP_SINGLE_ISSUER, kDefer = IORING_SETUP_DEFER_TASKRUN,
                     kCoop = IORING_SETUP_COOP_TASKRUN, kFlag = IORING_SETUP_TASKRUN_FLAG;
  const unsigned candidates[] = {kSingle | kDefer | kCoop | kFlag, kSingle | kDefer | kFlag, kSingle | kCoop | kFlag,
                                 kCoop | kFlag, kCoop, 0};
  int rc = -EINVAL;
  unsigned flags = 0;
  for (unsigned c : candidates) {
    flags = c;
    rc = io_uring_queue_init(entries, &ring_, flags);
    if (rc != -EINVAL) break;
  }
  if (rc < 0) throw std::runtime_error("coresched: io_uring_queue_init failed: " + errno_text(-rc));
  ready_ = true;
  setup_flags_ = flags;
  // TASKRUN_FLAG: the kernel raises IORING_SQ_TASKRUN in the SQ's flags word
  // when completions wait for us to enter it; an overflowed CQ always needs it.
  flags_completions_ = flags & kFlag;
  pokes_ticker_ = !flags_completions_;
  attention_word_ = ring_.sq.kflags;
  attention_mask_ = IORING_SQ_CQ_OVERFLOW | (flags_completions_ ? IORING_SQ_TASKRUN : 0u);
  io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
  if (!probe) throw std::runtime_error("coresched: cannot probe io_uring opcodes");
  std::string missing;
  for (const auto& r : kRequired)
    if (!io_uring_opcode_supported(probe, r.op)) missing += std::string(missing.empty() ? "" : ", ") + r.name;
  io_uring_free_probe(probe);
  if (!missing.empty()) throw std::runtime_error("coresched: the kernel's io_uring lacks opcode(s) " + missing);
  event_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (event_fd_ < 0) throw std::runtime_error("coresched: eventfd failed: " + errno_text(errno));
  arm_wakeup();
  submit();
}

std::string IoRing::flags_text() const {
  std::string s;
  if (setup_flags_ & IORING_SETUP_SINGLE_ISSUER) s += "SINGLE_ISSUER ";
  if (setup_flags_ & IORING_SETUP_DEFER_TASKRUN) s += "DEFER_TASKRUN ";
  if (setup_flags_ & IORING_SETUP_COOP_TASKRUN) s += "COOP_TASKRUN ";
  if (setup_flags_ & IORING_SETUP_TASKRUN_FLAG) s += "TASKRUN_FLAG ";
  return s.empty() ? "none" : s;
}

io_uring_sqe* IoRing::prepare(IoOp* op) {
  // Room for the operation and a linked timeout: a link must never be split
  // across two submissions (the kernel would run the operation without its
  // timeout and reject the lone timeout). Submissions are batched, so a full
  // queue is a normal event.
  if (io_uring_sq_space_left(&ring_) < 2) submit();
  track(op); // first: it may throw (memory), and must not leave an SQE behind naming the op
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  io_uring_sqe_set_data64(sqe, tagged(op, kTagOp));
  return sqe;
}

void IoRing::link_timeout(io_uring_sqe* sqe, IoOp* op, __kernel_timespec* ts) {
  sqe->flags |= IOSQE_IO_LINK;
  io_uring_sqe* t = io_uring_get_sqe(&ring_); // prepare() left room for it
  io_uring_prep_link_timeout(t, ts, 0);
  io_uring_sqe_set_data64(t, tagged(op, kTagTimeout));
  op->pending = 2;
}

bool IoRing::start(IoOp* op, std::optional<std::chrono::nanoseconds> timeout) {
  io_uring_sqe* s = prepare(op);
  const IoRequest& r = op->req;
  const auto off = static_cast<__u64>(r.offset);
  switch (r.kind) {
  case IoKind::read: io_uring_prep_read(s, r.fd, r.buf, r.len, off); break;
  case IoKind::write: io_uring_prep_write(s, r.fd, r.buf, r.len, off); break;
  case IoKind::readv: io_uring_prep_readv(s, r.fd, r.iov, r.iovcnt, off); break;
  case IoKind::writev: io_uring_prep_writev(s, r.fd, r.iov, r.iovcnt, off); break;
  case IoKind::recv: io_uring_prep_recv(s, r.fd, r.buf, r.len, r.flags); break;
  case IoKind::send: io_uring_prep_send(s, r.fd, r.buf, r.len, r.flags); break;
  case IoKind::accept: io_uring_prep_accept(s, r.fd, r.addr, r.addrlen, SOCK_CLOEXEC); break;
  case IoKind::connect: io_uring_prep_connect(s, r.fd, r.addr, r.addr_len); break;
  case IoKind::poll: io_uring_prep_poll_add(s, r.fd, r.events); break;
  case IoKind::fsync: io_uring_prep_fsync(s, r.fd, 0); break;
  case IoKind::openat: io_uring_prep_openat(s, r.fd, r.path, r.flags, r.mode); break;
  case IoKind::close: io_uring_prep_close(s, r.fd); break;
  case IoKind::sleep:
    // CLOCK_MONOTONIC, the clock of an absolute io_uring timeout.
    op->ts = {static_cast<long long>(r.deadline_ns / 1'000'000'000), static_cast<long long>(r.deadline_ns % 1'000'000'000)};
    io_uring_prep_timeout(s, &op->ts, 0, IORING_TIMEOUT_ABS);
    break;
  }
  if (timeout) {
    const auto ns = std::max<std::int64_t>(timeout->count(), 0);
    op->ts = {static_cast<long long>(ns / 1'000'000'000), static_cast<long long>(ns % 1'000'000'000)};
    link_timeout(s, op, &op->ts);
  }
  return false;
}

void IoRing::arm_wakeup() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (!sqe) {
    submit();
    sqe = io_uring_get_sqe(&ring_);
  }
  io_uring_prep_read(sqe, event_fd_, &event_value_, sizeof(event_value_), 0);
  io_uring_sqe_set_data64(sqe, tagged(this, kTagWakeup));
}

void IoRing::submit() {
  if (io_uring_sq_ready(&ring_) == 0) return;
  if (io_uring_submit(&ring_) >= 0) submitted();
}

bool IoRing::events_pending() const noexcept {
  // With COOP/DEFER_TASKRUN completions are posted only when we enter the
  // kernel; the TASKRUN flag says when that is needed (without the flag, ask).
  // A completion queue that overflowed holds the rest in the kernel until we
  // enter it (a multishot recv can post many CQEs between two reaps).
  if (IO_URING_READ_ONCE(*ring_.sq.kflags) & IORING_SQ_CQ_OVERFLOW) return true;
  const bool deferred = setup_flags_ & (IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_COOP_TASKRUN);
  return deferred && (!(setup_flags_ & IORING_SETUP_TASKRUN_FLAG) ||
                      (IO_URING_READ_ONCE(*ring_.sq.kflags) & IORING_SQ_TASKRUN));
}

void IoRing::submitted() noexcept {
  // The kernel may stop at an SQE it rejects; what is left is submitted next time.
  if (!deferring() || io_uring_sq_ready(&ring_) > 0) return;
  deferred_since_.store(0, std::memory_order_relaxed);
}

bool IoRing::defer_submission() noexcept {
  const std::uint64_t now = now_ns();
  const std::uint64_t since = deferred_since_.load(std::memory_order_relaxed);
  if (since == 0) {
    deferred_since_.store(now, std::memory_order_relaxed);
    return true;
  }
  return now - since < testing::max_io_defer_ns.load(std::memory_order_relaxed);
}

int IoRing::register_buf_ring(void* ring, unsigned entries) {
  int bgid = next_bgid_;
  if (!free_bgids_.empty()) bgid = free_bgids_.back();
  else if (bgid > 0xffff) return -ENOSPC; // buffer group ids are 16 bits
  io_uring_buf_reg reg{};
  reg.ring_addr = reinterpret_cast<std::uint64_t>(ring);
  reg.ring_entries = entries;
  reg.bgid = static_cast<std::uint16_t>(bgid);
  const int rc = io_uring_register_buf_ring(&ring_, &reg, 0);
  if (rc < 0) return rc;
  if (!free_bgids_.empty()) free_bgids_.pop_back();
  else ++next_bgid_;
  return bgid;
}

void IoRing::unregister_buf_ring(int bgid) {
  if (io_uring_unregister_buf_ring(&ring_, bgid) == 0) free_bgids_.push_back(bgid);
}

void IoRing::queue_cancel(IoOp* op) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (!sqe) {
    submit();
    sqe = io_uring_get_sqe(&ring_);
  }
  io_uring_prep_cancel64(sqe, tagged(op, kTagOp), 0);
  io_uring_sqe_set_data64(sqe, tagged(nullptr, kTagIgnore));
}

// One cancellation per operation, by its user_data, not one with
// IORING_ASYNC_CANCEL_ANY: Linux 6.1 never initialises a timeout request's
// cancel sequence, so a request recycled from an earlier ring's cancelled one
// can carry the sequence number of this ring's first ANY cancellation, which
// then skips it as already seen: a fiber in a long sleep would outlive
// shutdown (each new runtime's first cancel has sequence 1).
// A cancellation by user_data does not look at the sequence.
void IoRing::cancel_all() {
  for (IoOp* op : inflight_ops_.snapshot()) queue_cancel(op);
  submit();
}

void IoRing::complete(io_uring_cqe* cqe, std::vector<Fiber*>& done) {
  const std::uint64_t data = io_uring_cqe_get_data64(cqe);
  const std::uint64_t tag = data & kTagMask;
  if (tag == kTagWakeup) {
    arm_wakeup(); // a wake-up was consumed: re-arm for the next one
    return;
  }
  if (tag == kTagIgnore) return;
  auto* op = reinterpret_cast<IoOp*>(data & ~kTagMask);
  if (op->on_cqe) {
    // A multishot request: in flight until a CQE without F_MORE.
    const bool last = !(cqe->flags & IORING_CQE_F_MORE);
    if (last) untrack(op);
    op->on_cqe(op, *cqe, last, done); // may free `op` when `last`
    return;
  }
  if (tag == kTagTimeout) {
    if (cqe->res == -ETIME) op->timed_out = true;
  } else {
    op->result = cqe->res;
  }
  // Wake the fiber only when every CQE that names its op has arrived: the op
  // lives on the fiber's stack.
  if (--op->pending == 0) {
    untrack(op);
    done.push_back(op->fiber);
  }
}

void IoRing::reap(std::vector<Fiber*>& done, bool submit_now) {
  drain_remote();
  if (io_uring_sq_ready(&ring_) > 0 && !submit_now && !defer_submission()) submit_now = true;
  if (events_pending()) {
    // Entering anyway: submit the queue in the same call.
    if (io_uring_submit_and_get_events(&ring_) >= 0) submitted();
  } else if (submit_now) {
    submit();
    // What the submission completed at once (a timer already due, a send)
    // is posted at the next entry: collect it now, not a tick later.
    if (inflight() > 0 && events_pending()) io_uring_get_events(&ring_);
  }
  io_uring_cqe* cqe;
  unsigned head, n = 0;
  io_uring_for_each_cqe(&ring_, head, cqe) {
    complete(cqe, done);
    ++n;
  }
  io_uring_cq_advance(&ring_, n);
  if (submit_now) submit(); // re-armed wake-ups
}

void IoRing::wait(std::vector<Fiber*>& done) {
  drain_remote();
  io_uring_cqe* cqe = nullptr;
  const int rc = io_uring_submit_and_wait(&ring_, 1);
  if (rc >= 0) submitted();
  (void)cqe;
  reap(done);
}

bool IoRing::wait_for(std::vector<Fiber*>& done, std::uint64_t ns) {
  drain_remote();
  __kernel_timespec ts{static_cast<long long>(ns / 1'000'000'000), static_cast<long long>(ns % 1'000'000'000)};
  io_uring_cqe* cqe = nullptr;
  const int rc = io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &ts, nullptr);
  if (rc >= 0 || rc == -ETIME) submitted();
  const bool timed_out = rc == -ETIME;
  reap(done);
  return timed_out && done.empty();
}

void IoRing::wake() const noexcept {
  const std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof(one));
}

} // namespace coresched::detail
