// SPDX-License-Identifier: Apache-2.0
// io::RecvStream: one multishot recv per socket, over buffers the stream owns.
//
// Who does what, and on which thread:
//  - The buffers (a buffer ring and the memory it points into) are registered
//    with one worker's io_uring, and the standing request is submitted there.
//    Only that worker's thread may submit or (un)register, and its thread is
//    the one that reaps the request's CQEs.
//  - That thread delivers each CQE into the stream's queue (on_cqe) and wakes
//    the consumer, wherever the fiber runs now.
//  - The consumer (one fiber at a time) pops the queue and gives buffers back
//    to the buffer ring. It is the ring's only producer and the kernel its only
//    consumer, so giving back needs no lock whatever thread the fiber is on.
//  - A request is (re)submitted by the consumer, on its own worker: when the
//    fiber has moved since, the buffers move with it (fresh ones registered
//    here, the old ones unregistered by their worker when it gets to it).
//    Nothing waits on another worker's attention.
//  - When the stream is destroyed with its request in the kernel, the request
//    is cancelled and its final CQE frees the state; otherwise it is freed at
//    once (its buffers, again, by their own worker).
//
// Why a buffer ring per stream, not one per worker shared by its sockets: a
// shared ring would have many producers (every consumer, on any thread) and
// one socket could starve the others of buffers.
//
// Under the epoll backend there are no provided buffers or multishot
// requests: a stream is one buffer of buffer_size bytes, and next() is an
// io::recv() into it (the same results; the data is copied once, as recv(2)
// copies it).
#include "reactor/io_ring.hpp"
#include "sched/scheduler.hpp"
#include "platform/spin_lock.hpp"
#include "sched/worker.hpp"

#include <coresched/join_handle.hpp>
#include <coresched/recv_stream.hpp>
#include <coresched/sync.hpp>

#include <bit>
#include <cerrno>
#include <memory>
#include <sys/mman.h>
#include <system_error>
#include <unistd.h>
#include <utility>
#include <vector>

namespace coresched::io::detail_stream {

using coresched::detail::Fiber;
using coresched::detail::IoOp;
using coresched::detail::IoRing;
using coresched::detail::Worker;

// One CQE as the owner thread saw it.
struct Entry {
  std::int32_t res;
  std::uint32_t flags;
};

// A stream's buffers, registered with one ring.
struct Buffers {
  IoRing* ring = nullptr;  // registered there
  int bgid = -1;           // the buffer group
  void* region = nullptr;  // one mapping: the buffer ring's page(s), then the buffers
  std::size_t bytes = 0;
  io_uring_buf_ring* br = nullptr;
  std::byte* bufs = nullptr;
};

struct State : IoOp {
  int fd = -1;
  bool readiness = false;           // the epoll backend: next() is a recv into `copy`
  std::span<std::byte> copy;        // mapped, as the io_uring buffers are (freed at once, not to a heap)
  io::Cancellation stop;            // cancel() under the epoll backend
  std::size_t buf_size = 0;
  unsigned nbufs = 0;
  Buffers buf;            // `buf.ring` is written only under `lock` (cancel() reads it)
  int setup_error = 0;    // registering the first buffers failed (a negative errno): next() reports it

  // The consumer's own.
  int held = -1;          // the buffer the last next() handed out
  bool ended = false;     // next() returned 0 or an error, and returns it again
  Result end;

