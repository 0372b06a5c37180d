// SPDX-License-Identifier: Apache-2.0
#include "reactor/epoll_reactor.hpp"

#include "reactor/blocking_pool.hpp"
#include "platform/clock.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <stdexcept>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace coresched::detail {

namespace {
constexpr std::uint64_t kWakeTag = ~std::uint64_t{0};

int neg_errno() { return -errno; }

// A syscall's return value as an op result: the count, or -errno.
int as_result(ssize_t rc) { return rc >= 0 ? static_cast<int>(rc) : neg_errno(); }

bool would_block(int result) { return result == -EAGAIN || result == -EWOULDBLOCK; }

// Runs `fn` with O_NONBLOCK set on `fd` if it was not: accept, connect and
// files that take no RWF_NOWAIT have no per-call flag for it. The flag is the
// open file's, so one lock for the process serializes reading, setting and
// restoring it: two workers on one blocking listener must not see each
// other's setting (the second would call with the flag it saw, then blocking
// again, and block its worker in the kernel). A plain thread blocked in
// accept(2) on the same socket in that window could still see EAGAIN.
std::mutex g_nonblocking_mu;

template <class Fn> int nonblocking(int fd, Fn fn) {
  const std::lock_guard lk(g_nonblocking_mu);
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0) return neg_errno();
  if (fl & O_NONBLOCK) return fn();
  if (::fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return neg_errno();
  const int result = fn();
  ::fcntl(fd, F_SETFL, fl);
  return result;
}

// Regular files, block devices and directories: epoll cannot wait for them
// and they never say EAGAIN without RWF_NOWAIT, so what would block there
// goes to the pool.
bool is_file(int fd) {
  struct stat st;
  return ::fstat(fd, &st) == 0 && (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode) || S_ISDIR(st.st_mode));
}

timespec to_timespec(std::uint64_t ns) {
  return {static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
}
} // namespace

// One offloaded op: the pool thread reads the request and writes the result
// here; the owner copies it into the op, if the op still waits for it.
struct EpollReactor::Offload {
  enum State { queued, running, abandoned };
  IoRequest req;
  std::atomic<int> state{queued};
  int result = 0;
  IoOp* op = nullptr;
};

// Shared by the reactor and the pool's tasks, so that a task finishing after
// the reactor is gone finds `reactor` null instead of a dangling pointer.
struct EpollReactor::Inbox {
  std::mutex mu;
  EpollReactor* reactor = nullptr; // guarded by mu
  std::vector<std::shared_ptr<Offload>> done;
  std::atomic<bool> pending{false};
};

EpollReactor::~EpollReactor() {
  if (inbox_) {
    std::lock_guard lk(inbox_->mu);
    inbox_->reactor = nullptr;
  }
  run_leftover_posts();
  if (event_fd_ >= 0) ::close(event_fd_);
  if (epfd_ >= 0) ::close(epfd_);
}

