// SPDX-License-Identifier: Apache-2.0
// The state of one run of a fuzz program (Execution::Impl), shared by the
// fiber bodies and their operations (fuzz_execute.cpp) and the runner (fuzz_run.cpp).
#pragma once

#include "fuzz_program.hpp"

#include <coresched/coresched.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fuzz {

using namespace coresched;
using namespace std::chrono_literals;
using guarantees::Oracle;
using guarantees::Scope;

// ASan's redzones make frames two to three times bigger: stacks sized for the
// normal build (and inline children sharing them) would overflow there.
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kStackFactor = 4;
#else
constexpr std::size_t kStackFactor = 1;
#endif

struct Execution::Impl {
  explicit Impl(const Program& prog)
      : p(prog), recs(std::make_unique<Rec[]>(prog.fibers.size())), room(std::make_unique<SelectRoom>(prog)) {
    for (int i = 0; i < prog.mutexes; ++i) mutexes.push_back(std::make_unique<Mutex>());
    for (int u : prog.semaphore_units) sems.push_back(std::make_unique<Semaphore>(u));
  }

  // ---- bookkeeping, readable by the watchdog thread
  struct Rec {
    std::atomic<int> runs{0}, done{0}, op{-1}, line{0};
    std::atomic<std::uint64_t> cookie{0}; // what the program believes the fiber's cookie is
    std::atomic<bool> long_waiting{false};
    std::atomic<int> local{-1}; // the FiberLocal value it set last (-1: none)
  };
  // A fiber's FiberLocal value. Its destructor is the fiber's own code: it
  // must run in that fiber, under the cookie the program believes it has.
  struct LocalTag {
    Impl* ex;
    int self, value;
    ~LocalTag() {
      const std::uint64_t want = ex->recs[static_cast<std::size_t>(self)].cookie.load();
      if (this_fiber::cookie().value() != want)
        ex->fail(ex->who(self) + ": its FiberLocal value was destroyed under cookie " +
                 std::to_string(this_fiber::cookie().value()) + ", not its own " + std::to_string(want));
      ex->locals_gone.fetch_add(1);
    }
  };
  static inline FiberLocal<LocalTag> local_tag;
  std::atomic<long> locals_made{0}, locals_gone{0};
  const Program& p;
  std::unique_ptr<Rec[]> recs;
  std::unique_ptr<Oracle> oracle;
  std::vector<std::unique_ptr<Mutex>> mutexes;
  std::vector<std::unique_ptr<Semaphore>> sems;
  std::atomic<int> mutex_holder[8]{};
  std::atomic<int> sem_holders[8]{};
  std::unique_ptr<SelectRoom> room; // the channels and events select ops share (fuzz_select.cpp)
  int idle_pipe[2] = {-1, -1}; // never written: long waits read it until shutdown cancels them
  std::atomic<std::uint64_t> events{0}, failure_count{0};
  mutable std::mutex fail_mu;
  std::vector<std::string> failures;
  mutable std::mutex rt_mu; // guards `rt` for stats() against its construction
  std::optional<Topology> machine; // what the oracle watches: both runtimes' cores when there are two
  // Last, so they go first: destructors of what fibers own, run during their
  // shutdown, still use the oracle and the records above.
  std::unique_ptr<Runtime> rt, rt2; // rt2 only when the program has two runtimes

  void fail(const std::string& what) {
    if (failure_count.fetch_add(1) >= 12) return;
    std::lock_guard lk(fail_mu);
    failures.push_back(what);
  }
  std::string who(int i) const {
    const FiberSpec& f = p.fibers[static_cast<std::size_t>(i)];
    return "fiber " + std::to_string(i) + " (parent " + std::to_string(f.parent) + ", role " +
           std::to_string(static_cast<int>(f.role)) + ")";
  }
  std::uint64_t value_of(int i) const { return p.seed * 1000003u + static_cast<std::uint64_t>(i) * 7919u + 1; }