  // Guarded by `lock`: shared by the consumer, the reaping thread and cancel().
  coresched::detail::SpinLock lock;
  std::vector<Entry> q;   // CQEs not yet consumed: a circular queue of nbufs + 1
  std::size_t q_head = 0, q_count = 0;
  bool armed = false;     // a request is being submitted or is in the kernel, until its final CQE
  std::uint64_t armed_seq = 0; // that request's IoOp::seq once submitted, else 0
  bool orphaned = false;  // the RecvStream is gone: the final CQE frees the state
  bool cancelled = false;
  Fiber* waiter = nullptr;
};

namespace {

// Maps `n` buffers of `size` bytes and registers them with `ring` (its owner
// thread). 0, or a negative errno.
int open_buffers(Buffers& b, IoRing& ring, std::size_t size, unsigned n) {
  // The buffer ring must be page aligned: it starts the mapping, and the
  // buffers follow it from the next cache line, so that a small stream (the
  // ring and the buffers in one page) costs the kernel and the consumer one
  // TLB entry per message, not two (the first read of a cold ring page is
  // half of next()'s samples in the echo server).
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t ring_bytes = (n * sizeof(io_uring_buf) + 63) / 64 * 64;
  b = {};
  b.bytes = (ring_bytes + size * n + page - 1) / page * page;
  void* region = ::mmap(nullptr, b.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED) return -errno;
  b.region = region;
  b.br = static_cast<io_uring_buf_ring*>(region);
  b.bufs = static_cast<std::byte*>(region) + ring_bytes;
  io_uring_buf_ring_init(b.br);
  for (unsigned bid = 0; bid < n; ++bid)
    io_uring_buf_ring_add(b.br, b.bufs + bid * size, static_cast<unsigned>(size), static_cast<unsigned short>(bid),
                          io_uring_buf_ring_mask(n), static_cast<int>(bid));
  io_uring_buf_ring_advance(b.br, static_cast<int>(n));
  b.ring = &ring;
  b.bgid = ring.register_buf_ring(b.br, n);
  return b.bgid < 0 ? b.bgid : 0;
}

// On the thread of b.ring's owner.
void close_buffers(const Buffers& b) {
  if (b.bgid >= 0) b.ring->unregister_buf_ring(b.bgid);
  if (b.region) ::munmap(b.region, b.bytes);
}

// Any thread: the owner unregisters them, now if it is this thread.
void close_on_owner(const Buffers& b) {
  if (!b.ring) return;
  Worker* w = Worker::current();
  if (w && &w->reactor() == b.ring) close_buffers(b);
  else b.ring->post([b] { close_buffers(b); });
}

void destroy(State* s) {
  close_on_owner(s->buf);
  delete s;
}

// Under s.lock. Each data CQE holds one of nbufs buffers and a request ends
// with one final CQE, and a new request starts only once the queue is empty,
// so nbufs + 1 entries always suffice; growing is a fallback that never runs.
void push_locked(State& s, Entry e) {
  if (s.q_count == s.q.size()) {
    std::vector<Entry> bigger;
    for (std::size_t i = 0; i < s.q_count; ++i) bigger.push_back(s.q[(s.q_head + i) % s.q.size()]);
    bigger.resize(s.q.size() * 2);
    s.q = std::move(bigger);
    s.q_head = 0;
  }
  s.q[(s.q_head + s.q_count++) % s.q.size()] = e;
}

Entry pop_locked(State& s) {
  const Entry e = s.q[s.q_head];
  s.q_head = (s.q_head + 1) % s.q.size();
  --s.q_count;
  return e;
}

// IoOp::on_cqe, on the owner thread.
void on_cqe(IoOp* op, const io_uring_cqe& cqe, bool last, std::vector<Fiber*>& done) {
  auto* s = static_cast<State*>(op);
  s->lock.lock();
  push_locked(*s, {cqe.res, cqe.flags});
  if (last) {
    s->armed = false;
    s->armed_seq = 0;
  }
  Fiber* f = std::exchange(s->waiter, nullptr);
  const bool free_now = last && s->orphaned;
  s->lock.unlock();
  if (f) done.push_back(f);
  if (free_now) destroy(s);
}

// Submits the standing request on the consumer's worker, whose ring holds
// the buffers; `armed` is set already.
void arm(State& s) {
  // Outside the lock: prepare() may submit (a system call) or throw, and
  // cancel() on another thread would spin meanwhile, or for ever. Only this
  // thread reaps this ring, so no CQE of the request can arrive before
  // armed_seq is set below.
  io_uring_sqe* sqe = s.buf.ring->prepare(&s);
  io_uring_prep_recv_multishot(sqe, s.fd, nullptr, 0, 0);
  sqe->flags |= IOSQE_BUFFER_SELECT;
  sqe->buf_group = static_cast<std::uint16_t>(s.buf.bgid);
  const std::uint64_t seq = s.seq;
  s.lock.lock();
  s.armed_seq = seq;
  const bool cancel = s.cancelled; // cancel() came after next() looked
  s.lock.unlock();
  // As io.cpp's run(): a request begun after shutdown's cancellation pass
  // would wait for ever, so it is cancelled at once (its final CQE says so).
  if (cancel || Worker::current()->scheduler().stopping()) s.buf.ring->request_cancel(&s, seq);
}

// The consumer has moved to `here` since the buffers were registered: new
// buffers here, the old ones to their worker. Only while no request is in the
// kernel (nothing refers to the old ones). 0, or a negative errno.
int move_buffers(State& s, IoRing& here) {
  const Buffers old = s.buf;
  Buffers fresh;
  const int rc = open_buffers(fresh, here, s.buf_size, s.nbufs);
  if (rc < 0) {
    close_buffers(fresh); // a mapping whose registration failed
    return rc;
  }
  s.lock.lock();
  s.buf = fresh;
  s.lock.unlock();
  s.held = -1; // its buffer was one of the old ones
  close_on_owner(old);
  return 0;
}

// Returns the buffer the last next() handed out to the kernel.
void give_back(State& s) {
  if (s.held < 0) return;
  const auto bid = static_cast<unsigned>(s.held);
  io_uring_buf_ring_add(s.buf.br, s.buf.bufs + bid * s.buf_size, static_cast<unsigned>(s.buf_size),
                        static_cast<unsigned short>(bid), io_uring_buf_ring_mask(s.nbufs), 0);
  io_uring_buf_ring_advance(s.buf.br, 1);
  s.held = -1;
}

Result finish(State& s, int res) {
  s.ended = true;
  if (res == 0) s.end = {0, {}};
  else if (res == -ECANCELED) s.end = {0, std::make_error_code(std::errc::operation_canceled)};
  else s.end = {0, std::error_code(-res, std::system_category())};
  return s.end;
}

Worker& require_fiber(const char* what) {
  Worker* w = Worker::current();
  if (!w || !w->in_task()) throw UsageError(std::string("coresched::io::RecvStream: ") + what + " outside a fiber");
  return *w;
}

// Ends the stream's side of the state.
void release(State* s) noexcept {
  if (!s) return;
  if (s->readiness) { // nothing outside the stream refers to it
    if (!s->copy.empty()) ::munmap(s->copy.data(), s->copy.size());
    delete s;
    return;
  }
  s->lock.lock();
  s->orphaned = true;
  const bool armed = s->armed;
  const std::uint64_t seq = s->armed_seq;
  IoRing* ring = s->buf.ring; // `s` may be freed as soon as the lock is released
  s->lock.unlock();
  if (!armed) destroy(s); // nothing in the kernel refers to it
  else ring->request_cancel(s, seq); // its final CQE frees it
}

} // namespace
} // namespace coresched::io::detail_stream

