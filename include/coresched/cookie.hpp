// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file cookie.hpp
/// Core-scheduling cookies.
///
/// Semantics follow Linux core scheduling (PR_SCHED_CORE): every fiber carries a
/// cookie; two fibers may run at the same instant on sibling PUs of one physical
/// core only if their cookies are equal. The default cookie is *untagged* (value
/// 0) and untagged fibers are compatible only with other untagged fibers.
///
/// A cookie is a tenant. It may carry a name, shown beside its number
/// wherever the runtime prints a cookie (statistics, the fiber dump, the
/// trace, `coresched-bench top`, gdb's `info fibers`), and a weight, with
/// cgroup `cpu.weight` semantics: where cookies compete for one core, each
/// gets a share of the core's time proportional to its weight. Names and
/// weights belong to the process (like the cookie) and hold in every Runtime.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace coresched {

/// A core-scheduling tag. Cheap to copy; compare with ==.
class Cookie {
public:
  /// The untagged cookie (value 0).
  constexpr Cookie() noexcept = default;

  /// Makes a new cookie, unique within the process (never 0). Callable from any
  /// thread, with or without a Runtime; cookies are never reused.
  static Cookie create() noexcept;

  /// The weight every cookie has until set_weight() changes it.
  static constexpr std::uint32_t kDefaultWeight = 100;
  /// The least weight (cgroup `cpu.weight`'s range: 1 to 10,000).
  static constexpr std::uint32_t kMinWeight = 1;
  /// The largest weight.
  static constexpr std::uint32_t kMaxWeight = 10'000;
  /// The longest name, in bytes.
  static constexpr std::size_t kMaxNameLength = 48;

  /// Makes a new cookie, as create(), with a name (may be empty: none) and a
  /// weight. A name longer than kMaxNameLength or holding a control
  /// character, or a weight outside [kMinWeight, kMaxWeight], is a
  /// UsageError, and no cookie is made. The name and weight are kept for the
  /// life of the process (a cookie per request should not be named).
  static Cookie create(std::string_view name, std::uint32_t weight = kDefaultWeight);

  /// Changes the weight, from any thread, while fibers run: each core's next
  /// pick between cookies uses it; what the cookie ran before keeps the
  /// weight it ran under. Outside [kMinWeight, kMaxWeight], or on the
  /// reserved value UINT64_MAX, a UsageError, and nothing changes. The
  /// untagged cookie (0) may be weighted too.
  void set_weight(std::uint32_t weight) const;

  /// The current weight (kDefaultWeight unless set).
  std::uint32_t weight() const noexcept;

  /// The name given at create(); empty if none.
  std::string name() const;

  /// How the runtime prints this cookie: its number, and its name in
  /// parentheses if it has one ("7 (premium)"); "0 (untagged)" for 0.
  std::string label() const;

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
