// SPDX-License-Identifier: Apache-2.0
// stuck: a program that hangs on purpose, to try the fiber dump and the gdb extension (tools/gdb/coresched.py) on.
//
// Fibers of two cookies (tenant A = cookie 1, tenant B = cookie 2) each park in a different wait, in a function of
// their own so that a backtrace names it:
//   hold_mutex_and_wait   (A) takes a Mutex, then waits on an Event that is never set
//   wait_for_mutex        (B) waits for that Mutex
//   wait_for_event        (B) waits on an Event that is never set
//   read_from_pipe        (A) reads a pipe nobody writes to (io read on its fd)
//   sleep_an_hour         (B) sleeps for an hour
//   join_the_reader       (A) joins the reader (join of fiber N)
//   join_inline_child     (A, pinned to PU 0) joins a child of its own cookie, which runs inline on its stack and
//                         waits on the Event (inline_child_waits)
// Once all of them are parked the main thread calls stuck_all_parked() (a place for a breakpoint), optionally
// prints Runtime::dump, then joins join_the_reader: it never returns. With --abort-after-ms N the process calls
// abort() N ms later, leaving a core file where the system keeps them (ulimit -c, kernel.core_pattern).
//
// Try it:
//   gdb -x tools/gdb/coresched.py --args ./stuck
//   (gdb) break stuck_all_parked
//   (gdb) run
//   (gdb) info fibers
//   (gdb) fiber bt stuck_ids.mutex_waiter
#include <coresched/coresched.hpp>

#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <unistd.h>

namespace cs = coresched;

// The ids of the fibers, for a debugger: `fiber bt stuck_ids.mutex_waiter`. Written before stuck_all_parked().
extern "C" {
struct stuck_fiber_ids {
  std::uint64_t mutex_holder, mutex_waiter, event_waiter, reader, sleeper, joiner, inline_parent;
};
stuck_fiber_ids stuck_ids{};

// Called once every fiber is parked: break here.
[[gnu::noinline]] void stuck_all_parked() { asm volatile("" ::: "memory"); }
}

