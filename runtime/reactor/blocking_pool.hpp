// SPDX-License-Identifier: Apache-2.0
// Threads for work that would block a worker: the epoll backend's regular-file
// I/O, openat and fsync, which readiness cannot wait for (epoll refuses
// regular files; they always read as ready and then block in the kernel).
// A boost::asio::thread_pool, started on first use, so a runtime that never
// needs it has no extra threads.
#pragma once

#include <functional>
#include <memory>
#include <mutex>

namespace boost::asio {
class thread_pool;
}

namespace coresched::detail {

class BlockingPool {
public:
  explicit BlockingPool(unsigned threads);
  /// Waits for the queued work to finish (a worker never leaves any behind
  /// that it still waits for: see EpollReactor's offloaded operations).
  ~BlockingPool();
  BlockingPool(const BlockingPool&) = delete;
  BlockingPool& operator=(const BlockingPool&) = delete;

  /// Runs `fn` on one of the pool's threads (any thread may call it).
  void submit(std::function<void()> fn);

private:
  unsigned threads_;
  std::once_flag started_;
  std::unique_ptr<boost::asio::thread_pool> pool_;
};

} // namespace coresched::detail
