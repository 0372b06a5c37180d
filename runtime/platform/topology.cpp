// SPDX-License-Identifier: Apache-2.0
// Topology discovery with hwloc: real machine, synthetic string or XML file.

#include "platform/hwloc_handle.hpp"

#include <coresched/topology.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <sched.h>
#include <sstream>
#include <string>

namespace coresched {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The CPUs this process may run on, ascending. Never empty on return.
std::vector<unsigned> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0)
    throw TopologyError(std::string("coresched: sched_getaffinity failed: ") + std::strerror(errno));
  std::vector<unsigned> cpus;
  for (unsigned c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.empty()) throw TopologyError("coresched: the process's allowed-CPU set is empty");
  return cpus;
}

// The deepest-level cache above `obj` (the last-level cache), or null.
hwloc_obj_t last_level_cache(hwloc_obj_t obj) {
  hwloc_obj_t llc = nullptr;
  for (hwloc_obj_t a = obj->parent; a; a = a->parent) {
    if (hwloc_obj_type_is_dcache(a->type) && (!llc || a->attr->cache.depth > llc->attr->cache.depth)) llc = a;
  }
  return llc;
}

std::string resolve_spec(const std::string& spec) {
  if (!spec.empty() && spec != "auto") return spec;
  const char* env = std::getenv("CORESCHED_TOPOLOGY");
  if (env && *env && std::string(env) != "auto") return env;
  return "auto";
}

} // namespace

namespace detail {
HwlocHandle::~HwlocHandle() {
  if (topo) hwloc_topology_destroy(topo);
}
} // namespace detail

// Builds the model from a loaded hwloc topology. A friend of Topology.
struct TopologyBuilder {
  static void load(Topology& t, detail::HwlocHandle& h);
  static void fill(Topology& t, hwloc_topology_t topo, const std::vector<unsigned>& allowed, hwloc_const_bitmap_t only);
};

namespace {
// Options::cpus as a bitmap of PU OS indexes (null when empty: every PU),
// checked against the topology so that a typo is an error, not a runtime on
// fewer PUs than meant.
struct PuList {
  hwloc_bitmap_t set = nullptr;
  PuList() = default;
  PuList(const PuList&) = delete;
  PuList& operator=(const PuList&) = delete;
  ~PuList() { if (set) hwloc_bitmap_free(set); }
};

void parse_pu_list(PuList& out, const std::string& cpus, hwloc_topology_t topo, const std::string& spec) {
  if (cpus.empty()) return;
  out.set = hwloc_bitmap_alloc();
  if (!out.set) throw TopologyError("coresched: hwloc_bitmap_alloc failed");
  const bool digits = cpus.find_first_not_of("0123456789,- ") == std::string::npos;
  if (!digits || hwloc_bitmap_list_sscanf(out.set, cpus.c_str()) != 0 || hwloc_bitmap_iszero(out.set) ||
      hwloc_bitmap_weight(out.set) < 0)
    throw TopologyError("coresched: Options::cpus \"" + cpus + "\" is not a list of PU OS indexes such as \"0-3,8\"");
  hwloc_const_bitmap_t all = hwloc_topology_get_topology_cpuset(topo);
  if (!hwloc_bitmap_isincluded(out.set, all)) {
    char* have = nullptr;
    hwloc_bitmap_list_asprintf(&have, all);
    const std::string msg = "coresched: Options::cpus \"" + cpus + "\" names PUs that topology \"" + spec +
                            "\" does not have (its PUs: " + (have ? have : "?") + ")";
    std::free(have);
    throw TopologyError(msg);
  }
}
} // namespace

namespace {
// The PUs a synthetic description makes: the product of its arities (the
// numbers after "type:" or alone; attributes in parentheses left out),
// saturated. A bound is checked before hwloc sees it: hwloc's load grows
// with the square of the objects ("core:100000 pu:100000" would load for
// minutes, "core:2048 pu:2" takes 14 s and starts 4,096 workers).
std::uint64_t synthetic_pus(const std::string& spec) {
  std::string plain;
  int depth = 0;
  for (char c : spec) {
    if (c == '(') ++depth;
    else if (c == ')') depth = std::max(0, depth - 1);
    else if (depth == 0) plain += c;
  }
  std::istringstream words(plain);
  std::uint64_t pus = 1;
  for (std::string w; words >> w;) {
    const std::string n = w.substr(w.rfind(':') == std::string::npos ? 0 : w.rfind(':') + 1);
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::uint64_t k = n.size() > 9 ? 1'000'000'000 : std::stoull(n);
    pus = std::min<std::uint64_t>(pus * std::max<std::uint64_t>(k, 1), 1'000'000'000);
  }
  return pus;
}
constexpr std::uint64_t kMaxSyntheticPus = 1024;
} // namespace

void TopologyBuilder::load(Topology& t, detail::HwlocHandle& h) {
  if (t.source_ == Topology::Source::synthetic && synthetic_pus(t.spec_) > kMaxSyntheticPus)
    throw TopologyError("coresched: synthetic topology "" + t.spec_ + "" has " +
                        std::to_string(synthetic_pus(t.spec_)) + " PUs or more; at most " +
                        std::to_string(kMaxSyntheticPus) + " (one worker thread each)");
  if (hwloc_topology_init(&h.topo) != 0) throw TopologyError("coresched: hwloc_topology_init failed");
  if (t.source_ == Topology::Source::synthetic) {
    if (hwloc_topology_set_synthetic(h.topo, t.spec_.c_str()) != 0)
      throw TopologyError("coresched: cannot parse hwloc synthetic topology \"" + t.spec_ +
                          "\" (expected e.g. \"package:1 l3cache:1 core:2 pu:2\")");
  } else if (t.source_ == Topology::Source::xml) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(t.spec_, ec))
      throw TopologyError("coresched: topology XML file \"" + t.spec_ + "\" does not exist or is not a file");
    if (hwloc_topology_set_xml(h.topo, t.spec_.c_str()) != 0)
      throw TopologyError("coresched: cannot read topology XML \"" + t.spec_ + "\": " + std::strerror(errno));
  }
  if (hwloc_topology_load(h.topo) != 0)
    throw TopologyError("coresched: hwloc could not load topology \"" + t.spec_ + "\" (invalid XML?)");
}

