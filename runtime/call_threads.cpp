// SPDX-License-Identifier: Apache-2.0
#include "call_threads.hpp"

#include <pthread.h>

namespace coresched::detail {

CallThreads::~CallThreads() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void CallThreads::run(void (*fn)(void*) noexcept, void* arg) {
  std::unique_lock lk(mu_);
  calls_.push_back({fn, arg});
  // Every idle thread takes one call when it wakes: start a thread for each
  // call beyond them, or the call would wait for a busy one to finish.
  if (calls_.size() > idle_) {
    threads_.emplace_back([this] { loop(); });
    return;
  }
  lk.unlock();
  cv_.notify_one();
}

std::size_t CallThreads::threads() {
  std::lock_guard lk(mu_);
  return threads_.size();
}

void CallThreads::loop() {
  pthread_setname_np(pthread_self(), "coresched-call");
  std::unique_lock lk(mu_);
  for (;;) {
    if (!calls_.empty()) {
      const Call c = calls_.front();
      calls_.pop_front();
      lk.unlock();
      c.fn(c.arg);
      lk.lock();
      continue;
    }
    if (stop_) return;
    ++idle_;
    cv_.wait(lk, [this] { return !calls_.empty() || stop_; });
    --idle_;
  }
}

} // namespace coresched::detail
