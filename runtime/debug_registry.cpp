// SPDX-License-Identifier: Apache-2.0
#include "debug_registry.hpp"

#include "log.hpp"
#include "scheduler.hpp"

#include <coresched/join_handle.hpp>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>

coresched_debug_runtime* coresched_debug_runtimes = nullptr; // extern "C": declared so in the header

namespace coresched::detail {

namespace {

std::mutex registry_mu;

// The dump signal. A signal handler may do almost nothing: it writes the
// signal number to a pipe (write(2) is async-signal-safe) and a thread that
// waits on the pipe writes the dumps, outside any signal context, for every
// runtime that asked for that signal.
int pipe_fds[2] = {-1, -1};
bool installed[NSIG] = {};

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(pipe_fds[1], &b, 1); // full pipe: that dump is dropped
  errno = saved;
}

void dump_thread() {
  for (;;) {
    unsigned char sig = 0;
    const ssize_t n = ::read(pipe_fds[0], &sig, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n != 1) return;
    std::lock_guard lk(registry_mu);
    for (auto* e = coresched_debug_runtimes; e; e = e->next)
      if (e->dump_signal == sig) e->scheduler->dump(stderr);
  }
}

// Under registry_mu.
void install(int sig) {
  if (installed[sig]) return;
  if (pipe_fds[0] < 0) {
    if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      log().error("dump signal: pipe2 failed ({}); no dumps on signal {}", std::strerror(errno), sig);
      return;
    }
    ::fcntl(pipe_fds[0], F_SETFL, 0); // the reader blocks; the handler's end stays non-blocking
    std::thread(dump_thread).detach(); // lives as long as the process: a signal may come at any time
  }
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (sigaction(sig, &sa, nullptr) != 0) {
    log().error("dump signal: sigaction({}) failed: {}", sig, std::strerror(errno));
    return;
  }
  installed[sig] = true;
}

int parse_signal(const std::string& text) {
  if (text.empty()) return 0;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (end && *end == '\0') return errno == ERANGE || v < 0 || v >= NSIG ? -1 : static_cast<int>(v); // 2^32 + 10 was 10
  std::string name = text.rfind("SIG", 0) == 0 ? text.substr(3) : text;
  for (int s = 1; s < NSIG; ++s)
    if (const char* abbrev = sigabbrev_np(s); abbrev && name == abbrev) return s;
  return -1;
}

} // namespace

int resolve_dump_signal(int option) {
  int sig = option;
  std::string from = "Options::dump_signal";
  if (sig == 0) {
    const char* env = std::getenv("CORESCHED_DUMP_SIGNAL");
    if (!env || !*env) return 0;
    sig = parse_signal(env);
    from = std::string("CORESCHED_DUMP_SIGNAL=") + env;
  }
  // Between the last standard signal and SIGRTMIN, glibc keeps signals for
  // itself (threads' cancellation and setxid): sigaction refuses them.
  if (sig <= 0 || sig >= NSIG || sig == SIGKILL || sig == SIGSTOP || (sig > SIGSYS && sig < SIGRTMIN))
    throw UsageError("coresched: " + from + " is not a signal that can be caught (use e.g. SIGUSR2)");
  // A fault's handler must stay the fault's: taken for dumps, SIGSEGV lost
  // the stack overflow report (the program died of a plain SIGSEGV), and a
  // real fault would return into the faulting instruction.
  if (sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE)
    throw UsageError("coresched: " + from + " is a fault signal; use a signal sent on purpose (e.g. SIGUSR2)");
  return sig;
}

void register_runtime(coresched_debug_runtime* entry) {
  std::lock_guard lk(registry_mu);
  if (entry->dump_signal) install(entry->dump_signal);
  entry->next = coresched_debug_runtimes;
  coresched_debug_runtimes = entry;
}

void unregister_runtime(coresched_debug_runtime* entry) {
  std::lock_guard lk(registry_mu);
  for (auto** p = &coresched_debug_runtimes; *p; p = &(*p)->next)
    if (*p == entry) {
      *p = entry->next;
      break;
    }
}

} // namespace coresched::detail
