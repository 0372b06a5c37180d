// SPDX-License-Identifier: Apache-2.0
// coresched-tag-exec: runs a command pinned to one CPU and tagged with a new kernel core-scheduling cookie
// (prctl(PR_SCHED_CORE, PR_SCHED_CORE_CREATE) on itself, then exec: the cookie survives exec and is inherited by
// the command's threads and children). util-linux's `coresched` command does this too, but is newer than
// Debian 12's util-linux. `coresched-bench matrix --compare-sysbench` starts the tagged sysbench processes with it.
//
//   coresched-tag-exec [--cpu N] [--untagged] -- COMMAND [ARG...]
//
// --untagged only pins (so both sides of a comparison start the same way). Exit 126 when pinning or tagging
// fails (with the reason on stderr), 127 when COMMAND cannot be executed.
#include "kernel_tag.hpp"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

using namespace coresched::bench;

int main(int argc, char** argv) {
  CLI::App app{"coresched-tag-exec: runs COMMAND pinned to one CPU with a new kernel core-scheduling cookie "
               "(PR_SCHED_CORE_CREATE, inherited across exec by its threads and children). Exit 126 when pinning "
               "or tagging fails, 127 when COMMAND cannot be run.",
               "coresched-tag-exec"};
  app.footer("usage: coresched-tag-exec [--cpu N] [--untagged] -- COMMAND [ARG...]");
  int cpu = -1;
  bool untagged = false;
  std::vector<std::string> command;
  app.add_option("--cpu", cpu, "pin to this CPU (default: leave the affinity as it is)")->check(CLI::Range(0, CPU_SETSIZE - 1));
  app.add_flag("--untagged", untagged, "only pin, without a cookie (the untagged side of a comparison)");
  app.add_option("command", command, "the command and its arguments, after --")->required();
  CLI11_PARSE(app, argc, argv);
  const bool tag = !untagged;
  if (cpu >= 0) {
    if (const std::string why = pin_self(static_cast<unsigned>(cpu)); !why.empty()) {
      std::fprintf(stderr, "coresched-tag-exec: %s\n", why.c_str());
      return 126;
    }
  }
  // The whole (one-thread) process; threads it starts later and the exec'd command inherit the cookie.
  if (tag) {
    if (const std::string why = kernel_tag(KernelTagScope::process); !why.empty()) {
      std::fprintf(stderr, "coresched-tag-exec: %s\n", why.c_str());
      return 126;
    }
  }
  std::vector<char*> args;
  for (auto& a : command) args.push_back(a.data());
  args.push_back(nullptr);
  execvp(args[0], args.data());
  std::fprintf(stderr, "coresched-tag-exec: %s: %s\n", args[0], std::strerror(errno));
  return 127;
}
