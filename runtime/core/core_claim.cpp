// SPDX-License-Identifier: Apache-2.0
#include "core/core_claim.hpp"

#include <coresched/runtime.hpp>

#include <algorithm>
#include <mutex>

namespace coresched::detail {

namespace {

struct Holder {
  std::uint64_t id;
  std::string who;
  std::vector<std::vector<unsigned>> cores; // OS indexes of each claimed core, sorted
};

struct Claims {
  std::mutex mu;
  std::uint64_t next = 1;
  std::vector<Holder> live;
};

Claims& claims() {
  static Claims* c = new Claims; // never destroyed: runtimes may outlive static destruction order
  return *c;
}

std::string list(const std::vector<unsigned>& v) {
  std::string s;
  for (unsigned x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

bool overlap(const std::vector<unsigned>& a, const std::vector<unsigned>& b) {
  return std::any_of(a.begin(), a.end(), [&](unsigned x) { return std::binary_search(b.begin(), b.end(), x); });
}

} // namespace

CoreClaim::CoreClaim(const Topology& t, std::string who) {
  Holder mine{0, std::move(who), {}};
  for (const auto& c : t.cores()) {
    if (c.os_pus.size() < 2) continue;
    std::vector<unsigned> os = c.os_pus;
    std::sort(os.begin(), os.end());
    mine.cores.push_back(std::move(os));
  }
  Claims& all = claims();
  std::lock_guard lk(all.mu);
  for (const Holder& h : all.live)
    for (const auto& theirs : h.cores)
      for (const auto& ours : mine.cores)
        if (overlap(ours, theirs))
          throw UsageError("coresched: this runtime's core of PUs " + list(ours) + " (topology \"" + mine.who +
                           "\") shares a core with a live runtime of this process (topology \"" + h.who +
                           "\", core of PUs " + list(theirs) +
                           "): neither runtime's core-wide pick would see the other's fibers, so two cookies could "
                           "run on sibling PUs at once. Give each runtime its own cores with Options::cpus (e.g. "
                           "\"0-1\" and \"2-3\"), or shut the other runtime down first");
  mine.id = all.next++;
  id_ = mine.id;
  all.live.push_back(std::move(mine));
}

void CoreClaim::release() noexcept {
  if (!id_) return;
  Claims& all = claims();
  std::lock_guard lk(all.mu);
  std::erase_if(all.live, [&](const Holder& h) { return h.id == id_; });
  id_ = 0;
}

} // namespace coresched::detail
