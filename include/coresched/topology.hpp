// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file topology.hpp
/// The machine as the runtime sees it: packages, last-level-cache domains,
/// physical cores and their hardware threads (PUs, SMT siblings).

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace coresched {

/// Thrown when a topology cannot be built: bad synthetic string, missing or
/// invalid XML file, or no CPU the process may use.
class TopologyError : public std::runtime_error {
public:
  /// Takes the message that what() returns.
  using std::runtime_error::runtime_error;
};

/// One hardware thread. A worker thread runs on each.
struct PuInfo {
  unsigned index;    ///< Dense index over the runtime's PUs (also the worker index).
  unsigned os_index; ///< hwloc's OS index of the PU (a real CPU number on the real machine).
  unsigned cpu;      ///< The real CPU the worker is pinned to (differs from os_index when synthetic).
  unsigned core;     ///< Index into Topology::cores().
  unsigned llc;      ///< Index into Topology::llcs().
  unsigned package;  ///< Package (socket) number.
};

/// One physical core and its sibling PUs.
struct CoreInfo {
  unsigned index;             ///< Dense core index.
  unsigned llc;               ///< Index into Topology::llcs().
  unsigned package;           ///< Package (socket) number.
  std::vector<unsigned> pus;  ///< Sibling PUs (indexes into Topology::pus()).
  /// hwloc OS indexes of every hardware thread of this core, including those
  /// the runtime does not use (left out by the affinity mask or Options::cpus):
  /// what two runtimes in one process compare to find a shared core.
  std::vector<unsigned> os_pus;
};

/// One last-level-cache domain.
struct LlcInfo {
  unsigned index;              ///< Dense LLC index.
  std::vector<unsigned> cores; ///< Cores sharing this cache.
};

/// Implementation details (the shared hwloc handle); not part of the API.
namespace detail { struct HwlocHandle; }

/// Read-only model of the topology in use. Cheap to copy (shares its hwloc handle).
class Topology {
public:
  /// Where the topology came from: `machine` (hwloc on this machine; PUs are real
  /// CPUs), `synthetic` (an hwloc synthetic string) or `xml` (an hwloc XML
  /// export). For the last two, PUs are mapped round-robin onto the CPUs the
  /// process may use, so siblings are not real hardware threads.
  enum class Source { machine, synthetic, xml };

  /// Builds the topology from a spec: "" / "auto" (real machine, or
  /// CORESCHED_TOPOLOGY if set), a synthetic string, or a ".xml" path.
  /// Only CPUs in the process's affinity mask are used, and of those only the
  /// PUs whose OS index is in `cpus` (an hwloc list such as "0-3,8"; empty
  /// means all; for synthetic and XML topologies, the PUs' own OS indexes).
  /// @throws TopologyError naming the problem (a `cpus` list that does not
  /// parse or names a PU the topology lacks, too).
  static Topology discover(const std::string& spec = "", const std::string& cpus = "");

  /// Where the topology came from.
  Source source() const noexcept { return source_; }
  /// The spec it was built from, after resolving CORESCHED_TOPOLOGY.
  const std::string& spec() const noexcept { return spec_; }
  /// True when the PUs are real hardware threads of this machine.
  bool real_siblings() const noexcept { return source_ == Source::machine; }
  /// The most PUs any core has (1 means no SMT).
  unsigned max_siblings() const noexcept;

  /// Every PU the runtime uses, indexed by PuInfo::index (one worker each).
  const std::vector<PuInfo>& pus() const noexcept { return pus_; }
  /// Every physical core, indexed by CoreInfo::index.
  const std::vector<CoreInfo>& cores() const noexcept { return cores_; }
  /// Every last-level-cache domain, indexed by LlcInfo::index.
  const std::vector<LlcInfo>& llcs() const noexcept { return llcs_; }
  /// Number of packages (sockets) with a used PU.
  unsigned packages() const noexcept { return packages_; }

  /// A one-paragraph human description, always stating whether siblings are
  /// real or synthetic and which real CPUs are used.
  std::string describe() const;

  /// The hwloc handle (real machine only, else null); used to bind workers.
  const std::shared_ptr<detail::HwlocHandle>& platform() const noexcept { return hwloc_; }

private:
  Source source_ = Source::machine;
  std::string spec_;
  std::vector<PuInfo> pus_;
  std::vector<CoreInfo> cores_;
  std::vector<LlcInfo> llcs_;
  unsigned packages_ = 0;
  std::shared_ptr<detail::HwlocHandle> hwloc_;
  friend struct TopologyBuilder;
};

} // namespace coresched