namespace coresched::io {

using detail::Fiber;
using detail::Worker;
using detail::IoRing;
using detail_stream::State;

RecvStream::RecvStream(int fd, std::size_t buffer_size, unsigned buffers) {
  Worker& w = detail_stream::require_fiber("a stream created");
  if (buffer_size == 0 || buffer_size > (std::size_t{1} << 30))
    throw UsageError("coresched::io::RecvStream: buffer_size must be 1 byte to 1 GiB");
  if (buffers == 0 || buffers > 32768) throw UsageError("coresched::io::RecvStream: buffers must be 1 to 32768");
  const unsigned n = std::bit_ceil(buffers);
  if (buffer_size * n > (std::size_t{1} << 30))
    throw UsageError("coresched::io::RecvStream: buffers x buffer_size must be at most 1 GiB");
  auto s = std::make_unique<State>();
  s->on_cqe = &detail_stream::on_cqe;
  s->fd = fd;
  s->buf_size = buffer_size;
  s->nbufs = n;
  if (w.reactor().backend() == IoBackend::epoll) {
    s->readiness = true;
    void* m = ::mmap(nullptr, buffer_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
      throw std::system_error(ENOMEM, std::system_category(), "coresched::io::RecvStream: mapping its buffer");
    s->copy = {static_cast<std::byte*>(m), buffer_size};
    state_ = s.release();
    return;
  }
  s->q.resize(n + 1);
  const int rc = detail_stream::open_buffers(s->buf, static_cast<IoRing&>(w.reactor()), buffer_size, n);
  if (rc == -ENOMEM) {
    detail_stream::close_buffers(s->buf);
    throw std::system_error(ENOMEM, std::system_category(), "coresched::io::RecvStream: mapping its buffers");
  }
  s->setup_error = rc; // e.g. a kernel without provided-buffer rings: the first next() says so
  state_ = s.release();
}

RecvStream::~RecvStream() { detail_stream::release(state_); }

RecvStream::RecvStream(RecvStream&& other) noexcept : state_(std::exchange(other.state_, nullptr)) {}

RecvStream& RecvStream::operator=(RecvStream&& other) noexcept {
  if (this != &other) {
    detail_stream::release(state_);
    state_ = std::exchange(other.state_, nullptr);
  }
  return *this;
}

void RecvStream::cancel() noexcept {
  State* s = state_;
  if (!s) return;
  if (s->readiness) {
    s->stop.cancel();
    return;
  }
  s->lock.lock();
  s->cancelled = true;
  const bool armed = s->armed;
  const std::uint64_t seq = s->armed_seq;
  IoRing* ring = s->buf.ring;
  s->lock.unlock();
  if (armed && seq != 0) ring->request_cancel(s, seq);
  // Armed but not yet submitted: arm() sees `cancelled`. Not armed: next() does.
}

namespace detail_stream {
namespace {
// A next() with a deadline: the runtime's deadline timer takes the parked
// consumer back from the stream (as on_cqe would) and wakes it.
struct NextDeadline {
  detail::Deadline d; // first: fire() gets its address
  State* s;
  Fiber* fiber;
  bool fired = false;
  static void fire(detail::Deadline* d) noexcept {
    auto* t = reinterpret_cast<NextDeadline*>(d);
    t->s->lock.lock();
    const bool mine = t->s->waiter == t->fiber;
    if (mine) {
      t->s->waiter = nullptr;
      t->fired = true;
    }
    t->s->lock.unlock();
    if (mine) detail::wake_fiber(t->fiber);
  }
};
} // namespace
} // namespace detail_stream

Result RecvStream::next(std::span<const std::byte>& data) { return next_until(data, detail::kNever); }

Result RecvStream::next(std::span<const std::byte>& data, std::chrono::nanoseconds timeout) {
  return next_until(data, detail::deadline_after(timeout));
}

Result RecvStream::next_until(std::span<const std::byte>& data, std::uint64_t deadline_ns) {
  data = {};
  Worker* w = &detail_stream::require_fiber("next() called");
  if (!state_) throw UsageError("coresched::io::RecvStream: next() on an empty (moved-from) stream");
  State& s = *state_;
  if (s.ended) return s.end;
  if (s.readiness) {
    OpOptions o{.cancel = &s.stop};
    if (deadline_ns != detail::kNever) {
      const std::uint64_t now = detail::steady_now_ns();
      o.timeout = std::chrono::nanoseconds(deadline_ns > now ? deadline_ns - now : 0);
    }
    const Result r = io::recv(s.fd, s.copy, 0, o);
    if (r.ok() && r.value > 0) {
      data = {s.copy.data(), static_cast<std::size_t>(r.value)};
      return r;
    }
    if (r.error == std::errc::timed_out) return r; // the stream goes on
    s.ended = true;
    s.end = r;
    return r;
  }
  detail_stream::give_back(s);
  for (;;) {
    s.lock.lock();
    if (s.q_count > 0) {
      const detail_stream::Entry e = detail_stream::pop_locked(s);
      s.lock.unlock();
      if (e.res > 0 && (e.flags & IORING_CQE_F_BUFFER)) {
        const unsigned bid = e.flags >> IORING_CQE_BUFFER_SHIFT;
        s.held = static_cast<int>(bid);
        data = {s.buf.bufs + bid * s.buf_size, static_cast<std::size_t>(e.res)};
        return {e.res, {}};
      }
      // Every buffer was full: the data waits in the socket, ask again (all
      // buffers are back: the queue is empty once the request is re-armed).
      if (e.res == -ENOBUFS) continue;
      return detail_stream::finish(s, e.res > 0 ? -EIO : e.res); // data without a buffer: not expected
    }
    if (!s.armed) {
      const int refused = s.setup_error ? s.setup_error : s.cancelled ? -ECANCELED : 0;
      if (refused) {
        s.lock.unlock();
        return detail_stream::finish(s, refused);
      }
      s.armed = true;
      s.lock.unlock();
      // No scheduling point from here to the submission: `w` stays ours.
      if (&w->reactor() != s.buf.ring) {
        if (const int rc = detail_stream::move_buffers(s, static_cast<IoRing&>(w->reactor())); rc < 0) {
          s.lock.lock();
          s.armed = false;
          s.lock.unlock();
          return detail_stream::finish(s, rc);
        }
      }
      detail_stream::arm(s);
      continue;
    }
    if (deadline_ns != detail::kNever && deadline_ns <= detail::steady_now_ns()) {
      s.lock.unlock();
      return {0, std::make_error_code(std::errc::timed_out)};
    }
    Fiber* self = w->running();
    self->state.store(detail::FiberState::parking, std::memory_order_release);
    s.waiter = self; // on_cqe wakes it; a wake before the switch is remembered
    s.lock.unlock();
    detail_stream::NextDeadline timer{{}, &s, self};
    detail::DeadlineTimer* deadlines = nullptr;
    if (deadline_ns != detail::kNever) {
      deadlines = &w->scheduler().deadlines();
      timer.d.at_ns = deadline_ns;
      timer.d.fire = &detail_stream::NextDeadline::fire;
      deadlines->arm(&timer.d);
    }
    w->park({.kind = detail::WaitKind::io, .what = "RecvStream::next", .arg = s.fd});
    w = Worker::current(); // perhaps another worker now
    if (deadlines) deadlines->disarm(&timer.d);
    if (timer.fired) return {0, std::make_error_code(std::errc::timed_out)};
  }
}

} // namespace coresched::io
