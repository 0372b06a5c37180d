// SPDX-License-Identifier: Apache-2.0
// Cookies: their numbers, names and weights (cookie_registry.hpp).
#include "platform/cookie_registry.hpp"

#include <coresched/cookie.hpp>
#include <coresched/join_handle.hpp>

#include <atomic>
#include <fmt/format.h>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace coresched {
namespace detail {
namespace {

struct Entry {
  std::atomic<std::uint32_t> weight{kDefaultWeight};
  std::unique_ptr<char[]> name; // set once, before the entry is published
};

// Entries are never removed (cookies are never reused), so a name's pointer
// stays valid for the process's life.
struct Registry {
  std::shared_mutex mu;
  std::unordered_map<std::uint64_t, std::unique_ptr<Entry>> entries;
  std::atomic<bool> any_weight{false}; // some weight was set: reads must look

  const Entry* find(std::uint64_t cookie) {
    std::shared_lock lk(mu);
    auto it = entries.find(cookie);
    return it == entries.end() ? nullptr : it->second.get();
  }
  Entry& get(std::uint64_t cookie) { // under mu, exclusive
    auto& e = entries[cookie];
    if (!e) e = std::make_unique<Entry>();
    return *e;
  }
};

Registry& registry() {
  static Registry* r = new Registry; // never destroyed: fibers may read it during exit
  return *r;
}

void check_weight(std::uint32_t weight) {
  if (weight < Cookie::kMinWeight || weight > Cookie::kMaxWeight)
    throw UsageError(fmt::format("coresched: a cookie's weight must be {} to {} (cgroup cpu.weight's range), not {}",
                                 Cookie::kMinWeight, Cookie::kMaxWeight, weight));
}

} // namespace

std::atomic<std::uint64_t> g_weights_generation{0};

std::uint32_t cookie_weight(std::uint64_t cookie) noexcept {
  Registry& r = registry();
  if (!r.any_weight.load(std::memory_order_acquire)) return kDefaultWeight;
  const Entry* e = r.find(cookie);
  return e ? e->weight.load(std::memory_order_relaxed) : kDefaultWeight;
}

void set_cookie_weight(std::uint64_t cookie, std::uint32_t weight) {
  Registry& r = registry();
  {
    std::unique_lock lk(r.mu);
    r.get(cookie).weight.store(weight, std::memory_order_relaxed);
    r.any_weight.store(true, std::memory_order_release);
  }
  g_weights_generation.fetch_add(1, std::memory_order_acq_rel);
}

const char* cookie_name(std::uint64_t cookie) noexcept {
  const Entry* e = registry().find(cookie);
  return e && e->name ? e->name.get() : nullptr;
}

std::string cookie_label(std::uint64_t cookie) {
  if (cookie == 0) return "0 (untagged)";
  if (const char* n = cookie_name(cookie)) return fmt::format("{} ({})", cookie, n);
  return std::to_string(cookie);
}

} // namespace detail

Cookie Cookie::create() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return Cookie(next.fetch_add(1, std::memory_order_relaxed));
}

Cookie Cookie::create(std::string_view name, std::uint32_t weight) {
  detail::check_weight(weight);
  if (name.size() > kMaxNameLength)
    throw UsageError(fmt::format("coresched: a cookie's name is at most {} bytes; \"{}\" has {}", kMaxNameLength,
                                 name, name.size()));
  for (char ch : name)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f)
      throw UsageError("coresched: a cookie's name may not hold control characters");
  const Cookie c = create();
  if (!name.empty()) {
    detail::Registry& r = detail::registry();
    std::unique_lock lk(r.mu);
    detail::Entry& e = r.get(c.value());
    e.name = std::make_unique<char[]>(name.size() + 1);
    name.copy(e.name.get(), name.size());
    e.name[name.size()] = '\0';
  }
  // No fiber can carry the cookie yet, so its weight need not appear with its name.
  if (weight != kDefaultWeight) detail::set_cookie_weight(c.value(), weight);
  return c;
}

void Cookie::set_weight(std::uint32_t weight) const {
  detail::check_weight(weight);
  if (value_ == ~std::uint64_t{0})
    throw UsageError("coresched: the cookie value UINT64_MAX is reserved and carries no weight");
  detail::set_cookie_weight(value_, weight);
}

std::uint32_t Cookie::weight() const noexcept { return detail::cookie_weight(value_); }

std::string Cookie::name() const {
  const char* n = detail::cookie_name(value_);
  return n ? n : "";
}

std::string Cookie::label() const { return detail::cookie_label(value_); }

} // namespace coresched