void EpollReactor::init() {
  epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0) throw std::runtime_error(std::string("coresched: epoll_create1 failed: ") + std::strerror(errno));
  event_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (event_fd_ < 0) throw std::runtime_error(std::string("coresched: eventfd failed: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, event_fd_, &ev) < 0)
    throw std::runtime_error(std::string("coresched: epoll_ctl failed: ") + std::strerror(errno));
  // epoll_pwait2 (Linux 5.11) sleeps to the nanosecond; without it,
  // epoll_wait's milliseconds, rounded up (a sleep is late, never early).
  const timespec zero{};
  epoll_event out;
  have_pwait2_ = ::epoll_pwait2(epfd_, &out, 1, &zero, nullptr) >= 0;
  // An epoll wait's timeout gets the thread's timer slack (50 us by
  // default), which would make every sleep up to 50 us late; io_uring's timers
  // take none.
  ::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  inbox_ = std::make_shared<Inbox>();
  inbox_->reactor = this;
  overdue_after_ns_ = kMaxPollGapNs;
  pokes_ticker_ = false;
  asks_back_ = false;
}

std::string EpollReactor::describe() const {
  return std::string("epoll, ") + (have_pwait2_ ? "epoll_pwait2" : "epoll_wait (ms timeouts)");
}

// ---------------------------------------------------------------- operations

EpollReactor::Next EpollReactor::attempt(IoOp* op) {
  IoRequest& r = op->req;
  int res = 0;
  switch (r.kind) {
  case IoKind::recv:
    res = as_result(::recv(r.fd, r.buf, r.len, r.flags | MSG_DONTWAIT));
    if (would_block(res)) return Next::wait_in;
    if (res >= 0 && static_cast<unsigned>(res) < r.len) fd_entry(r.fd).drained = true;
    break;
  case IoKind::send:
    res = as_result(::send(r.fd, r.buf, r.len, r.flags | MSG_DONTWAIT));
    if (would_block(res)) return Next::wait_out;
    break;
  case IoKind::read:
  case IoKind::readv:
  case IoKind::write:
  case IoKind::writev: {
    // RWF_NOWAIT: sockets, pipes and cached file data answer at once, or
    // EAGAIN. A regular file's EAGAIN (data not cached) and a file that
    // does not take the flag go to the pool.
    const bool in = r.kind == IoKind::read || r.kind == IoKind::readv;
    iovec one{r.buf, r.len};
    const iovec* iov = r.iov ? r.iov : &one;
    const int n = r.iov ? static_cast<int>(r.iovcnt) : 1;
    res = as_result(in ? ::preadv2(r.fd, iov, n, r.offset, RWF_NOWAIT) : ::pwritev2(r.fd, iov, n, r.offset, RWF_NOWAIT));
    if (res == -EOPNOTSUPP || res == -EINVAL) {
      // The file takes no RWF_NOWAIT (a tty, a pipe or socket on an older
      // kernel): a file goes to the pool, anything else is tried with
      // O_NONBLOCK and waits for readiness, where a cancel or timeout reaches it.
      if (is_file(r.fd)) return Next::offload;
      res = nonblocking(r.fd, [&] {
        if (r.offset < 0) return as_result(in ? ::readv(r.fd, iov, n) : ::writev(r.fd, iov, n));
        return as_result(in ? ::preadv(r.fd, iov, n, r.offset) : ::pwritev(r.fd, iov, n, r.offset));
      });
    }
    if (would_block(res)) return in ? Next::wait_in : Next::wait_out;
    if (r.kind == IoKind::read && res > 0 && static_cast<unsigned>(res) < r.len) {
      // Part of a file cached: a read of a file is whole up to its end, as
      // read(2) and io_uring give it, so the rest goes to the pool.
      if (rest_of_file(op, res)) return Next::offload;
      fd_entry(r.fd).drained = true;
    }
    break;
  }
  case IoKind::accept:
    res = nonblocking(r.fd, [&] { return as_result(::accept4(r.fd, r.addr, r.addrlen, SOCK_CLOEXEC)); });
    if (would_block(res)) return Next::wait_in;
    break;
  case IoKind::connect:
    if (r.addr) {
      // The first call starts the connection; once the fd is writable, its
      // outcome is SO_ERROR.
      res = nonblocking(r.fd, [&] { return ::connect(r.fd, r.addr, r.addr_len) == 0 ? 0 : neg_errno(); });
      if (res == -EINPROGRESS) {
        r.addr = nullptr;
        return Next::wait_out;
      }
    } else {
      // Tried again for another op's event on this fd: still connecting.
      pollfd p{r.fd, POLLOUT, 0};
      if (::poll(&p, 1, 0) == 0) return Next::wait_out;
      int err = 0;
      socklen_t len = sizeof(err);
      res = ::getsockopt(r.fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 ? neg_errno() : -err;
    }
    break;
  case IoKind::poll: {
    pollfd p{r.fd, static_cast<short>(r.events), 0};
    res = ::poll(&p, 1, 0);
    if (res < 0) res = neg_errno();
    else if (res == 0) return (r.events & POLLOUT) && !(r.events & POLLIN) ? Next::wait_out : Next::wait_in;
    else res = p.revents;
    break;
  }
  case IoKind::close:
    res = ::close(r.fd) == 0 ? 0 : neg_errno();
    if (res == 0) drop_fd(r.fd);
    break;
  case IoKind::fsync:
  case IoKind::openat:
    return Next::offload;
  case IoKind::sleep:
    return Next::wait_in; // never reached: sleeps have only a timer
  }
  op->result = res;
  return Next::done;
}

bool EpollReactor::rest_of_file(IoOp* op, int got) {
  IoRequest& r = op->req;
  struct stat st;
  if (::fstat(r.fd, &st) != 0 || !S_ISREG(st.st_mode)) return false;
  const off_t pos = r.offset >= 0 ? static_cast<off_t>(r.offset) + got : ::lseek(r.fd, 0, SEEK_CUR);
  if (pos < 0 || pos >= st.st_size) return false; // the end of the file: a short read is right
  op->carried += got;
  r.buf = static_cast<std::byte*>(r.buf) + got;
  r.len -= static_cast<unsigned>(got);
  if (r.offset >= 0) r.offset += got; // (-1: the file position has moved already)
  return true;
}

void EpollReactor::drop_fd(int fd) {
  FdWait* w = find_fd(fd);
  if (!w) return;
  for (IoOp* o = w->head; o;) {
    IoOp* next = o->next_waiter;
    o->next_waiter = nullptr;
    --fd_waiters_;
    if (o->heap_index >= 0) timer_remove(o);
    end_later(o, -EBADF); // io::close of an fd other fibers wait on
    o = next;
  }
  *w = {};
}

int EpollReactor::run_blocking(const IoRequest& r) {
  iovec one{r.buf, r.len};
  const iovec* iov = r.iov ? r.iov : &one;
  const int n = r.iov ? static_cast<int>(r.iovcnt) : 1;
  switch (r.kind) {
  case IoKind::read:
  case IoKind::readv: return as_result(r.offset < 0 ? ::readv(r.fd, iov, n) : ::preadv(r.fd, iov, n, r.offset));
  case IoKind::write:
  case IoKind::writev: return as_result(r.offset < 0 ? ::writev(r.fd, iov, n) : ::pwritev(r.fd, iov, n, r.offset));
  case IoKind::fsync: return ::fsync(r.fd) == 0 ? 0 : neg_errno();
  case IoKind::openat: return as_result(::openat(r.fd, r.path, r.flags, r.mode));
  default: return -EINVAL;
  }
}

// A read right after a short one would almost always say EAGAIN (an echo
// server's next recv, once it has answered): go straight to the wait. Arming
// the wait polls the fd, so data that came meanwhile is seen at once.
bool EpollReactor::skip_try(const IoRequest& r) const {
  if (r.kind != IoKind::recv && r.kind != IoKind::read) return false;
  const FdWait* w = find_fd(r.fd);
  return w && w->drained;
}

bool EpollReactor::start(IoOp* op, std::optional<std::chrono::nanoseconds> timeout) {
  Next next = Next::wait_in;
  if (op->req.kind != IoKind::sleep && !skip_try(op->req)) {
    next = attempt(op);
    if (next == Next::done) return true;
  }
  track(op);
  if (op->req.kind == IoKind::sleep) timer_add(op, op->req.deadline_ns);
  else if (timeout) timer_add(op, now_ns() + static_cast<std::uint64_t>(std::max<std::int64_t>(timeout->count(), 0)));
  if (next == Next::offload) offload(op);
  else if (op->req.kind != IoKind::sleep) wait_on_fd(op, next == Next::wait_in ? EPOLLIN : EPOLLOUT);
  note_unpolled();
  return false;
}

void EpollReactor::finish(IoOp* op, int result, std::vector<Fiber*>& done) {
  // What a read of a file got before its rest went to the pool counts, also
  // when the rest failed or was cancelled.
  if (op->carried > 0) result = result >= 0 ? op->carried + result : op->carried;
  op->result = result;
  if (op->heap_index >= 0) timer_remove(op);
  untrack(op);
  done.push_back(op->fiber);
}

bool EpollReactor::withdraw(IoOp* op) {
  if (auto it = offloaded_.find(op); it != offloaded_.end()) {
    int expected = Offload::queued;
    // Running on a pool thread already: its result stands when it comes.
    if (!it->second->state.compare_exchange_strong(expected, Offload::abandoned)) return false;
    offloaded_.erase(it);
    return true;
  }
  unlink_from_fd(op);
  return true;
}

void EpollReactor::cancel_one(IoOp* op) {
  // A cancelled op is finished at the next reap, through cancelled_. It may
  // be asked twice before then (Cancellation::cancel and shutdown, or two
  // cancel() calls): once there, it must not be queued, and its fiber woken,
  // a second time.
  if (op->pending == 0 || !withdraw(op)) return;
  if (op->heap_index >= 0) timer_remove(op);
  end_later(op, -ECANCELED);
}

void EpollReactor::end_later(IoOp* op, int result) {
  op->result = result;
  op->pending = 0;
  cancelled_.push_back(op);
}

void EpollReactor::cancel_all() {
  for (IoOp* op : inflight_ops_.snapshot()) cancel_one(op);
}

// ---------------------------------------------------------------- readiness

void EpollReactor::wait_on_fd(IoOp* op, unsigned events) {
  if (op->req.kind != IoKind::poll) op->req.events = events; // a poll waits for what it asked
  FdWait& w = fd_entry(op->req.fd);
  op->next_waiter = w.head;
  w.head = op;
  ++fd_waiters_;
  arm(op->req.fd, w, op);
}

void EpollReactor::end_waiters_but(FdWait& w, IoOp* keep, int result) {
  IoOp** p = &w.head;
  while (*p) {
    IoOp* o = *p;
    if (o == keep) {
      p = &o->next_waiter;
      continue;
    }
    *p = o->next_waiter;
    o->next_waiter = nullptr;
    --fd_waiters_;
    if (o->heap_index >= 0) timer_remove(o);
    end_later(o, result);
  }
}

void EpollReactor::arm(int fd, FdWait& w, IoOp* newest) {
  unsigned want = 0;
  for (IoOp* o = w.head; o; o = o->next_waiter) want |= o->req.events & (EPOLLIN | EPOLLOUT | EPOLLPRI | EPOLLRDHUP);
  if (!want) want = EPOLLIN;
  epoll_event ev{};
  ev.events = want | EPOLLONESHOT;
  ev.data.u64 = static_cast<std::uint32_t>(fd);
  // MOD first (the fd was armed before), ADD where it is not registered: a
  // closed fd's registration vanishes with it, and its number's next file
  // is a new one. Every wait re-arms, so neither case can leave a waiter.
  int rc = ::epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev);
  if (rc < 0 && errno == ENOENT) {
    // Registered before and gone now: the file the older waiters waited on
    // was closed (::close behind the runtime's back); the number is another
    // file's, whose data is not theirs.
    if (w.registered) end_waiters_but(w, newest, -EBADF);
    rc = ::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
  }
  if (rc == 0) {
    w.armed = want;
    w.registered = true;
    return;
  }
  // EPERM: a regular file or directory, which epoll cannot wait for (it is
  // always ready, and blocks in the kernel): the ops go to the pool. Other
  // errors (EBADF) are the ops' results.
  const int err = errno;
  IoOp* list = w.head;
  w = {};
  for (IoOp* o = list; o;) {
    IoOp* next = o->next_waiter;
    o->next_waiter = nullptr;
    --fd_waiters_;
    if (err == EPERM) {
      offload(o);
    } else {
      if (o->heap_index >= 0) timer_remove(o);
      end_later(o, -err);
    }
    o = next;
  }
}

bool EpollReactor::unlink_from_fd(IoOp* op) {
  FdWait* w = find_fd(op->req.fd);
  if (!w) return false;
  for (IoOp** p = &w->head; *p; p = &(*p)->next_waiter)
    if (*p == op) {
      *p = op->next_waiter;
      op->next_waiter = nullptr;
      --fd_waiters_;
      return true;
    }
  return false;
}

// Every op waiting on `fd` is tried again (the events say only that one of
// them may get on); those that still cannot wait again.
void EpollReactor::on_ready(int fd, std::vector<Fiber*>& done) {
  FdWait* found = find_fd(fd);
  if (!found) return;
  FdWait& w = *found;
  IoOp* list = w.head;
  w.head = nullptr;
  w.armed = 0;
  w.drained = false;
  // Oldest first: they were pushed at the head.
  std::vector<IoOp*> ops;
  for (IoOp* o = list; o; o = o->next_waiter) ops.push_back(o);
  fd_waiters_ -= static_cast<unsigned>(ops.size());
  for (auto i = ops.rbegin(); i != ops.rend(); ++i) {
    IoOp* o = *i;
    o->next_waiter = nullptr;
    const Next next = attempt(o);
    if (next == Next::done) finish(o, o->result, done);
    else if (next == Next::offload) offload(o);
    else {
      o->next_waiter = w.head;
      w.head = o;
      ++fd_waiters_;
    }
  }
  if (w.head) arm(fd, w, nullptr);
}

// ---------------------------------------------------------------- offloading

void EpollReactor::offload(IoOp* op) {
  auto task = std::make_shared<Offload>();
  task->req = op->req;
  task->op = op;
  offloaded_[op] = task;
  pool_.submit([task, inbox = inbox_] {
    int expected = Offload::queued;
    if (!task->state.compare_exchange_strong(expected, Offload::running)) return; // abandoned
    task->result = run_blocking(task->req);
    std::lock_guard lk(inbox->mu);
    if (!inbox->reactor) return;
    inbox->done.push_back(task);
    inbox->pending.store(true, std::memory_order_release);
    inbox->reactor->wake();
  });
}

void EpollReactor::collect_offloaded(std::vector<Fiber*>& done) {
  if (!inbox_->pending.load(std::memory_order_acquire)) return;
  std::vector<std::shared_ptr<Offload>> tasks;
  {
    std::lock_guard lk(inbox_->mu);
    tasks.swap(inbox_->done);
    inbox_->pending.store(false, std::memory_order_relaxed);
  }
  for (auto& t : tasks) {
    offloaded_.erase(t->op);
    finish(t->op, t->result, done);
  }
}

// ---------------------------------------------------------------- timers

void EpollReactor::timer_add(IoOp* op, std::uint64_t at) {
  op->expires_ns = at;
  timers_.push(op);
}

void EpollReactor::timer_remove(IoOp* op) { timers_.remove(op); }

void EpollReactor::expire(std::uint64_t now, std::vector<Fiber*>& done) {
  while (!timers_.empty() && timers_.top()->expires_ns <= now) {
    IoOp* op = timers_.top();
    timer_remove(op);
    if (op->req.kind == IoKind::sleep) {
      finish(op, -ETIME, done);
      continue;
    }
    // A timeout: the op is withdrawn if it can be.
    if (!withdraw(op)) continue;
    op->timed_out = true;
    finish(op, -ECANCELED, done);
  }
}

// ---------------------------------------------------------------- reaping and sleeping

bool EpollReactor::poll(std::uint64_t ns, std::vector<Fiber*>& done) {
  epoll_event events[64];
  int n;
  if (ns == 0 || ns == UINT64_MAX || !have_pwait2_) {
    int ms = ns == UINT64_MAX ? -1 : static_cast<int>(std::min<std::uint64_t>((ns + 999'999) / 1'000'000, INT_MAX));
    n = ::epoll_wait(epfd_, events, 64, ms);
  } else {
    const timespec ts = to_timespec(ns);
    n = ::epoll_pwait2(epfd_, events, 64, &ts, nullptr);
  }
  last_poll_ns_ = now_ns();
  bool woken = n < 0 && errno == EINTR; // a signal: woken, as io_uring's wait says it, not timed out
  for (int i = 0; i < n; ++i) {
    if (events[i].data.u64 == kWakeTag) {
      std::uint64_t v;
      [[maybe_unused]] ssize_t r = ::read(event_fd_, &v, sizeof(v));
      woken = true;
      continue;
    }
    on_ready(static_cast<int>(events[i].data.u64), done);
  }
  return woken || n > 0;
}

void EpollReactor::collect(std::vector<Fiber*>& done) {
  drain_remote();
  collect_ended(done);
  collect_offloaded(done);
}

void EpollReactor::collect_ended(std::vector<Fiber*>& done) {
  for (IoOp* op : cancelled_) {
    if (op->carried > 0) op->result = op->carried; // (see finish)
    untrack(op);
    done.push_back(op->fiber);
  }
  cancelled_.clear();
}

void EpollReactor::reap(std::vector<Fiber*>& done, bool submit_now) {
  collect(done);
  if (fd_waiters_ > 0 && (submit_now || now_ns() - last_poll_ns_ >= kMaxPollGapNs)) poll(0, done);
  if (!timers_.empty()) expire(now_ns(), done);
  collect_ended(done); // a re-arm that failed in the poll
  note_unpolled();
}

// Nothing raises a flag when an fd gets ready or a timer is due while this
// worker runs fibers: it must look. So while any op waits, the reactor says
// it defers (Reactor::deferring), as an io_uring holding SQEs back does: the
// worker then looks before it runs a fiber that ran out its slice
// (Worker::before_run) and at that fiber's first preemption point
// (Worker::ask_back_for_io), and the ticker asks a busy worker to look.
// The time from which something may have waited unseen: fd events since the
// last poll, a timer from when it is due, the pool's results from now (they
// come at any time), ops ended meanwhile at once.
void EpollReactor::note_unpolled() noexcept {
  std::uint64_t since = UINT64_MAX;
  if (fd_waiters_ > 0) since = last_poll_ns_;
  if (!timers_.empty()) since = std::min(since, timers_.top()->expires_ns);
  if (!offloaded_.empty() || !cancelled_.empty()) since = std::min(since, now_ns());
  deferred_since_.store(since == UINT64_MAX ? 0 : (since | 1), std::memory_order_relaxed);
}

bool EpollReactor::wait_for(std::vector<Fiber*>& done, std::uint64_t ns) {
  const std::size_t before = done.size();
  collect(done);
  std::uint64_t sleep = ns;
  if (!timers_.empty()) {
    const std::uint64_t now = now_ns(), at = timers_.top()->expires_ns;
    sleep = std::min(sleep, at > now ? at - now : 0);
  }
  // Whatever another thread queues after collect() wakes the poll (it
  // writes the eventfd after queuing).
  const bool event = poll(done.size() > before ? 0 : sleep, done);
  collect(done);
  if (!timers_.empty()) expire(now_ns(), done);
  note_unpolled();
  return !event && done.size() == before && sleep == ns;
}

void EpollReactor::wait(std::vector<Fiber*>& done) { wait_for(done, UINT64_MAX); }

void EpollReactor::wake() const noexcept {
  const std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof(one));
}

} // namespace coresched::detail
