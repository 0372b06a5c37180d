// SPDX-License-Identifier: Apache-2.0
// Small helpers shared by the test files.
#pragma once

#include <coresched/options.hpp>

#include <cstdlib>

namespace test_support {

/// Options for a runtime on the given topology (usually synthetic).
inline coresched::Options topo(const char* spec,
                               coresched::FairnessPolicy policy = coresched::FairnessPolicy::core_vruntime) {
  coresched::Options o;
  o.topology = spec;
  o.policy = policy;
  return o;
}

/// Sanitizer builds scale the stress tests down (they run 5-50x slower): CORESCHED_STRESS_SCALE.
inline double stress_scale() {
  const char* s = std::getenv("CORESCHED_STRESS_SCALE");
  return s ? std::atof(s) : 1.0;
}

} // namespace test_support
