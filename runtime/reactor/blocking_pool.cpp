// SPDX-License-Identifier: Apache-2.0
#include "reactor/blocking_pool.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

namespace coresched::detail {

BlockingPool::BlockingPool(unsigned threads) : threads_(threads) {}

BlockingPool::~BlockingPool() {
  if (pool_) pool_->join();
}

void BlockingPool::submit(std::function<void()> fn) {
  std::call_once(started_, [this] { pool_ = std::make_unique<boost::asio::thread_pool>(threads_); });
  boost::asio::post(*pool_, std::move(fn));
}

} // namespace coresched::detail
