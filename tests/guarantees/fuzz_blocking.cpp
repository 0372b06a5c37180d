// SPDX-License-Identifier: Apache-2.0
// The fuzzer's blocking_call op. The call's body is user code of the fiber's
// cookie on a helper thread that may run on any PU of the fiber's core, so it
// is stamped for that core (guarantees::CallScope) for all of its length, the
// sleep included: the core stays the cookie's until the call returns. The
// call is a switch point of the fiber and goes through Scope::around().
#include "fuzz_program.hpp"

#include <chrono>
#include <thread>

namespace fuzz {

namespace {

struct CallError { // what a call of kind call_throw throws
  std::uint64_t value;
};

// The call, from the fiber whose interval is `s`, stamped for the core it runs on now.
std::string call(guarantees::Scope& s, const Op& op, std::uint64_t value) {
  guarantees::Oracle& oracle = s.oracle();
  if (s.pu() < 0) return "a blocking call from a fiber the oracle cannot place";
  // Taken before around(): the fiber is pinned or its runtime has one core
  // (run_blocking_call), so the call runs here even if it waits for its turn.
  const unsigned core = oracle.core_of(s.pu());
  const coresched::Cookie cookie = s.cookie();
  const std::thread::id worker = std::this_thread::get_id();
  std::string wrong; // written by the call, read once it has returned
  auto body = [&]() -> std::uint64_t {
    guarantees::CallScope cs(oracle, core, cookie, "fuzz blocking call");
    if (coresched::this_fiber::in_fiber()) wrong = "the call ran in a fiber";
    else if (std::this_thread::get_id() == worker) wrong = "the call ran on its fiber's worker thread";
    cs.burn(std::chrono::microseconds(op.a));
    if (op.b) std::this_thread::sleep_for(std::chrono::microseconds(op.b));
    if (op.c == call_throw) throw CallError{value};
    if (op.c == call_nested) {
      const std::thread::id helper = std::this_thread::get_id();
      return coresched::blocking_call([&] {
        guarantees::CallScope nested(oracle, core, cookie, "fuzz nested blocking call");
        if (std::this_thread::get_id() != helper) wrong = "a nested call left its helper thread";
        nested.burn(std::chrono::microseconds(op.a / 4));
        return value;
      });
    }
    return value;
  };
  try {
    const std::uint64_t got = s.around([&] { return coresched::blocking_call(body); });
    if (op.c == call_throw) return "a call that threw returned " + std::to_string(got);
    if (got != value) return "blocking_call returned " + std::to_string(got) + ", expected " + std::to_string(value);
  } catch (const CallError& e) {
    if (op.c != call_throw || e.value != value) return "blocking_call rethrew another call's exception";
  }
  if (std::current_exception()) return "an exception is still being handled after a blocking call";
  return wrong;
}

} // namespace

std::string run_blocking_call(guarantees::Scope& s, const Op& op, std::uint64_t value, bool pinned) {
  // A call may first wait for its cookie's turn on the core, and an unpinned
  // fiber can move to another core meanwhile: its call would run on a core
  // the oracle cannot tell, and be stamped for the wrong one. On a runtime of
  // several cores such a fiber calls through a child pinned to its worker.
  if (pinned || coresched::Runtime::current()->topology().cores().size() == 1) return call(s, op, value);
  const unsigned worker = coresched::this_fiber::location().worker;
  const coresched::Cookie cookie = s.cookie();
  std::string wrong;
  auto h = s.around([&] {
    return coresched::spawn([&] {
      guarantees::Scope cs(s.oracle(), cookie, "fuzz blocking call's pinned fiber");
      wrong = call(cs, op, value);
    }, coresched::SpawnOptions{.cookie = cookie, .pin_to_pu = worker});
  });
  s.around([&] { h.join(); });
  return wrong;
}

} // namespace fuzz
