// SPDX-License-Identifier: Apache-2.0
#include "platform/log.hpp"

#include <coresched/join_handle.hpp> // UsageError

#include <spdlog/sinks/stdout_color_sinks.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace coresched::detail {

namespace {
// spdlog takes a name it does not know as "off", which would silence every warning.
bool known_level(const std::string& name, spdlog::level::level_enum& out) {
  out = spdlog::level::from_str(name);
  return out != spdlog::level::off || name == "off";
}

std::shared_ptr<spdlog::logger> make_default() {
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
}

// Every logger the library was given stays alive for the process: a line
// being written on another thread may still hold the previous one.
struct Loggers {
  std::mutex mu;
  std::vector<std::shared_ptr<spdlog::logger>> kept;
  std::atomic<spdlog::logger*> current{nullptr};
};

Loggers& loggers() {
  static Loggers* l = [] {
    auto* ls = new Loggers; // never destroyed: fibers may log while static destructors run
    ls->kept.push_back(make_default());
    ls->current.store(ls->kept.back().get(), std::memory_order_release);
    return ls;
  }();
  return *l;
}
} // namespace

spdlog::logger& log() { return *loggers().current.load(std::memory_order_acquire); }

void set_logger(std::shared_ptr<spdlog::logger> logger) {
  if (!logger) return;
  Loggers& ls = loggers();
  std::lock_guard lk(ls.mu);
  if (logger.get() == ls.current.load(std::memory_order_relaxed)) return; // each runtime may pass the same one
  ls.kept.push_back(std::move(logger));
  ls.current.store(ls.kept.back().get(), std::memory_order_release);
}

std::string describe_exception(const std::exception_ptr& e) {
  if (!e) return "no exception";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

void set_log_level(const std::string& level) {
  if (level.empty()) return;
  spdlog::level::level_enum l;
  if (!known_level(level, l))
    throw UsageError("coresched: log level '" + level + "' is none of trace, debug, info, warning, error, critical, off");
  log().set_level(l);
}

} // namespace coresched::detail