void TopologyBuilder::fill(Topology& t, hwloc_topology_t topo, const std::vector<unsigned>& allowed,
                           hwloc_const_bitmap_t only) {
  const bool real = t.source_ == Topology::Source::machine;
  std::map<hwloc_obj_t, unsigned> llc_index;
  std::map<unsigned, unsigned> package_index;
  const int ncores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  // Machines that report no cores (some VMs): each PU is its own core.
  const hwloc_obj_type_t core_type = ncores > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  const int n = hwloc_get_nbobjs_by_type(topo, core_type);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t core = hwloc_get_obj_by_type(topo, core_type, static_cast<unsigned>(i));
    std::vector<hwloc_obj_t> pus;
    std::vector<unsigned> os_pus;
    for (hwloc_obj_t pu = nullptr;
         (pu = hwloc_get_next_obj_inside_cpuset_by_type(topo, core->cpuset, HWLOC_OBJ_PU, pu));) {
      os_pus.push_back(pu->os_index);
      if (real && !std::binary_search(allowed.begin(), allowed.end(), pu->os_index)) continue;
      if (only && !hwloc_bitmap_isset(only, pu->os_index)) continue;
      pus.push_back(pu);
    }
    if (pus.empty()) continue;
    hwloc_obj_t llc = last_level_cache(core);
    hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, core);
    const unsigned pkg_os = pkg ? pkg->logical_index : 0;
    auto [pit, pnew] = package_index.try_emplace(pkg_os, static_cast<unsigned>(package_index.size()));
    auto [lit, lnew] = llc_index.try_emplace(llc, static_cast<unsigned>(t.llcs_.size()));
    if (lnew) t.llcs_.push_back(LlcInfo{lit->second, {}});
    CoreInfo ci{static_cast<unsigned>(t.cores_.size()), lit->second, pit->second, {}, std::move(os_pus)};
    for (hwloc_obj_t pu : pus) {
      const auto idx = static_cast<unsigned>(t.pus_.size());
      // Synthetic and XML PUs are not CPUs of this machine: map them round-robin.
      const unsigned cpu = real ? pu->os_index : allowed[idx % allowed.size()];
      t.pus_.push_back(PuInfo{idx, pu->os_index, cpu, ci.index, ci.llc, ci.package});
      ci.pus.push_back(idx);
    }
    t.llcs_[ci.llc].cores.push_back(ci.index);
    t.cores_.push_back(std::move(ci));
  }
  t.packages_ = static_cast<unsigned>(package_index.size());
  if (t.pus_.empty())
    throw TopologyError("coresched: topology \"" + t.spec_ + "\" has no PU the process is allowed to use" +
                        (only ? " among Options::cpus" : ""));
}

Topology Topology::discover(const std::string& spec_in, const std::string& cpus) {
  Topology t;
  t.spec_ = resolve_spec(spec_in);
  if (t.spec_ == "auto") t.source_ = Source::machine;
  else if (ends_with(t.spec_, ".xml")) t.source_ = Source::xml;
  else t.source_ = Source::synthetic;
  const std::vector<unsigned> allowed = allowed_cpus();
  auto handle = std::make_shared<detail::HwlocHandle>();
  TopologyBuilder::load(t, *handle);
  PuList only;
  parse_pu_list(only, cpus, handle->topo, t.spec_);
  TopologyBuilder::fill(t, handle->topo, allowed, only.set);
  if (t.source_ == Source::machine) t.hwloc_ = std::move(handle); // binding only works on the real machine
  return t;
}

unsigned Topology::max_siblings() const noexcept {
  std::size_t m = 0;
  for (const auto& c : cores_) m = std::max(m, c.pus.size());
  return static_cast<unsigned>(m);
}

std::string Topology::describe() const {
  std::ostringstream os;
  const char* src = source_ == Source::machine ? "this machine" : source_ == Source::xml ? "hwloc XML" : "hwloc synthetic";
  os << "topology: " << src;
  if (source_ != Source::machine) os << " \"" << spec_ << "\"";
  os << " — " << packages_ << " package(s), " << llcs_.size() << " LLC(s), " << cores_.size() << " core(s), "
     << pus_.size() << " PU(s), up to " << max_siblings() << " PU(s)/core\n";
  if (real_siblings())
    os << "siblings: REAL" << (max_siblings() < 2 ? " (no SMT on this machine: every core has one PU)" : "")
       << "; workers pinned with hwloc to CPUs";
  else
    os << "siblings: SYNTHETIC (PUs mapped round-robin onto real CPUs; co-scheduling is simulated, not hardware)"
       << "; workers pinned to CPUs";
  std::vector<unsigned> cpus;
  for (const auto& p : pus_) cpus.push_back(p.cpu);
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  for (std::size_t i = 0; i < cpus.size(); ++i) os << (i ? "," : " ") << cpus[i];
  return os.str();
}

} // namespace coresched
