// SPDX-License-Identifier: Apache-2.0
// coresched-stack-depth-bench: how many bytes of a fiber's stack common
// operations write, the floor under any stack size a runtime could hand out.
//
// A parked fiber holds at least one page of memory: the top page of its
// stack, where its frames are. Go parks a goroutine in less (2 KiB stacks
// that grow); a fiber's stack cannot grow, so a stack below a page (two
// fibers' frames sharing one) would have to hold, without a guard page,
// whatever the fiber or the process ever runs on it. This measures that
// from inside a fiber on one worker (`core:1 pu:1`): each operation runs
// below a painted stretch of the stack, and the lowest byte it changed gives
// its depth, less that of an empty call. A lower bound: the unpainted gap
// below the measuring frame hides a few dozen bytes, and a frame that
// reserves a buffer it never fills reads shallower than its stack pointer
// went.
//
// Operations: the first call of a function bound lazily (the dynamic
// linker's resolver runs on the caller's stack; none with LD_BIND_NOW=1 or
// a binary linked with -z now), the same call once bound, a signal handled
// on the running stack (a handler installed without SA_ONSTACK: the kernel
// writes the signal frame there, up to AT_MINSIGSTKSZ bytes), a C++ throw
// and catch, an snprintf of a double, and the runtime's own suspensions:
// a yield, a park on an Event, a sleep, and an io::recv that finds its data
// waiting and one that parks for it.
#include <coresched/coresched.hpp>
#include <coresched/io.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <elf.h>
#include <link.h>
#include <stdexcept>
#include <string>
#include <sys/auxv.h>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

namespace {
using namespace coresched;
using namespace std::chrono_literals;

// Bytes painted below the measuring frame: more than any operation here
// takes, less than the fiber's 64 KiB stack.
constexpr std::size_t kPaint = 24 * 1024;
// Left unpainted just below the measuring frame: where the painter's frame
// (a leaf: its return address) and run()'s return address go.
constexpr std::size_t kGap = 64;
constexpr unsigned char kMark = 0xa5;

// An address just below the caller's stack pointer: this frame's own.
[[gnu::noinline]] unsigned char* below_caller() {
  return static_cast<unsigned char*>(__builtin_frame_address(0));
}

[[gnu::noinline]] void paint(unsigned char* from, std::size_t n) {
  volatile unsigned char* p = from;
  for (std::size_t i = 0; i < n; ++i) p[i] = kMark;
}

// Out of line, so that the operation's own locals are below the paint's top
// rather than in depth_of's frame.
template <class Op> [[gnu::noinline]] void run(Op& op) { op(); }

// Bytes below depth_of's stack pointer that `op` wrote.
template <class Op> [[gnu::noinline]] std::size_t depth_of(Op& op) {
  unsigned char* const top = below_caller();
  unsigned char* const low = top - kPaint;
  paint(low, kPaint - kGap);
  run(op);
  const volatile unsigned char* seen = low; // read back what the operation left
  std::size_t i = 0;
  while (i < kPaint - kGap && seen[i] == kMark) ++i;
  return kPaint - i;
}

volatile int sink;
void on_signal(int) { sink = 1; }

// Whether the executable itself was linked to bind every symbol at load.
bool binary_binds_now() {
  bool now = false;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
          const auto* d = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
          for (; d->d_tag != DT_NULL; ++d)
            if ((d->d_tag == DT_FLAGS && (d->d_un.d_val & DF_BIND_NOW)) ||
                (d->d_tag == DT_FLAGS_1 && (d->d_un.d_val & DF_1_NOW)))
              *static_cast<bool*>(out) = true;
        }
        return 1; // the executable is listed first
      },
      &now);
  return now;
}

struct Row {
  const char* name;
  std::size_t first, again; // its first run, and a second one
};

