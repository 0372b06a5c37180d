// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file commands.hpp
/// How main() learns about subcommands: each one registers its CLI11
/// subcommand and returns the function that runs it once parsed. A new
/// benchmark is a new file with one register_*() function, listed in main.cpp.

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>

namespace coresched::bench {

struct Command {
  CLI::App* app;            ///< The subcommand (parsed() tells whether it was chosen).
  std::function<int()> run; ///< Runs it; returns the exit status.
};

/// A subcommand whose options fill one Settings object that `run` then reads:
/// `add_options(CLI::App&, Settings&)` declares them, `run(settings)` returns
/// the exit status. The Settings live as long as the returned Command.
template <class Settings, class AddOptions, class Run>
Command make_command(CLI::App& parent, const char* name, const char* description, AddOptions add_options, Run run) {
  auto s = std::make_shared<Settings>();
  CLI::App* sub = parent.add_subcommand(name, description);
  add_options(*sub, *s);
  return {sub, [s, run] { return run(*s); }};
}

/// seed 000: sysbench cpu vs. memory on two siblings under the tag configurations.
Command register_matrix(CLI::App& parent);
/// seed 003: latt, wakeup latency of fibers woken through their own channels, idle or under load.
Command register_latt(CLI::App& parent);
/// seed 001: schbench, wake-up latency percentiles of message-driven workers, mask vs. scan placement.
Command register_schbench(CLI::App& parent);
/// seed 001: hackbench, message passing between sender and receiver groups, mask vs. scan placement.
Command register_hackbench(CLI::App& parent);
/// seed 002: a compute tenant against a request tenant with different cookies, per fairness policy.
Command register_tenants(CLI::App& parent);
/// A live view (per core: owner, forced idle, queued per cookie, hand-overs/s) over a multi-tenant workload.
Command register_top(CLI::App& parent);

} // namespace coresched::bench
