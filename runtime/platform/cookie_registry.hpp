// SPDX-License-Identifier: Apache-2.0
// What the process knows about each cookie beyond its number: a name and a
// weight (Cookie::create(name, weight), Cookie::set_weight). One table for
// the process, as cookies are: every Runtime, and every core's fairness
// books, read the same weight.
//
// The cores read weights only where their books change (a new cookie on a
// core, and a checkpoint that finds the generation moved), never per yield:
// while no weight was ever set, a read takes no lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace coresched::detail {

inline constexpr std::uint32_t kDefaultWeight = 100;

/// The weight of `cookie`: kDefaultWeight unless set.
std::uint32_t cookie_weight(std::uint64_t cookie) noexcept;
/// Moves on every weight change; a core that saw another value re-reads the
/// weights of the cookies on its books. Read inline: every checkpoint of a
/// contended core reads it.
extern std::atomic<std::uint64_t> g_weights_generation;
inline std::uint64_t weights_generation() noexcept { return g_weights_generation.load(std::memory_order_acquire); }
/// Sets a weight; the caller has checked its range.
void set_cookie_weight(std::uint64_t cookie, std::uint32_t weight);
/// The name given at creation, or null. The string lives as long as the
/// process, so the dump and the debugger may hold the pointer.
const char* cookie_name(std::uint64_t cookie) noexcept;
/// "7", "7 (premium)", "0 (untagged)": how every output prints a cookie.
std::string cookie_label(std::uint64_t cookie);

} // namespace coresched::detail
