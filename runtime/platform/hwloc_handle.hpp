// SPDX-License-Identifier: Apache-2.0
// Owns an hwloc topology; kept alive by Topology so workers can bind with it.
#pragma once

#include <hwloc.h>

namespace coresched::detail {

struct HwlocHandle {
  hwloc_topology_t topo = nullptr;
  HwlocHandle() = default;
  HwlocHandle(const HwlocHandle&) = delete;
  HwlocHandle& operator=(const HwlocHandle&) = delete;
  ~HwlocHandle();
};

} // namespace coresched::detail
