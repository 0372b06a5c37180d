// SPDX-License-Identifier: Apache-2.0
#include "platform/call_threads.hpp"

#include <algorithm>
#include <cerrno>
#include <system_error>
#include <pthread.h>

namespace coresched::detail {

namespace testing {
std::atomic<bool> call_thread_start_fails{false};
}

CallThreads::~CallThreads() {
  std::unique_lock lk(mu_);
  stop_ = true;
  cv_.notify_all();
  std::vector<std::thread> all = std::move(threads_);
  lk.unlock();
  for (auto& t : all) t.join();
  for (auto& t : finished_) t.join();
}

void CallThreads::run(void (*fn)(void*) noexcept, void* arg) {
  std::unique_lock lk(mu_);
  join_finished(lk);
  calls_.push_back({fn, arg});
  // Every idle thread takes one call when it wakes: start a thread for each
  // call beyond them, or the call would wait for a busy one to finish.
  if (calls_.size() > idle_) {
    try {
      if (testing::call_thread_start_fails.load(std::memory_order_relaxed))
        throw std::system_error(EAGAIN, std::generic_category(), "coresched: cannot start a thread for a blocking call");
      threads_.emplace_back([this] { loop(); });
    } catch (...) {
      calls_.pop_back(); // no thread can have taken it: each takes calls under mu_, held since the push
      throw;
    }
    return;
  }
  lk.unlock();
  cv_.notify_one();
}

void CallThreads::wait_idle() {
  std::unique_lock lk(mu_);
  idle_cv_.wait(lk, [this] { return running_ == 0 && calls_.empty(); });
}

std::size_t CallThreads::threads() {
  std::lock_guard lk(mu_);
  return threads_.size();
}

// Called with mu_ held; joins outside it (an ended thread's join is quick).
void CallThreads::join_finished(std::unique_lock<std::mutex>& lk) {
  if (finished_.empty()) return;
  std::vector<std::thread> done = std::move(finished_);
  finished_.clear();
  lk.unlock();
  for (auto& t : done) t.join();
  lk.lock();
}

void CallThreads::loop() {
  pthread_setname_np(pthread_self(), "coresched-call");
  std::unique_lock lk(mu_);
  for (;;) {
    if (!calls_.empty()) {
      const Call c = calls_.front();
      calls_.pop_front();
      ++running_;
      lk.unlock();
      c.fn(c.arg);
      lk.lock();
      if (--running_ == 0 && calls_.empty()) idle_cv_.notify_all();
      continue;
    }
    if (stop_) return;
    if (idle_ >= kKeepIdle) { // enough kept: this one ends (joined by the next run())
      const auto me = std::find_if(threads_.begin(), threads_.end(),
                                   [](const std::thread& t) { return t.get_id() == std::this_thread::get_id(); });
      if (me != threads_.end()) {
        finished_.push_back(std::move(*me));
        threads_.erase(me);
      }
      return;
    }
    ++idle_;
    cv_.wait(lk, [this] { return !calls_.empty() || stop_; });
    --idle_;
  }
}

} // namespace coresched::detail
