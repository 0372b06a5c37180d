// SPDX-License-Identifier: Apache-2.0
// The API-sequence fuzzer's programs. A program is generated from its seed
// alone (so a seed reproduces the same program; the interleaving differs per
// run) and is a tree of fibers, each with a list of operations over the
// public API. Operations that need a partner (a channel, an event, a pipe, a
// wait group, a latch) spawn that partner themselves and finish the exchange
// before the operation ends, and a fiber never holds a mutex or semaphore
// unit across anything but simple operations: no program can deadlock, so a
// hang is the runtime's.
#pragma once

#include "oracle.hpp"

#include <coresched/coresched.hpp>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace fuzz {

enum class OpKind : std::uint8_t {
  spawn,        // spawn `child`, then join it now / later / by dropping the handle, or detach it
  join_pending, // join the oldest child left for later
  set_cookie,   // a = cookie index
  yield,
  preempt,
  sleep,        // a = microseconds
  burn,         // a = microseconds of busy work inside the stamped interval
  mutex,        // a = mutex index; `inner` runs holding it
  semaphore,    // a = semaphore index; `inner` runs holding a unit
  channel,      // `child` is the peer; a = items, b = capacity (0: unbuffered), c = direction
  event,        // `child` is the peer; a = ping-pong rounds
  pipe,         // `child` is the peer that writes a items; this fiber reads them with io::read
  wait_group,   // `members` (detached) call done(); this fiber waits
  latch,        // `members` (joined) and this fiber arrive_and_wait
  throw_catch,  // throw, suspend in the catch block (b says how; `child` if b is catch_join), check the exception
  io_sleep,     // io::sleep_until(now + a microseconds)
  set_weight,   // Cookie::set_weight(b) on cookie index a (never the untagged one: programs share it)
  timed_wait,   // c = what (TimedWaitKind), a = mutex/semaphore index, b = microseconds; `inner` runs holding it
  fiber_local,  // gives the fiber a FiberLocal value `a` (destroying its last); checked after every op and at its end
  blocking_call, // a = microseconds burnt in the call, b = microseconds it sleeps, c = what it does (CallKind)
  select,       // a = rounds, b = microseconds, c = how each ends (SelectBound), `cases`; `child` (if any) the peer
};
/// Op::c of timed_wait: a timed lock or acquire (either outcome is right),
/// a timed wait on something never ready (must time out, never early), or a
/// wait stopped through a std::stop_token by a plain thread.
enum TimedWaitKind : int { timed_mutex, timed_semaphore, timed_event, timed_recv, stopped_event, kTimedWaitKinds };
/// Op::c of blocking_call: the call returns a value, throws, or makes a
/// nested blocking_call (which runs in place, on the helper thread).
enum CallKind : int { call_value, call_throw, call_nested, kCallKinds };
/// A case of a select op (Op::cases holds kind * 8 + index): a receive from
/// or a send on the program's shared channel `index`, its shared event
/// `index` (the peer sets it before its select: no case there), or, over
/// objects of the op's own, an event never set, an event always set, a
/// receive from and a send on a closed channel (those three are always ready).
enum SelectCaseKind : int { sc_recv, sc_send, sc_event, sc_never, sc_ready, sc_closed_recv, sc_closed_send, kSelectCaseKinds };
/// Op::c of select: each round is a select_for(b us), a select_until(now + b
/// us), a try_select, or a select with no deadline whose stop token a plain
/// thread stops b us into the op.
enum SelectBound : int { sb_for, sb_until, sb_try, sb_stop, kSelectBounds };
const char* to_string(OpKind k) noexcept;

enum class JoinMode : std::uint8_t { now, later, drop, detach_option, detach_call };
enum class Role : std::uint8_t { normal, channel_peer, event_peer, pipe_peer, group_member, latch_member, select_peer };
/// How a detached fiber ends: waiting until shutdown cancels the wait, or not.
enum class LongWait : std::uint8_t { none, sleep, io_read, io_sleep };
/// What a fiber does inside its catch block (Op::b of throw_catch).
enum CatchSuspend : int { catch_yield, catch_sleep, catch_mutex, catch_io_sleep, catch_set_cookie, catch_join, kCatchKinds };

struct Op {
  OpKind kind = OpKind::yield;
  int a = 0, b = 0, c = 0;
  int child = -1;
  JoinMode join = JoinMode::now;
  std::vector<int> members;
  std::vector<Op> inner; // simple operations only (no waits on others)
  std::vector<int> cases; // select: SelectCaseKind * 8 + the shared channel's or event's index
};

struct FiberSpec {
  int parent = -1; // -1: a root, spawned by the main thread
  Role role = Role::normal;
  JoinMode join = JoinMode::now; // how its spawner treats it
  std::optional<int> cookie; // index into Program::cookies; unset: inherit the spawner's
  std::optional<unsigned> pin;
  std::optional<std::size_t> stack;
  std::size_t stack_use = 0; // bytes of stack the body touches first
  bool throws = false;       // ends by throwing its own exception
  LongWait long_wait = LongWait::none;
  std::vector<Op> ops;
  int runtime = 0; // which of the program's runtimes it is spawned into (1 only with two)
};

