// SPDX-License-Identifier: Apache-2.0
// The library's spdlog logger: the application's (Options::logger), or its
// own ("coresched", on stderr; level from CORESCHED_LOG, default warn).
#pragma once

#include <spdlog/spdlog.h>

#include <exception>
#include <memory>
#include <string>

namespace coresched::detail {

/// The library's logger: the one the application gave (Options::logger),
/// else its own on stderr, created on first use.
spdlog::logger& log();
/// Sends the library's lines to `logger` from now on (null: no change).
void set_logger(std::shared_ptr<spdlog::logger> logger);
/// "what()" of an exception (or what kind of thing was thrown), for a log line.
std::string describe_exception(const std::exception_ptr& e);
/// Applies a level name ("trace" ... "off"); empty means CORESCHED_LOG or "warn".
void set_log_level(const std::string& level);

} // namespace coresched::detail
