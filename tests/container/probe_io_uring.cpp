// SPDX-License-Identifier: Apache-2.0
// probe_io_uring: says how this process's kernel answers the three io_uring system calls, the way a program
// inside a container would meet them. One line each:
//   io_uring_queue_init: ok | <error name> (<message>)
//   io_uring_enter: <error name> (<message>)      (on fd -1: EBADF where allowed)
//   io_uring_register: <error name> (<message>)   (on fd -1: EBADF or EINVAL where allowed)
// Exit status: 0 when all three are denied with EPERM (as under Docker's default seccomp profile), 1 otherwise.
#include <liburing.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

const char* errno_name(int e) {
  switch (e) {
  case 0: return "ok";
  case EPERM: return "EPERM";
  case EBADF: return "EBADF";
  case ENOSYS: return "ENOSYS";
  case EINVAL: return "EINVAL";
  case ENOMEM: return "ENOMEM";
  case EFAULT: return "EFAULT";
  default: return "another error";
  }
}

int report(const char* call, int e) {
  if (e == 0)
    std::printf("%s: ok\n", call);
  else
    std::printf("%s: %s (%s)\n", call, errno_name(e), std::strerror(e));
  return e;
}

} // namespace

int main() {
  io_uring ring;
  const int init = -io_uring_queue_init(8, &ring, 0); // liburing returns -errno
  if (init == 0) io_uring_queue_exit(&ring);
  report("io_uring_queue_init", init);
  // Raw calls on a bad descriptor: the kernel answers EBADF (EINVAL), a seccomp filter answers first.
  const int enter = syscall(__NR_io_uring_enter, -1, 0, 0, 0, nullptr, 0) < 0 ? errno : 0;
  report("io_uring_enter", enter);
  const int reg = syscall(__NR_io_uring_register, -1, 0, nullptr, 0) < 0 ? errno : 0;
  report("io_uring_register", reg);
  return init == EPERM && enter == EPERM && reg == EPERM ? 0 : 1;
}
