// SPDX-License-Identifier: Apache-2.0
#include "log.hpp"

#include <coresched/join_handle.hpp> // UsageError

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <string>

namespace coresched::detail {

namespace {
// spdlog takes a name it does not know as "off", which silenced every warning.
bool known_level(const std::string& name, spdlog::level::level_enum& out) {
  out = spdlog::level::from_str(name);
  return out != spdlog::level::off || name == "off";
}
} // namespace

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("coresched");
    l->set_pattern("[%H:%M:%S.%e] [coresched] [%^%l%$] %v");
    const char* env = std::getenv("CORESCHED_LOG");
    spdlog::level::level_enum level = spdlog::level::warn;
    if (env && *env && !known_level(env, level)) {
      level = spdlog::level::warn;
      l->warn("CORESCHED_LOG='{}' is not a log level (trace, debug, info, warning, error, critical, off): using warning", env);
    }
    l->set_level(level);
    return l;
  }();
  return *logger;
}

void set_log_level(const std::string& level) {
  if (level.empty()) return;
  spdlog::level::level_enum l;
  if (!known_level(level, l))
    throw UsageError("coresched: log level '" + level + "' is none of trace, debug, info, warning, error, critical, off");
  log().set_level(l);
}

} // namespace coresched::detail
