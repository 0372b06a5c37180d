// SPDX-License-Identifier: Apache-2.0
// Catch2's main for coresched_guarantee_tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
