// SPDX-License-Identifier: Apache-2.0
// A fiber's FiberLocal values (see fiber_local.cpp).
#pragma once

#include <coresched/fiber_local.hpp>

#include <vector>

namespace coresched::detail {

struct JoinRecord;

/// What JoinRecord::locals points to: one slot per key, up to the largest
/// key the fiber has set.
using LocalValues = std::vector<LocalValue>;

/// Destroys the calling fiber's values (it is `j`'s fiber, ending).
void destroy_locals(JoinRecord& j) noexcept;

} // namespace coresched::detail
