// SPDX-License-Identifier: Apache-2.0
// A thief's grace for wake-affine fibers. A fiber woken by a fiber of its own
// cookie is queued on the waker's worker when that worker has nothing else
// queued (Scheduler::place; Go puts a readied goroutine in its waker's P's
// `runnext` the same way): the waker usually blocks within a microsecond, and
// the woken fiber then runs on a warm CPU with no cross-CPU wake-up. A
// spinning thief that stole it at once would bring back the cross-CPU trip the
// placement saved, so a thief leaves a core alone for kGraceNs while the one
// fiber queued there may be such a fiber (Go's thief sleeps 3 us before it
// takes a running P's runnext). After that it steals as usual: a waker that
// runs on does not keep its fiber waiting.
#pragma once

#include "platform/clock.hpp"

#include <cstdint>
#include <vector>

namespace coresched::detail {

class AffineGrace {
public:
  // Under ThreadSanitizer the waker's path from the wake-up to blocking runs
  // ~10x slower and can outlast 5 us, and a thief would then take the fiber
  // at the grace's end. Scaled, the rule behaves in that build as it does in
  // the others.
#if defined(__SANITIZE_THREAD__)
  static constexpr std::uint64_t kGraceNs = 50'000;
#else
  static constexpr std::uint64_t kGraceNs = 5'000;
#endif

  explicit AffineGrace(std::size_t cores) : seen_(cores) {}

  /// Whether a thief may steal from core `core` now, whose count of
  /// wake-affine placements is `seq` and which has `queued` fibers queued.
  /// Reads the clock only while a single fiber queued there may be one the
  /// thief has not yet waited for.
  bool allows(unsigned core, std::uint32_t seq, int queued) noexcept {
    if (queued != 1) return true; // a backlog: the owner cannot run it all next
    Seen& s = seen_[core];
    if (seq == s.seq && (s.since == 0 || now_ns() - s.since >= kGraceNs)) return true;
    if (seq != s.seq) s = {seq, now_ns()}; // a placement this thief has not seen: wait from now
    refused_ = true;
    return false;
  }
  /// A steal attempt begins (refused() then says whether it left a core alone for the grace).
  void new_attempt() noexcept { refused_ = false; }
  /// The last attempt left a core alone for the grace: a thief about to sleep
  /// should spin until the grace ends instead (Worker::find_work), or the
  /// fiber would wait for the slice tick.
  bool refused() const noexcept { return refused_; }

private:
  struct Seen {
    std::uint32_t seq = 0;   // the core's count when this thief first saw it
    std::uint64_t since = 0; // when (0: never waited: the core has had no placement)
  };
  std::vector<Seen> seen_; // per core; only the owning worker's thread uses it
  bool refused_ = false;
};

} // namespace coresched::detail