namespace {

constexpr auto tenant_a = cs::Cookie::from_value(1);
constexpr auto tenant_b = cs::Cookie::from_value(2);

// Each is noinline and not a tail call, so that its frame stays on the fiber's stack while it waits.
[[gnu::noinline]] void hold_mutex_and_wait(cs::Mutex& m, cs::Event& never) {
  m.lock();
  never.wait();
  m.unlock();
  asm volatile("" ::: "memory");
}

[[gnu::noinline]] void wait_for_mutex(cs::Mutex& m) {
  while (m.try_lock()) { // until the holder has it
    m.unlock();
    cs::this_fiber::yield();
  }
  m.lock();
  m.unlock();
  asm volatile("" ::: "memory");
}

// Each waiting function leaves a mark of its own on its frame: without it the compiler may fold functions with the
// same code into one (GCC's identical code folding), and a backtrace would name the other.
[[gnu::noinline]] void wait_for_event(cs::Event& never) {
  [[maybe_unused]] volatile int mark = 1;
  never.wait();
  asm volatile("" ::: "memory");
}

[[gnu::noinline]] long read_from_pipe(int fd) {
  std::byte b[1];
  const long n = cs::io::read(fd, b).value;
  asm volatile("" ::: "memory");
  return n;
}

[[gnu::noinline]] void sleep_an_hour() {
  cs::this_fiber::sleep_for(std::chrono::hours(1));
  asm volatile("" ::: "memory");
}

[[gnu::noinline]] void join_the_reader(cs::JoinHandle<long>& reader, const std::atomic<bool>& reader_started) {
  // A reader that has not started yet would run inline, on this stack (same cookie): then nobody would be
  // parked in "join". So wait until it runs on its own.
  while (!reader_started.load()) cs::this_fiber::yield();
  reader.join();
  asm volatile("" ::: "memory");
}

[[gnu::noinline]] void inline_child_waits(cs::Event& never) {
  [[maybe_unused]] volatile int mark = 2;
  never.wait();
  asm volatile("" ::: "memory");
}

[[gnu::noinline]] void join_inline_child(cs::Event& never) {
  // Same cookie, pinned to the same PU (so no other worker starts it first): the join runs it inline.
  auto child = cs::spawn([&never] { inline_child_waits(never); }, cs::SpawnOptions{.pin_to_pu = 0});
  child.join();
  asm volatile("" ::: "memory");
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

std::string dump_text(const cs::Runtime& rt) {
  char* buf = nullptr;
  std::size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  if (!f) return {};
  rt.dump(f);
  std::fclose(f);
  std::string s(buf, len);
  std::free(buf);
  return s;
}

} // namespace

int main(int argc, char** argv) {
  long abort_after_ms = -1;
  bool dump = false;
  CLI::App app{"stuck: starts fibers of two cookies that park in a join, a Mutex, an Event, an io read on a pipe "
               "and a sleep, then hangs forever (or aborts), for trying the fiber dump and the gdb extension "
               "(tools/gdb/coresched.py). Break on stuck_all_parked to stop once every fiber is parked."};
  app.add_option("--abort-after-ms", abort_after_ms,
                 "Call abort() this many ms after every fiber is parked (a core file, where ulimit -c allows)")
      ->check(CLI::Range(0L, 86'400'000L));
  app.add_flag("--dump", dump, "Print Runtime::dump to stderr once every fiber is parked");
  CLI11_PARSE(app, argc, argv);

  int fds[2];
  if (::pipe(fds) != 0) {
    std::perror("pipe");
    return 1;
  }
  std::optional<cs::Runtime> runtime; // CORESCHED_TOPOLOGY chooses a synthetic topology if set
  try {
    runtime.emplace();
  } catch (const std::exception& e) { // a bad setting is a message, not a terminate
    std::fprintf(stderr, "stuck: %s\n", e.what());
    return 1;
  }
  cs::Runtime& rt = *runtime;
  cs::Mutex m;
  cs::Event never;

  auto holder = rt.spawn([&] { hold_mutex_and_wait(m, never); }, cs::SpawnOptions{.cookie = tenant_a});
  auto mutex_waiter = rt.spawn([&] { wait_for_mutex(m); }, cs::SpawnOptions{.cookie = tenant_b});
  auto event_waiter = rt.spawn([&] { wait_for_event(never); }, cs::SpawnOptions{.cookie = tenant_b});
  std::atomic<bool> reader_started{false};
  auto reader = rt.spawn([&] {
      reader_started.store(true);
      return read_from_pipe(fds[0]);
    }, cs::SpawnOptions{.cookie = tenant_a});
  auto sleeper = rt.spawn([] { sleep_an_hour(); }, cs::SpawnOptions{.cookie = tenant_b});
  auto joiner = rt.spawn([&] { join_the_reader(reader, reader_started); }, cs::SpawnOptions{.cookie = tenant_a});

  // Waits (bounded) until the dump shows `fibers` parked, and the waits of the first six; false after 10 s.
  const std::string want_join = "join of fiber " + std::to_string(reader.id());
  const std::string want_read = "io read on fd " + std::to_string(fds[0]);
  std::string d;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto parked_in_dump = [&](std::size_t fibers) {
    while (std::chrono::steady_clock::now() < give_up) {
      d = dump_text(rt);
      std::size_t parked = 0;
      for (std::size_t at = 0; (at = d.find(" parked, ", at)) != std::string::npos; ++at) ++parked;
      if (parked >= fibers && has(d, want_join) && has(d, want_read) && has(d, "Mutex at 0x") && has(d, "sleep, "))
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  };
  // The inline parent starts once the others wait: a join is a preemption point, and with a fiber of cookie B
  // still queued on its core the parent would park in a plain join instead of running its child inline.
  bool ready = parked_in_dump(6);
  auto inline_parent =
      rt.spawn([&] { join_inline_child(never); }, cs::SpawnOptions{.cookie = tenant_a, .pin_to_pu = 0});
  stuck_ids = {holder.id(), mutex_waiter.id(), event_waiter.id(), reader.id(), sleeper.id(), joiner.id(),
               inline_parent.id()};
  ready = ready && parked_in_dump(7);
  if (!ready) {
    std::fprintf(stderr, "stuck: the fibers did not all park within 10 s; last dump:\n%s", d.c_str());
    std::fflush(stderr);
    std::_Exit(1); // the fibers never finish: destroying their handles would wait for them forever
  }
  std::printf("stuck: pid %d, fibers parked: holder %llu (cookie 1), mutex waiter %llu (cookie 2), event waiter "
              "%llu (cookie 2), reader %llu (cookie 1, fd %d), sleeper %llu (cookie 2), joiner %llu (cookie 1), "
              "inline parent %llu (cookie 1)\n",
              static_cast<int>(::getpid()), static_cast<unsigned long long>(stuck_ids.mutex_holder),
              static_cast<unsigned long long>(stuck_ids.mutex_waiter),
              static_cast<unsigned long long>(stuck_ids.event_waiter),
              static_cast<unsigned long long>(stuck_ids.reader), fds[0],
              static_cast<unsigned long long>(stuck_ids.sleeper), static_cast<unsigned long long>(stuck_ids.joiner),
              static_cast<unsigned long long>(stuck_ids.inline_parent));
  std::fflush(stdout);
  stuck_all_parked();
  if (dump) rt.dump(stderr);
  if (abort_after_ms >= 0) {
    std::thread([abort_after_ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(abort_after_ms));
      std::fputs("stuck: aborting, as --abort-after-ms asked\n", stderr);
      std::abort();
    }).detach();
  }
  joiner.join(); // never returns: the reader waits for a byte nobody writes
  return 1;
}
