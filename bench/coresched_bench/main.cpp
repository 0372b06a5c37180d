// SPDX-License-Identifier: Apache-2.0
// coresched-bench: the seed benchmarks as subcommands of one program.
#include "commands.hpp"
#include "common.hpp"

#include <cstdio>
#include <exception>
#include <vector>

int main(int argc, char** argv) {
  using namespace coresched::bench;
  CLI::App app{"coresched-bench: kernel scheduler experiments (core scheduling, wake-up placement, wake-up latency) "
                "reproduced on coresched fibers; their sources: docs/benchmarks.md"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every subcommand");
  // One entry per benchmark; a new subcommand is one more line here.
  const std::vector<Command> commands{register_matrix(app), register_latt(app), register_schbench(app),
                                      register_hackbench(app), register_tenants(app),
                                      register_top(app)};

  CLI11_PARSE(app, argc, argv);
  catch_interrupts(); // Ctrl-C or SIGTERM: the command stops early and reports what it gathered
  try {
    for (const auto& c : commands)
      if (c.app->parsed()) return exit_status(c.run());
  } catch (const coresched::TopologyError& e) {
    std::fprintf(stderr, "coresched-bench: topology error: %s\n", e.what());
    return exit_setup;
  } catch (const coresched::UsageError& e) {
    std::fprintf(stderr, "coresched-bench: %s\n", e.what());
    return exit_setup;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched-bench: %s\n", e.what());
    return exit_failure;
  }
  return exit_failure; // unreachable: require_subcommand(1)
}
