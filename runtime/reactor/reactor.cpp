// SPDX-License-Identifier: Apache-2.0
#include "reactor/reactor.hpp"

#include "reactor/epoll_reactor.hpp"
#include "reactor/io_ring.hpp"
#include "platform/log.hpp"

#include <coresched/join_handle.hpp>

#include <cstdlib>
#include <stdexcept>

namespace coresched::detail {

void Reactor::request_cancel(IoOp* op, std::uint64_t seq) {
  {
    std::lock_guard lk(remote_mu_);
    cancels_.emplace_back(op, seq);
    remote_pending_.store(true, std::memory_order_release);
  }
  wake();
}

void Reactor::post(std::function<void()> fn) {
  {
    std::lock_guard lk(remote_mu_);
    posted_.push_back(std::move(fn));
    remote_pending_.store(true, std::memory_order_release);
  }
  wake();
}

void Reactor::drain_remote() {
  if (!remote_pending_.load(std::memory_order_acquire)) return;
  std::vector<std::pair<IoOp*, std::uint64_t>> ops;
  std::vector<std::function<void()>> posted;
  {
    std::lock_guard lk(remote_mu_);
    ops.swap(cancels_);
    posted.swap(posted_);
    remote_pending_.store(false, std::memory_order_relaxed);
  }
  for (auto [op, seq] : ops)
    if (tracked(op, seq)) cancel_one(op); // else it has finished already
  for (auto& fn : posted) fn();
}

void Reactor::run_leftover_posts() {
  // Work posted by fibers that finished after the owner's last reap (a
  // stream's buffers to free) is still owed.
  std::vector<std::function<void()>> posted;
  {
    std::lock_guard lk(remote_mu_);
    posted.swap(posted_);
  }
  for (auto& fn : posted) fn();
}

IoBackendChoice choose_io_backend(IoBackend requested) {
  if (requested != IoBackend::automatic && requested != IoBackend::io_uring && requested != IoBackend::epoll)
    throw UsageError("coresched: Options::io_backend holds no IoBackend value (" +
                     std::to_string(static_cast<int>(requested)) + ")");
  if (requested == IoBackend::automatic) {
    if (const char* env = std::getenv("CORESCHED_IO_BACKEND"); env && *env) {
      const std::string v = env;
      if (v == "io_uring") requested = IoBackend::io_uring;
      else if (v == "epoll") requested = IoBackend::epoll;
      else if (v != "auto")
        throw UsageError("coresched: CORESCHED_IO_BACKEND must be auto, io_uring or epoll, not '" + v + "'");
    }
  }
  if (requested == IoBackend::epoll) return {IoBackend::epoll, "requested"};
  const std::string why_not = io_uring_unavailable();
  if (why_not.empty()) {
    log().info("I/O backend: io_uring");
    return {IoBackend::io_uring, requested == IoBackend::io_uring ? "requested" : "io_uring available"};
  }
  if (requested == IoBackend::io_uring)
    throw UsageError("coresched: the io_uring backend was asked for but cannot start (" + why_not +
                     "); a container's seccomp profile (Docker 25+, Kubernetes RuntimeDefault) or the sysctl "
                     "kernel.io_uring_disabled forbids it; allow io_uring there, or use the epoll backend "
                     "(Options::io_backend, CORESCHED_IO_BACKEND=epoll or auto)");
  log().warn("I/O backend: epoll, because io_uring cannot be used here ({})", why_not);
  return {IoBackend::epoll, why_not};
}

void make_reactor(ReactorSlot& slot, IoBackend backend, BlockingPool& pool) {
  Reactor* base = nullptr;
  if (backend == IoBackend::epoll) {
    auto& r = slot.emplace<EpollReactor>(pool);
    base = &r;
    r.init();
  } else {
    auto& r = slot.emplace<IoRing>();
    base = &r;
    r.init(256);
  }
  // The slot hands out its start as the Reactor: true of a class whose only
  // base is Reactor (its primary base), checked here once.
  if (static_cast<void*>(base) != static_cast<void*>(slot.get()))
    throw std::logic_error("coresched: a reactor's Reactor base is not at its start");
}

} // namespace coresched::detail
