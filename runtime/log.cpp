// SPDX-License-Identifier: Apache-2.0
#include "log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace coresched::detail {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("coresched");
    l->set_pattern("[%H:%M:%S.%e] [coresched] [%^%l%$] %v");
    const char* env = std::getenv("CORESCHED_LOG");
    l->set_level(env && *env ? spdlog::level::from_str(env) : spdlog::level::warn);
    return l;
  }();
  return *logger;
}

void set_log_level(const std::string& level) {
  if (!level.empty()) log().set_level(spdlog::level::from_str(level));
}

} // namespace coresched::detail