struct Program {
  std::uint64_t seed = 0;
  coresched::Options options;
  std::vector<coresched::Cookie> cookies;
  std::vector<FiberSpec> fibers;
  struct Root {
    int fiber;
    bool joined; // by the main thread; else detached
  };
  std::vector<Root> roots;
  /// Background fibers that burn and yield until the program's fibers are
  /// done: they keep sibling PUs busy with other cookies, which is what a
  /// leaked cookie collides with. Not part of the checked fiber tree.
  struct Rival {
    int cookie;
    std::optional<unsigned> pin;
  };
  std::vector<Rival> rivals;
  int mutexes = 1;
  std::vector<int> semaphore_units;
  /// What select ops meet over: channels of these capacities (0:
  /// unbuffered), never closed, and events; shared by the whole program.
  std::vector<int> select_channels;
  int select_events = 1;
  /// Options::cpus of each runtime when the program has two, on cores of
  /// their own (both empty: one runtime). Fibers spawn into either, from
  /// either; pinned fibers and rivals stay in the first.
  std::string cpus[2];
  /// One line: seed, topology, options, fiber and op counts.
  std::string describe() const;
  /// Every fiber and its operations, one line each (coresched-fuzz --print).
  std::string dump() const;
};

/// Parts of the API a program may use. coresched-fuzz --without turns some
/// off, to tell which one a failing seed needs.
enum Feature : std::uint32_t {
  f_stack = 1u << 0,       // SpawnOptions::stack_size (and stack use to match)
  f_pin = 1u << 1,         // SpawnOptions::pin_to_pu
  f_throw = 1u << 2,       // fibers that end by throwing
  f_catch = 1u << 3,       // throw_catch: suspending inside a catch block
  f_long_wait = 1u << 4,   // detached fibers left waiting for shutdown
  f_rivals = 1u << 5,      // background fibers of other cookies
  f_mutex = 1u << 6,
  f_semaphore = 1u << 7,
  f_channel = 1u << 8,
  f_event = 1u << 9,
  f_pipe = 1u << 10,
  f_wait_group = 1u << 11,
  f_latch = 1u << 12,
  f_io_sleep = 1u << 13,
  f_set_cookie = 1u << 14,
  f_detach = 1u << 15,     // detached children (else joined later)
  f_join_now = 1u << 16,   // joins right after spawn, which may run the child inline (else joined later)
  f_runtimes = 1u << 17,   // a second runtime on cores of its own, fibers spawned across the two
  f_weights = 1u << 18,    // cookies created with weights, and set_weight while fibers run
  f_timed = 1u << 19,      // timed and stoppable waits
  f_fiber_local = 1u << 20, // FiberLocal values, and their destructors at the fiber's end
  f_blocking = 1u << 21,   // blocking_call: calls on helper threads, stamped for their caller's core
  f_select = 1u << 22,     // select over the program's shared channels and events, bounded by time or a stop token
};
/// Parses "stack,catch,..." into Feature bits; throws std::invalid_argument naming a bad one.
std::uint32_t parse_features(const std::string& csv);
/// The feature names, comma-separated.
std::string feature_names();

/// The program of `seed` on `topology` (with `pus` PUs), without the features in `without`.
Program generate(std::uint64_t seed, const std::string& topology, unsigned pus, std::uint32_t without = 0);

/// Runs a blocking_call op (fuzz_blocking.cpp) from the fiber whose stamped
/// interval is `s` (`pinned`: the fiber is pinned to its PU); the call
/// returns (or throws) `value`. Returns what went wrong, empty if nothing did.
std::string run_blocking_call(guarantees::Scope& s, const Op& op, std::uint64_t value, bool pinned);

/// The program's shared channels and events that its select ops meet over
/// (fuzz_select.cpp), and the ledger of the items that went through them.
class SelectRoom {
public:
  explicit SelectRoom(const Program& p);
  ~SelectRoom();
  SelectRoom(const SelectRoom&) = delete;
  SelectRoom& operator=(const SelectRoom&) = delete;
  /// Runs a select op from the fiber whose interval is `s` (`peer`: the
  /// op's peer, with the mirrored cases); `where` holds the source line
  /// (offset by kSelectLine) of the select it waits in, for the watchdog.
  /// Returns what went wrong, empty if nothing did.
  std::string run(guarantees::Scope& s, const Op& op, bool peer, std::atomic<int>& where);
  /// Once no select runs: drains the shared channels and checks that every
  /// item sent was received exactly once. Returns what went wrong.
  std::string settle();
  /// Adds how the selects ended to `out` (as Outcome::selects).
  void count(std::uint64_t (&out)[6]) const;
  /// Added to a fuzz_select.cpp line in `where`, to tell it from fuzz_execute.cpp's.
  static constexpr int kSelectLine = 100000;
  struct Impl;

private:
  std::unique_ptr<Impl> impl_;
};

/// What one run of a program found.
struct Outcome {
  std::vector<std::string> failures; // the first few, one line each
  std::uint64_t failure_count = 0;
  std::uint64_t fibers = 0, events = 0, oracle_checks = 0;
  std::uint64_t selects[6] = {}; // selects that ended by a recv, a send, an event, a timeout, a stop, nothing ready
  bool ok() const noexcept { return failure_count == 0; }
};

/// Runs a program on a Runtime of its own and checks it: no oracle overlap,
/// every fiber runs exactly once, every join returns exactly its fiber's value
/// or exception, the exception being handled is the fiber's own after a
/// suspension in a catch block, this_fiber::cookie() and location() agree with
/// what the program did, and shutdown cancels the fibers left waiting.
class Execution {
public:
  explicit Execution(const Program& p);
  ~Execution();
  Execution(const Execution&) = delete;
  Execution& operator=(const Execution&) = delete;

  Outcome run();
  /// Thread-safe, for the watchdog: the fibers not finished and where each is.
  std::string pending() const;
  /// Thread-safe, for the watchdog: the runtime's fiber dump (Runtime::dump), if it exists.
  void dump(std::FILE* out) const;
  /// Thread-safe, for the watchdog: the runtime's statistics table (if it exists).
  std::string stats() const;

  struct Impl;

private:
  std::unique_ptr<Impl> impl_;
};

} // namespace fuzz
