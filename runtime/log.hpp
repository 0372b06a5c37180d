// SPDX-License-Identifier: Apache-2.0
// The library's spdlog logger ("coresched"); level from CORESCHED_LOG, default warn.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace coresched::detail {

/// The shared logger, created on first use.
spdlog::logger& log();
/// Applies a level name ("trace" ... "off"); empty means CORESCHED_LOG or "warn".
void set_log_level(const std::string& level);

} // namespace coresched::detail