std::vector<Row> measure(Runtime& rt) {
  std::vector<Row> rows;
  rt.spawn([&] {
      auto add = [&](const char* name, auto op) {
        const std::size_t first = depth_of(op);
        rows.push_back({name, first, depth_of(op)});
      };
      auto nothing = [] { asm volatile(""); };
      const std::size_t base = depth_of(nothing);
      const char* volatile a = "1.10";
      const char* volatile b = "1.9";
      // strverscmp: called nowhere else in this program, so its first call
      // goes through the resolver unless binding was done at load.
      add("a call to a libc function", [&] { sink = strverscmp(a, b); });
      // SIGUSR2's handler for the measurement only (it may be the runtime's
      // dump signal): without SA_ONSTACK, so it runs on the fiber's stack.
      struct sigaction sa {}, before {};
      sa.sa_handler = on_signal;
      sigemptyset(&sa.sa_mask);
      if (sigaction(SIGUSR2, &sa, &before) != 0) throw std::runtime_error("sigaction(SIGUSR2) failed");
      add("a signal handled on this stack", [] { raise(SIGUSR2); });
      sigaction(SIGUSR2, &before, nullptr);
      add("throw and catch", [] {
        try {
          throw std::runtime_error("probe");
        } catch (const std::exception& e) {
          sink = static_cast<int>(std::strlen(e.what()));
        }
      });
      add("snprintf of a double", [] {
        char buf[64];
        sink = std::snprintf(buf, sizeof buf, "%.3f", 2.0 / 3.0);
      });
      std::atomic<bool> stop{false};
      auto partner = spawn([&] {
        while (!stop.load(std::memory_order_relaxed)) this_fiber::yield();
      });
      add("this_fiber::yield to another fiber", [] { this_fiber::yield(); });
      stop = true;
      partner.join();
      add("Event::wait, set by another fiber", [] {
        Event e;
        auto setter = spawn([&] { e.set(); });
        e.wait();
        setter.join();
      });
      add("this_fiber::sleep_for(100us)", [] { this_fiber::sleep_for(100us); });
      int sv[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) throw std::runtime_error("socketpair failed");
      add("io::recv, data waiting", [&] {
        std::byte msg[16]{};
        (void)io::send(sv[1], msg);
        (void)io::recv(sv[0], msg);
      });
      add("io::recv, parks for its data", [&] {
        std::byte msg[16]{};
        auto sender = spawn([&] {
          this_fiber::sleep_for(1ms);
          (void)io::send(sv[1], msg);
        });
        (void)io::recv(sv[0], msg);
        sender.join();
      });
      ::close(sv[0]);
      ::close(sv[1]);
      for (Row& r : rows) {
        r.first = r.first > base ? r.first - base : 0;
        r.again = r.again > base ? r.again - base : 0;
      }
    }).join();
  return rows;
}

std::string json_escape(const char* s) {
  std::string out;
  for (; *s; ++s) {
    if (*s == '"' || *s == '\\') out += '\\';
    out += *s;
  }
  return out;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"coresched-stack-depth-bench: bytes of a fiber's stack that common operations write (the floor under "
               "a stack smaller than a page)"};
  std::string json;
  app.add_option("--json", json, "also write the figures to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    Options o;
    o.topology = "core:1 pu:1";
    Runtime rt(o);
    const std::vector<Row> rows = measure(rt);
    // A signal frame and a parked sleep always write below the caller: if
    // the paint saw neither, it measured nothing.
    for (const Row& r : rows)
      if (r.again == 0 && (std::strstr(r.name, "signal") || std::strstr(r.name, "sleep_for"))) {
        std::fprintf(stderr, "coresched-stack-depth-bench: \"%s\" wrote nothing below its caller: the probe is broken\n",
                     r.name);
        return 2;
      }
    const char* bind_env = std::getenv("LD_BIND_NOW");
    const bool eager = (bind_env && *bind_env) || binary_binds_now();
    const unsigned long min_sig = getauxval(AT_MINSIGSTKSZ);
    std::printf("# one worker (core:1 pu:1); bytes written below the caller's frame, an empty call's subtracted\n");
    std::printf("# symbols bound %s; AT_MINSIGSTKSZ (a signal frame's room) %lu bytes; page %ld bytes\n",
                eager ? "at load (LD_BIND_NOW or -z now)" : "lazily, at first call", min_sig, sysconf(_SC_PAGESIZE));
    std::printf("%-40s %8s %8s\n", "operation", "first", "again");
    for (const Row& r : rows) std::printf("%-40s %8zu %8zu\n", r.name, r.first, r.again);
    if (!json.empty()) {
      FILE* f = std::fopen(json.c_str(), "w");
      if (!f) {
        std::fprintf(stderr, "coresched-stack-depth-bench: cannot write %s\n", json.c_str());
        return 1;
      }
      std::fprintf(f, "{\"bound_at_load\": %s, \"at_minsigstksz\": %lu, \"page\": %ld, \"operations\": [",
                   eager ? "true" : "false", min_sig, sysconf(_SC_PAGESIZE));
      for (std::size_t i = 0; i < rows.size(); ++i)
        std::fprintf(f, "%s{\"operation\": \"%s\", \"first\": %zu, \"again\": %zu}", i ? ", " : "",
                     json_escape(rows[i].name).c_str(), rows[i].first, rows[i].again);
      std::fputs("]}\n", f);
      std::fclose(f);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coresched-stack-depth-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
