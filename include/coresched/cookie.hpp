// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file cookie.hpp
/// Core-scheduling cookies.
///
/// Semantics follow Linux core scheduling (PR_SCHED_CORE): every fiber carries a
/// cookie; two fibers may run at the same instant on sibling PUs of one physical
/// core only if their cookies are equal. The default cookie is *untagged* (value
/// 0) and untagged fibers are compatible only with other untagged fibers.

#include <cstdint>
#include <functional>

namespace coresched {

/// A core-scheduling tag. Cheap to copy; compare with ==.
class Cookie {
public:
  /// The untagged cookie (value 0).
  constexpr Cookie() noexcept = default;

  /// Makes a new cookie, unique within the process (never 0). Callable from any
  /// thread, with or without a Runtime; cookies are never reused.
  static Cookie create() noexcept;

  /// Rebuilds a cookie from value(); for stats tables and tests. The value
  /// UINT64_MAX is reserved (the runtime's "no cookie"): spawning a fiber with
  /// it or passing it to this_fiber::set_cookie() is a UsageError.
  static constexpr Cookie from_value(std::uint64_t v) noexcept { return Cookie(v); }

  /// The raw value; 0 means untagged.
  constexpr std::uint64_t value() const noexcept { return value_; }

  /// True for the default, untagged cookie.
  constexpr bool untagged() const noexcept { return value_ == 0; }

  /// Equal cookies may run side by side on sibling PUs; untagged equals only untagged.
  friend constexpr bool operator==(Cookie, Cookie) noexcept = default;

private:
  constexpr explicit Cookie(std::uint64_t v) noexcept : value_(v) {}
  std::uint64_t value_ = 0;
};

} // namespace coresched

/// Hash support so cookies can key unordered containers.
template <> struct std::hash<coresched::Cookie> {
  /// Hashes the raw value().
  std::size_t operator()(coresched::Cookie c) const noexcept { return std::hash<std::uint64_t>{}(c.value()); }
};
