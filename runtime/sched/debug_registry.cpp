// SPDX-License-Identifier: Apache-2.0
#include "sched/debug_registry.hpp"

#include "platform/cookie_registry.hpp"
#include "core/core_coordinator.hpp"
#include "fiber/fiber.hpp"
#include "platform/log.hpp"
#include "sched/scheduler.hpp"
#include "fiber/stack_header.hpp"

#include <coresched/join_handle.hpp>

#include <cerrno>
#include <cstddef>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <unistd.h>
#include <utility>

coresched_debug_runtime* coresched_debug_runtimes = nullptr; // extern "C": declared so in the header

namespace coresched::detail {
namespace {

// Each enum's names, every enumerator listed (-Wswitch says when one is not);
// the compiler gives the values.
constexpr const char* name_of(FiberState s) {
  switch (s) {
  case FiberState::runnable: return "runnable";
  case FiberState::running: return "running";
  case FiberState::parking: return "parking";
  case FiberState::parked: return "parked";
  case FiberState::done: return "done";
  }
  return nullptr;
}

constexpr const char* name_of(WaitKind k) {
  switch (k) {
  case WaitKind::none: return "none";
  case WaitKind::join: return "join";
  case WaitKind::sync: return "sync";
  case WaitKind::io: return "io";
  case WaitKind::sleep: return "sleep";
  }
  return nullptr;
}

// Writes `text` and its NUL at `at`; a name that does not fit stops the build.
template <std::size_t N> constexpr void put(char (&out)[N], std::size_t& at, const char* text) {
  for (; *text; ++text) {
    if (at + 1 >= N) throw "coresched_debug_layout: a name does not fit its field";
    out[at++] = *text;
  }
  out[at++] = '\0';
}

// The names of the values 0, 1, ... up to the first that has none.
template <class Enum, std::size_t N> constexpr void put_names(char (&out)[N]) {
  std::size_t at = 0;
  for (unsigned v = 0; v <= 0xff; ++v) {
    const char* name = name_of(static_cast<Enum>(v));
    if (!name) break;
    put(out, at, name);
  }
  put(out, at, "");
}

constexpr coresched_debug_field field(const char* name, std::size_t offset, std::size_t size, bool is_signed) {
  coresched_debug_field f{};
  std::size_t at = 0;
  put(f.name, at, name);
  f.offset = static_cast<std::uint32_t>(offset);
  f.size = static_cast<std::uint16_t>(size);
  f.is_signed = is_signed;
  return f;
}

#define CORESCHED_FIELD(key, Record, member)                                                                  \
  field(key, offsetof(Record, member), sizeof(std::declval<Record&>().member),                                \
        std::is_signed_v<std::remove_cv_t<decltype(std::declval<Record&>().member)>>)

constexpr coresched_debug_layout_table make_layout() {
  coresched_debug_layout_table t{};
  const char magic[] = "coresched-layout";
  static_assert(sizeof magic - 1 == sizeof t.magic);
  for (std::size_t i = 0; i < sizeof t.magic; ++i) t.magic[i] = magic[i];
  t.format = 1;
  const coresched_debug_field fields[] = {
      CORESCHED_FIELD("rt.next", coresched_debug_runtime, next),
      CORESCHED_FIELD("rt.scheduler", coresched_debug_runtime, scheduler),
      CORESCHED_FIELD("rt.stacks", coresched_debug_runtime, stacks),
      CORESCHED_FIELD("rt.dump_signal", coresched_debug_runtime, dump_signal),
      CORESCHED_FIELD("sh.next", StackHeader, next),
      CORESCHED_FIELD("sh.running", StackHeader, running),
      CORESCHED_FIELD("sh.wait", StackHeader, wait),
      CORESCHED_FIELD("wi.kind", WaitInfo, kind),
      CORESCHED_FIELD("wi.what", WaitInfo, what),
      CORESCHED_FIELD("wi.object", WaitInfo, object),
      CORESCHED_FIELD("wi.arg", WaitInfo, arg),
      CORESCHED_FIELD("wi.since_ns", WaitInfo, since_ns),
      CORESCHED_FIELD("wi.frame", WaitInfo, frame),
      CORESCHED_FIELD("f.id", Fiber, id),
      CORESCHED_FIELD("f.cookie", Fiber, cookie),
      CORESCHED_FIELD("f.pinned", Fiber, pinned),
      CORESCHED_FIELD("f.last_worker", Fiber, last_worker),
      CORESCHED_FIELD("f.context", Fiber, context),
      CORESCHED_FIELD("f.stack.base", Fiber, stack.base),
      CORESCHED_FIELD("f.stack.size", Fiber, stack.size),
      CORESCHED_FIELD("f.context_saved", Fiber, context_saved),
      CORESCHED_FIELD("f.state", Fiber, state),
      CORESCHED_FIELD("f.inline_child", Fiber, inline_child),
  };
  static_assert(std::size(fields) <= std::size(t.fields));
  for (const coresched_debug_field& f : fields) t.fields[t.field_count++] = f;
  put_names<FiberState>(t.fiber_states);
  put_names<WaitKind>(t.wait_kinds);
  t.no_cookie = kNoCookie;
  t.not_pinned = kNotPinned;
  return t;
}

#undef CORESCHED_FIELD

// Format 1 of the table, as tools/gdb/coresched_gdb_snapshot.py reads it: a
// change here is a new format number there and here.
static_assert(offsetof(coresched_debug_layout_table, format) == 16 &&
              offsetof(coresched_debug_layout_table, field_count) == 20 &&
              offsetof(coresched_debug_layout_table, fiber_states) == 24 &&
              offsetof(coresched_debug_layout_table, wait_kinds) == 88 &&
              offsetof(coresched_debug_layout_table, no_cookie) == 152 &&
              offsetof(coresched_debug_layout_table, not_pinned) == 160 &&
              offsetof(coresched_debug_layout_table, fields) == 168 && sizeof(coresched_debug_field) == 32 &&
              offsetof(coresched_debug_field, offset) == 24 && offsetof(coresched_debug_field, size) == 28 &&
              offsetof(coresched_debug_field, is_signed) == 30 && sizeof(coresched_debug_layout_table) == 1192);

} // namespace
} // namespace coresched::detail

// Kept by the compiler and the linker (--gc-sections) although nothing in the
// program reads it (only debuggers do; the header exports it).
#if __has_attribute(retain)
#define CORESCHED_KEEP __attribute__((used, retain))
#else
#define CORESCHED_KEEP __attribute__((used))
#endif
CORESCHED_KEEP constinit const coresched_debug_layout_table coresched_debug_layout = coresched::detail::make_layout();

CORESCHED_KEEP const char* coresched_cookie_name(std::uint64_t cookie) noexcept {
  return coresched::detail::cookie_name(cookie);
}
#undef CORESCHED_KEEP

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
  if (end && *end == '\0') return errno == ERANGE || v < 0 || v >= NSIG ? -1 : static_cast<int>(v); // checked before the cast: 2^32 + 10 is not 10
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
  // A fault's handler must stay the fault's: taken for dumps, SIGSEGV would
  // lose the stack overflow report (the program would die of a plain SIGSEGV), and a
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
