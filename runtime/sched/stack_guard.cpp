// SPDX-License-Identifier: Apache-2.0
#include "sched/stack_guard.hpp"

#include "fiber/stack_pool.hpp"
#include "sched/worker.hpp"

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <sanitizer/asan_interface.h>
#include <utility>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

namespace coresched::detail {

namespace {

struct sigaction previous_segv, previous_bus;

// Only async-signal-safe calls from here on: write(2), no allocation, no stdio.
class SignalText {
public:
  SignalText& operator<<(const char* s) {
    while (*s && len_ < sizeof(buf_)) buf_[len_++] = *s++;
    return *this;
  }
  SignalText& operator<<(std::uint64_t v) {
    char digits[20];
    int n = 0;
    do {
      digits[n++] = static_cast<char>('0' + v % 10);
    } while ((v /= 10) != 0);
    while (n > 0 && len_ < sizeof(buf_)) buf_[len_++] = digits[--n];
    return *this;
  }
  void write_stderr() const {
    for (std::size_t done = 0; done < len_;) {
      const ssize_t n = ::write(STDERR_FILENO, buf_ + done, len_ - done);
      if (n <= 0) return;
      done += static_cast<std::size_t>(n);
    }
  }

private:
  char buf_[256];
  std::size_t len_ = 0;
};

// A fault belongs to the running fiber's overflow if it hit the guard page,
// or if the stack pointer itself has left the stack (a frame larger than the
// guard page can jump over it).
bool is_overflow(const Fiber& f, std::uintptr_t addr, std::uintptr_t sp) {
  if (!f.stack) return false;
  const auto base = reinterpret_cast<std::uintptr_t>(f.stack.base);
  const std::uintptr_t guard = base - page_size();
  return (addr >= guard && addr < base) || (sp < base && base - sp < (std::uintptr_t{1} << 20));
}

void pass_on(int sig, siginfo_t* info, void* uctx, const struct sigaction& prev) {
  if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction) {
    prev.sa_sigaction(sig, info, uctx);
    return;
  }
  if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  // Default action: restore it; returning re-executes the faulting access.
  signal(sig, SIG_DFL);
}

void on_fault(int sig, siginfo_t* info, void* uctx) {
  const Worker* w = tls_worker; // initial-exec TLS: safe in a handler
  const Fiber* f = w ? w->running() : nullptr;
  const auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
  const auto sp = static_cast<std::uintptr_t>(static_cast<ucontext_t*>(uctx)->uc_mcontext.gregs[REG_RSP]);
  if (f && f->is_task && is_overflow(*f, addr, sp)) {
    SignalText text;
    // The size it asked for, and what was mapped (twice that, or its inline
    // joiner's stack: mapped_stack_bytes).
    text << "coresched: fiber " << f->id << " (cookie " << f->cookie << ") overflowed its "
         << static_cast<std::uint64_t>(f->stack_size / 1024) << " KiB stack ("
         << static_cast<std::uint64_t>(f->stack.size / 1024) << " KiB mapped) on worker "
         << static_cast<std::uint64_t>(w->index()) << "; give it more with SpawnOptions::stack_size\n";
    text.write_stderr();
    std::abort();
  }
  pass_on(sig, info, uctx, sig == SIGSEGV ? previous_segv : previous_bus);
}

} // namespace

// Called by every runtime at start: a handler installed since (a test
// framework's, say) may have replaced ours, and is then chained behind it.
void install_overflow_handler() {
  static std::mutex mu;
  const std::lock_guard lk(mu);
  for (auto [sig, previous] : {std::pair{SIGSEGV, &previous_segv}, std::pair{SIGBUS, &previous_bus}}) {
    struct sigaction current {};
    sigaction(sig, nullptr, &current);
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == &on_fault) continue;
    struct sigaction sa {};
    sa.sa_sigaction = &on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, previous);
  }
}

AltSignalStack::AltSignalStack() {
  size_ = std::max<std::size_t>(static_cast<std::size_t>(sysconf(_SC_SIGSTKSZ)), 64 * 1024);
  mem_ = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem_ == MAP_FAILED) {
    mem_ = nullptr; // no report on overflow, but the fault still kills the process
    return;
  }
  stack_t ss{};
  ss.ss_sp = mem_;
  ss.ss_size = size_;
  sigaltstack(&ss, nullptr);
}

AltSignalStack::~AltSignalStack() {
  if (!mem_) return;
  stack_t ss{};
  ss.ss_flags = SS_DISABLE;
  sigaltstack(&ss, nullptr);
  ASAN_UNPOISON_MEMORY_REGION(mem_, size_); // as for fiber stacks: no stale redzones for the next mmap
  munmap(mem_, size_);
}

} // namespace coresched::detail
