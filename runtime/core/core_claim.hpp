// SPDX-License-Identifier: Apache-2.0
// The process-wide rule between runtimes: two runtimes alive at once never
// share a core of more than one PU.
#pragma once

#include <coresched/topology.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace coresched::detail {

/// The cores a live runtime holds, in a list shared by the whole process.
/// Each runtime's core-wide pick arbitrates only its own workers: a core
/// whose siblings were split between two runtimes would let each run its own
/// cookie beside the other's, with no pick seeing both. So a runtime claims
/// every core of more than one PU it uses (all of that core's OS indexes,
/// used or not) and the constructor of one that would share such a core with
/// a live runtime throws UsageError. Cores of one PU have no siblings to
/// protect and are not claimed. Released when the runtime's workers have
/// stopped (shutdown) or by the destructor.
class CoreClaim {
public:
  /// Claims `t`'s cores for the runtime described by `who` (its topology spec).
  /// @throws UsageError naming the first shared core and the runtime holding it.
  CoreClaim(const Topology& t, std::string who);
  ~CoreClaim() { release(); }
  CoreClaim(const CoreClaim&) = delete;
  CoreClaim& operator=(const CoreClaim&) = delete;
  /// Gives the cores back; idempotent.
  void release() noexcept;

private:
  std::uint64_t id_ = 0; // 0: nothing held
};

} // namespace coresched::detail
