// SPDX-License-Identifier: Apache-2.0
// A range check for floating-point command-line values that also refuses NaN
// and infinity. CLI::Range compares with < and >, both false for NaN, so
// "--time nan" would get through and the benchmarks print nan or zero figures.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <string>

namespace coresched::bench {

/// A number from `lo` to `hi`, both included; never NaN or infinite.
inline CLI::Validator finite_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) {
        double v = 0;
        if (CLI::detail::lexical_cast(text, v) && std::isfinite(v) && v >= lo && v <= hi) return std::string();
        return "must be a number from " + CLI::detail::to_string(lo) + " to " + CLI::detail::to_string(hi);
      },
      "[" + CLI::detail::to_string(lo) + " - " + CLI::detail::to_string(hi) + "]");
}

} // namespace coresched::bench
