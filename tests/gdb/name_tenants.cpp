// SPDX-License-Identifier: Apache-2.0
// Linked into the gdb test's build of examples/stuck: names its two tenants.
// stuck tags its fibers with Cookie::from_value(1) and (2), and cookies are
// numbered from 1 in the order Cookie::create() makes them, so the first two
// made, here, before main, are those. The names hold a quote, a backslash and
// a space, which the extension must print as they are.
#include <coresched/cookie.hpp>

#include <cstdio>
#include <cstdlib>

namespace {

const bool named = [] {
  const auto a = coresched::Cookie::create("tenant \"A\"");
  const auto b = coresched::Cookie::create("tenant\\B");
  if (a.value() != 1 || b.value() != 2) {
    std::fprintf(stderr, "name_tenants: the named cookies are %llu and %llu, not stuck's 1 and 2\n",
                 static_cast<unsigned long long>(a.value()), static_cast<unsigned long long>(b.value()));
    std::abort();
  }
  return true;
}();

} // namespace
