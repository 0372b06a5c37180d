// SPDX-License-Identifier: Apache-2.0
// A histogram of durations in ns: log-linear buckets (8 per power of two, so
// a percentile read from it is within 12.5 % of the true value), fixed size,
// no allocation, for figures recorded on scheduling paths (the per-core
// hand-over gap). Not thread-safe: its owner guards it (the core lock).
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace coresched::detail {

class GapHistogram {
public:
  void record(std::uint64_t ns) noexcept {
    ++buckets_[index(ns)];
    ++count_;
    if (ns > max_) max_ = ns;
  }
  std::uint64_t count() const noexcept { return count_; }
  std::uint64_t max() const noexcept { return max_; }
  /// The upper edge of the bucket holding the q-th quantile (0 < q <= 1); 0 when empty.
  std::uint64_t quantile(double q) const noexcept {
    if (count_ == 0) return 0;
    const auto rank = static_cast<std::uint64_t>(q * static_cast<double>(count_) + 0.999999);
    std::uint64_t seen = 0;
    for (std::size_t i = 0; i < kBuckets; ++i)
      if ((seen += buckets_[i]) >= rank) return upper(i) < max_ ? upper(i) : max_;
    return max_;
  }

private:
  static constexpr unsigned kSub = 8; // buckets per power of two
  static constexpr std::size_t kBuckets = 64 * kSub;
  // Below kSub ns each value has its own bucket; above, the octave and the
  // three bits after the leading one.
  static std::size_t index(std::uint64_t ns) noexcept {
    if (ns < kSub) return static_cast<std::size_t>(ns);
    const unsigned octave = 63u - static_cast<unsigned>(std::countl_zero(ns)); // >= 3
    const auto sub = static_cast<unsigned>((ns >> (octave - 3)) & (kSub - 1));
    return (octave - 2) * kSub + sub;
  }
  static std::uint64_t upper(std::size_t i) noexcept {
    if (i < kSub) return i;
    const auto octave = static_cast<unsigned>(i / kSub) + 2;
    const auto sub = static_cast<std::uint64_t>(i % kSub);
    return ((kSub + sub + 1) << (octave - 3)) - 1;
  }
  std::array<std::uint64_t, kBuckets> buckets_{};
  std::uint64_t count_ = 0;
  std::uint64_t max_ = 0;
};

} // namespace coresched::detail