  /// s.around(f), noting where fiber `self` waits (a source line) for the watchdog's report.
  template <class F> decltype(auto) at(Scope& s, int self, int line, F&& f) {
    if (self < 0) return s.around(std::forward<F>(f));
    std::atomic<int>& where = recs[static_cast<std::size_t>(self)].line;
    where.store(line);
    struct Clear {
      std::atomic<int>& w;
      ~Clear() { w.store(0); }
    } clear{where};
    return s.around(std::forward<F>(f));
  }

  // ---- what a fiber owns: destructors that are its user code

  /// Stamps the final believed cookie of fiber `owner` (-1: the main thread,
  /// which is not a PU) for a destructor of something it owned.
  void stamp_destructor(int owner, const char* what) {
    if (owner < 0) return;
    Scope s(*oracle, Cookie::from_value(recs[static_cast<std::size_t>(owner)].cookie.load()), what);
    s.burn(3us);
  }
  class Probe { // captured by every fiber's callable
  public:
    Probe(Impl* ex, int owner) : ex_(ex), owner_(owner) {}
    Probe(Probe&& o) noexcept : ex_(std::exchange(o.ex_, nullptr)), owner_(o.owner_) {}
    Probe& operator=(Probe&&) = delete;
    ~Probe() {
      if (ex_) ex_->stamp_destructor(owner_, "capture destructor");
    }

  private:
    Impl* ex_;
    int owner_;
  };
  // Every fiber's result. One spawned detached is destroyed by the runtime and
  // belongs to that fiber; a joined one's is adopted by its joiner. One whose
  // handle is dropped or detach()ed is inert: if the fiber had finished, the
  // handle's owner destroys it, so whose cookie applies depends on timing.
  class Result {
  public:
    Result(Impl* ex, int owner, std::uint64_t v, const char* what)
        : value(v), ex_(ex), owner_(owner), what_(what) {}
    Result(Result&& o) noexcept
        : value(o.value), ex_(std::exchange(o.ex_, nullptr)), owner_(o.owner_), what_(o.what_) {}
    Result& operator=(Result&&) = delete;
    ~Result() {
      if (ex_) ex_->stamp_destructor(owner_, what_);
    }
    void adopt(int owner) noexcept {
      owner_ = owner;
      what_ = "joiner's copy of a result, destroyed";
    }
    std::uint64_t value;

  private:
    Impl* ex_;
    int owner_;
    const char* what_;
  };
  struct Pending {
    int child;
    JoinHandle<Result> h;
  };

  // ---- spawning and joining (fuzz_execute.cpp)

  JoinHandle<Result> spawn_fiber(int idx, Cookie expect, void* ctx, bool detached);
  Cookie expected_cookie(int child, const Scope* parent) const;
  void check_join(Scope* s, int self, JoinHandle<Result>& h, int child, std::uint64_t expect);
  void set_cookie(Scope& s, int self, Cookie c);
  void verify(const Scope& s, int self, const char* where);

  // ---- the fiber body and its operations (fuzz_execute.cpp)

  Result body(int self, Cookie believed, void* ctx);
  void join_front(Scope& s, int self, std::deque<Pending>& pending);
  void run_simple(Scope& s, int self, const Op& op);
  [[gnu::noinline]] void run_op(Scope& s, int self, const Op& op, std::deque<Pending>& pending);
  void holding_mutex(Scope& s, int self, const Op& op);
  void holding_unit(Scope& s, int self, const Op& op);
  [[gnu::noinline]] void timed_wait(Scope& s, int self, const Op& op);
  [[gnu::noinline]] void select_op(Scope& s, int self, const Op& op);
  [[gnu::noinline]] void channel(Scope& s, int self, const Op& op);
  [[gnu::noinline]] void pipe(Scope& s, int self, const Op& op);
  [[gnu::noinline]] void throw_catch(Scope& s, int self, const Op& op);
  std::uint64_t role_action(Scope& s, int self, void* ctx);
  void long_wait(Scope& s, int self, LongWait how);

  // ---- the runner (fuzz_run.cpp)

  Outcome run();
  std::string pending() const;
};

} // namespace fuzz
