// SPDX-License-Identifier: Apache-2.0
// CORESCHED_INVARIANT(cond): a rule that must always hold, checked where the
// runtime is built for testing (CORESCHED_ISOLATION_CHECK, which every test
// build sets, sanitizer builds included) or without NDEBUG; a broken one
// prints the rule and its place and aborts. Compiled out of release builds,
// so the hot paths' instruction budgets are measured without it. Use it in
// .cpp files of the runtime only: headers are also compiled into the tests,
// which do not set the flag.
#pragma once

#if defined(CORESCHED_ISOLATION_CHECK) || !defined(NDEBUG)
#include <cstdio>
#include <cstdlib>
#define CORESCHED_INVARIANT(cond)                                                                                   \
  do {                                                                                                              \
    if (!(cond)) [[unlikely]] {                                                                                     \
      std::fprintf(stderr, "coresched: invariant broken at %s:%d: %s\n", __FILE__, __LINE__, #cond);               \
      std::abort();                                                                                                 \
    }                                                                                                               \
  } while (0)
#else
#define CORESCHED_INVARIANT(cond) static_cast<void>(0)
#endif
