// SPDX-License-Identifier: Apache-2.0
// coresched-deny-io-uring: runs a command the way Docker's default seccomp profile does for io_uring: a seccomp
// filter makes io_uring_setup, io_uring_enter and io_uring_register fail with EPERM, and allows every other
// system call. The filter is inherited across exec by the command, its threads and its children, so a program run
// under it sees the kernel of a default container (where io_uring_setup returns EPERM) without one.
//
//   coresched-deny-io-uring [--] COMMAND [ARG...]
//
// Exit status: the command's; 2 for a bad command line, 125 when the filter cannot be installed, 126 when COMMAND
// cannot be executed, 127 when it is not found.
#include <seccomp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string_view>
#include <unistd.h>
#include <utility>

namespace {

constexpr const char* program = "coresched-deny-io-uring";

void usage(std::FILE* to) {
  std::fprintf(to,
               "Usage: %s [--] COMMAND [ARG...]\n"
               "Runs COMMAND with io_uring denied as Docker's default seccomp profile denies it: io_uring_setup,\n"
               "io_uring_enter and io_uring_register fail with EPERM; every other system call is allowed. The\n"
               "filter holds for COMMAND, its threads and its children.\n"
               "Exit status: COMMAND's; 2 for a bad command line, 125 when the filter cannot be installed, 126 when\n"
               "COMMAND cannot be executed, 127 when it is not found.\n",
               program);
}

/// Installs the filter on this (single-threaded) process; returns an error message, or nullptr.
const char* deny_io_uring(int& err) {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) {
    err = ENOMEM;
    return "seccomp_init";
  }
  const char* failed = nullptr;
  // The ERRNO action, not KILL: a program must be able to see the refusal and fall back, as in a container.
  for (const auto& [name, nr] : {std::pair{"io_uring_setup", SCMP_SYS(io_uring_setup)},
                                 std::pair{"io_uring_enter", SCMP_SYS(io_uring_enter)},
                                 std::pair{"io_uring_register", SCMP_SYS(io_uring_register)}}) {
    if (const int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0); rc < 0) {
      err = -rc;
      failed = name;
      break;
    }
  }
  // libseccomp sets no_new_privs first (its default), which an unprivileged process needs to load a filter.
  if (!failed)
    if (const int rc = seccomp_load(ctx); rc < 0) {
      err = -rc;
      failed = "seccomp_load";
    }
  seccomp_release(ctx);
  return failed;
}

} // namespace

int main(int argc, char** argv) {
  int first = 1;
  if (first < argc) {
    const std::string_view a = argv[first];
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    }
    if (a == "--")
      ++first;
    else if (a.size() > 1 && a[0] == '-') {
      std::fprintf(stderr, "%s: unknown option %s (the command goes after --)\n", program, argv[first]);
      usage(stderr);
      return 2;
    }
  }
  if (first >= argc) {
    std::fprintf(stderr, "%s: no command given\n", program);
    usage(stderr);
    return 2;
  }
  int err = 0;
  if (const char* failed = deny_io_uring(err)) {
    std::fprintf(stderr, "%s: cannot install the seccomp filter: %s: %s\n", program, failed, std::strerror(err));
    return 125;
  }
  execvp(argv[first], argv + first);
  err = errno;
  std::fprintf(stderr, "%s: cannot run %s: %s\n", program, argv[first], std::strerror(err));
  return err == ENOENT ? 127 : 126;
}
