// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file commands.hpp
/// How main() learns about subcommands: each one registers its CLI11
/// subcommand and returns the function that runs it once parsed. A new
/// benchmark is a new file with one register_*() function, listed in main.cpp.

#include <CLI/CLI.hpp>

#include <functional>

namespace coresched::bench {

struct Command {
  CLI::App* app;            ///< The subcommand (parsed() tells whether it was chosen).
  std::function<int()> run; ///< Runs it; returns the exit status.
};

/// seed 000: sysbench cpu vs. memory on two siblings under the tag configurations.
Command register_matrix(CLI::App& parent);

} // namespace coresched::bench
