// SPDX-License-Identifier: Apache-2.0
// Runtime::dump: every live fiber and every core, for a program that is stuck
// or slow now. It must work when the runtime does not: it takes no lock for
// long (a core lock for at most a millisecond, then it reports the core
// unread), never waits on a worker, and reads what the workers publish
// without synchronising with them, so a figure may be a moment stale.
//
// Where the fibers are found (stack_header.hpp): a started fiber owns a
// stack, and every mapped stack is listed; its header names the fiber on it.
// A fiber that never ran is in a run queue. The list of stacks is locked only
// to copy the headers: a worker mapping a stack for a fiber's first run waits
// for that lock, and if a dump symbolized and wrote under it each such worker
// would wait for a whole dump (a thread dumping every 0.5 ms would stretch a
// runtime's shutdown to seconds, and cause false stall reports).
#include "platform/cookie_registry.hpp"
#include "core/core_coordinator.hpp"
#include "sched/scheduler.hpp"
#include "sched/worker.hpp"

#include <cxxabi.h>
#include <elfutils/libdwfl.h>
#include <fmt/format.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace coresched::detail {

namespace {

const char* state_name(FiberState s) {
  switch (s) {
  case FiberState::runnable: return "runnable";
  case FiberState::running: return "running";
  case FiberState::parking: return "parking";
  case FiberState::parked: return "parked";
  case FiberState::done: return "finishing";
  }
  return "?";
}

// The label ("7 (premium)") of a cookie the dump read, "none" for kNoCookie. A
// value copied from a retiring fiber may be garbage: the lookup then finds no
// name and prints the number.
std::string cookie_text(std::uint64_t c) { return c == kNoCookie ? std::string("none") : cookie_label(c); }

std::string duration(std::uint64_t ns) {
  if (ns >= 10'000'000'000ULL) return fmt::format("{:.1f} s", static_cast<double>(ns) / 1e9);
  if (ns >= 1'000'000ULL) return fmt::format("{:.1f} ms", static_cast<double>(ns) / 1e6);
  return fmt::format("{:.0f} us", static_cast<double>(ns) / 1e3);
}

// Fiber records are reached through pointers other threads publish (a
// worker's running fiber, a stack's owner, an inline child), and the fiber
// may retire meanwhile: its record goes back to a cache, or to malloc, which
// may give the memory back to the system. So a record is never loaded from
// directly. It is copied with process_vm_readv on this very process, a system
// call that answers EFAULT for memory no longer mapped instead of faulting,
// and that no sanitizer checks (ASan aborts on a plain read of a recycled
// record). Where the call is refused (a seccomp filter), plain unchecked
// loads.
__attribute__((no_sanitize_thread, no_sanitize_address)) bool peek_bytes(void* to, const void* from,
                                                                        std::size_t n) noexcept {
  iovec local{to, n}, remote{const_cast<void*>(from), n};
  // getpid() each time, not kept: after a fork the child must read itself.
  const ssize_t got = ::process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
  if (got == static_cast<ssize_t>(n)) return true;
  if (got < 0 && (errno == EPERM || errno == ENOSYS)) {
    auto* d = static_cast<volatile unsigned char*>(to);
    const auto* p = static_cast<const volatile unsigned char*>(from);
    for (std::size_t i = 0; i < n; ++i) d[i] = p[i];
    return true;
  }
  return false;
}

template <class T> bool peek(T& to, const void* from) noexcept { return peek_bytes(&to, from, sizeof(T)); }

// Whether a peek fails rather than faults on memory that is not mapped: then
// a stack may be read after the list's lock is let go (an unmapped one reads
// as nothing). Plain loads, the fallback, must read under the lock.
bool peeks_are_checked() noexcept {
  static const bool checked = [] {
    long from = 1, to = 0;
    iovec local{&to, sizeof to}, remote{&from, sizeof from};
    return ::process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof to);
  }();
  return checked;
}

// What the dump shows of a fiber, copied out of its record field by field
// (each a moment's value; the fiber may be elsewhere by the next).
struct FiberFacts {
  bool ok = false; // false: the record could not be read
  std::uint64_t id = 0, cookie = 0;
  FiberState state = FiberState::runnable;
  unsigned last_worker = 0;
  int pinned = kNotPinned;
  const void* context = nullptr;
  const char* stack_base = nullptr;
  bool context_saved = false;
  bool is_task = false; // false: a worker's idle context
  const Fiber* inline_child = nullptr;
};

FiberFacts read_fiber(const Fiber* f) noexcept {
  static_assert(sizeof(std::atomic<FiberState>) == sizeof(FiberState) && sizeof(std::atomic<bool>) == sizeof(bool));
  FiberFacts r;
  void* base = nullptr;
  // Bools as bytes: a recycled record may hold any byte there, and loading
  // one that is neither 0 nor 1 as a bool is undefined (UBSan aborts).
  // (FiberState has a fixed underlying type: every byte is a value of it.)
  unsigned char saved = 0, task = 0;
  r.ok = f && peek(r.id, &f->id) && peek(r.cookie, &f->cookie) && peek(r.state, &f->state) &&
         peek(r.last_worker, &f->last_worker) && peek(r.pinned, &f->pinned) && peek(r.context, &f->context) &&
         peek(base, &f->stack.base) && peek(saved, &f->context_saved) && peek(task, &f->is_task) &&
         peek(r.inline_child, &f->inline_child);
  r.stack_base = static_cast<const char*>(base);
  r.context_saved = saved != 0;
  r.is_task = task != 0;
  return r;
}

__attribute__((no_sanitize_thread)) std::string describe_wait(const WaitInfo& w, std::uint64_t now) {
  const std::string name = w.what ? w.what : "?";
  switch (w.kind) {
  case WaitKind::join: return fmt::format("join of fiber {}", w.arg);
  case WaitKind::sync: return fmt::format("{} at {}", name, w.object);
  case WaitKind::io: return w.arg >= 0 ? fmt::format("io {} on fd {}", name, w.arg) : fmt::format("io {}", name);
  case WaitKind::sleep: {
    const auto deadline = static_cast<std::uint64_t>(w.arg);
    return deadline > now ? fmt::format("sleep, {} left", duration(deadline - now))
                          : fmt::format("sleep, due {} ago", duration(now - deadline));
  }
  case WaitKind::none: break;
  }
  return "nothing recorded";
}

// Names code addresses with elfutils (the symbol tables of the executable and
// every library, static functions included) and the line tables where there
// is debug information.
class Symbolizer {
public:
  Symbolizer() {
    static char* debuginfo_path = nullptr;
    static const Dwfl_Callbacks callbacks = {dwfl_linux_proc_find_elf, dwfl_standard_find_debuginfo, nullptr,
                                             &debuginfo_path};
    dwfl_ = dwfl_begin(&callbacks);
  }
  ~Symbolizer() {
    if (dwfl_) dwfl_end(dwfl_);
  }
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  // Reads the process's modules (again: libraries come and go); a module
  // still mapped where it was keeps the tables already loaded for it.
  void report() {
    ok_ = false;
    if (!dwfl_) return;
    dwfl_report_begin(dwfl_);
    ok_ = dwfl_linux_proc_report(dwfl_, getpid()) == 0 && dwfl_report_end(dwfl_, nullptr, nullptr) == 0;
  }

  // `ret` is a return address: the call is the instruction before it.
  std::string name(std::uintptr_t ret) {
    const Dwarf_Addr pc = ret - 1;
    Dwfl_Module* m = ok_ ? dwfl_addrmodule(dwfl_, pc) : nullptr;
    if (!m) return "?";
    std::string out;
    if (const char* sym = dwfl_module_addrname(m, pc)) {
      int status = 0;
      std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(sym, nullptr, nullptr, &status), std::free);
      out = status == 0 && d ? d.get() : sym;
    } else {
      Dwarf_Addr start = 0;
      const char* mod = dwfl_module_info(m, nullptr, &start, nullptr, nullptr, nullptr, nullptr, nullptr);
      out = fmt::format("{}+{:#x}", mod ? mod : "?", pc - start);
    }
    if (Dwfl_Line* line = dwfl_module_getsrc(m, pc)) {
      int lineno = 0;
      if (const char* file = dwfl_lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr)) {
        const char* base = std::strrchr(file, '/');
        out += fmt::format(" at {}:{}", base ? base + 1 : file, lineno);
      }
    }
    if (out.size() > 160) out = out.substr(0, 157) + "...";
    return out;
  }

private:
  Dwfl* dwfl_ = nullptr;
  bool ok_ = false;
};

// The process's dumps share one symbolizer, taking turns (libdw is not
// thread-safe). Made afresh for each dump, it would read the ELF files and
// line tables again every time: tens of ms of a CPU for a program with debug
// information, and mapping and unmapping those files would take the
// address-space lock that a worker mapping a fiber's stack waits for. Never destroyed: a
// dump may run while the process exits.
struct SharedSymbolizer {
  std::mutex mu;
  Symbolizer sym;
  const pid_t pid = getpid();
};

SharedSymbolizer& shared_symbolizer() {
  static auto* s = new SharedSymbolizer;
  return *s;
}

// One word of another fiber's stack, by peek like the records: the bounds
// come from the fiber's record (its stack base) and from registers its code
// left, and a record recycled meanwhile gives a stale base (a null one
// crashes a walk by plain loads). 0 if unreadable, which
// ends the walk.
std::uintptr_t word(const char* at) noexcept {
  std::uintptr_t w = 0;
  return peek(w, at) ? w : 0;
}

// Whether [p, p + n) lies in [lo, hi), p 8-aligned. In integers: p may be
// any value a register held (rbp in code without frame pointers), and
// p + n on a pointer near the top of the address space wraps to a small
// one that passes "p + 16 > hi" (a SIGSEGV on rbp = -8).
bool within(const char* p, std::size_t n, const char* lo, const char* hi) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(p), l = reinterpret_cast<std::uintptr_t>(lo),
             h = reinterpret_cast<std::uintptr_t>(hi);
  return a != 0 && a % 8 == 0 && a >= l && h >= n && a <= h - n;
}

// The return addresses of a switched-out fiber, by frame pointer, never
// leaving [lo, hi) (its stack): code built without frame pointers makes the
// walk skip frames or end early, never read outside the stack. A parked
// fiber's walk starts at Worker::park's frame (`frame`: [frame] is the
// caller's rbp, [frame+8] the return address into it); otherwise at the
// saved context, where Boost.Context's jump_fcontext leaves rbp at +0x30 and
// its return address at +0x38 (x86-64 System V). Empty: no saved frame.
__attribute__((no_sanitize_thread, no_sanitize_address)) std::vector<std::uintptr_t>
collect_frames(const void* context, const void* frame, const char* lo, const char* hi) {
  std::vector<std::uintptr_t> pcs;
  const auto* start = static_cast<const char*>(frame ? frame : context);
  const std::size_t need = frame ? 16 : 0x40;
  if (!within(start, need, lo, hi)) return pcs;
  std::uintptr_t ip = frame ? word(start + 8) : word(start + 0x38);
  auto fp = reinterpret_cast<const char*>(frame ? word(start) : word(start + 0x30));
  const char* floor = start;
  while (pcs.size() < 32 && ip) {
    pcs.push_back(ip);
    // Callers' frames lie above (the stack grows down): stop at anything else.
    if (!within(fp, 16, floor, hi)) break;
    ip = word(fp + 8);
    floor = fp + 16;
    fp = reinterpret_cast<const char*>(word(fp));
  }
  return pcs;
}

// One stack's header as the walk copied it, under the list's lock.
struct HeaderCopy {
  const StackHeader* header;
  const Fiber* owner;
  WaitInfo wait;
};

// What the dump prints of one started fiber: the chain on its stack (the
// innermost last; those before it join it inline), its wait, its frames.
struct StackFacts {
  std::vector<FiberFacts> chain;
  WaitInfo wait;
  std::vector<std::uintptr_t> frames;
  std::vector<std::string> names; // of `frames`
  bool walked = false; // switched out with its context saved: `frames` were looked for
};

// Reads the fibers on one stack and their frames. All by peek: the records
// may be recycled, and the stack unmapped, while this runs.
StackFacts read_stack(const HeaderCopy& h) {
  StackFacts s;
  s.wait = h.wait;
  s.chain.push_back(read_fiber(h.owner));
  while (s.chain.size() < 256 && s.chain.back().ok && s.chain.back().inline_child)
    s.chain.push_back(read_fiber(s.chain.back().inline_child));
  const FiberFacts& f = s.chain.back();
  const bool parked = f.state == FiberState::parked || f.state == FiberState::parking;
  if (f.ok && f.state != FiberState::running && f.context_saved) {
    s.walked = true;
    s.frames = collect_frames(f.context, parked ? s.wait.frame : nullptr, f.stack_base,
                              reinterpret_cast<const char*>(h.header));
  }
  return s;
}

} // namespace

// Reads fibers and stack headers that other threads write without
// synchronising with this reader, by design: TSan is told not to look.
__attribute__((no_sanitize_thread)) void Scheduler::dump(std::FILE* out) {
  const std::uint64_t now = now_ns();
  std::fprintf(out, "=== coresched fiber dump (pid %d): %zu cores, %zu workers, %llu live fibers%s ===\n",
               static_cast<int>(getpid()), cores_.size(), workers_.size(),
               static_cast<unsigned long long>(live_fibers()), stopping() ? ", shutting down" : "");

  std::vector<Worker::View> views;
  for (auto& w : workers_) views.push_back(w->view());

  for (auto& core : cores_) {
    const CoreSnapshot snap = core->snapshot(1000);
    std::string pus;
    for (unsigned s = 0; s < core->size(); ++s) pus += fmt::format("{}{}", s ? "," : "", core->sibling(s).worker);
    std::fprintf(out, "core %u (workers %s):", core->index(), pus.c_str());
    if (!snap.locked) std::fputs(" [core lock busy for 1 ms: queues not read]", out);
    else if (core->single_pu()) std::fputs(" single PU", out);
    else if (snap.owner == kNoCookie) std::fputs(" no owner (the whole core idles)", out);
    else
      std::fprintf(out, " owner cookie %s for %s", cookie_text(snap.owner).c_str(),
                   duration(now - std::min(now, snap.owner_since_ns)).c_str());
    std::fputc('\n', out);
    if (!core->single_pu() && !snap.cookies.empty()) {
      std::string books;
      for (const auto& e : snap.cookies)
        if (e.runnable || e.cookie == snap.owner)
          books += fmt::format(" [cookie {}: {} queued, vruntime {}, waited {}]", cookie_text(e.cookie), e.runnable,
                               duration(e.vruntime), e.waited < 0 ? "-" + duration(static_cast<std::uint64_t>(-e.waited))
                                                                  : duration(static_cast<std::uint64_t>(e.waited)));
      if (!books.empty()) std::fprintf(out, "  books:%s\n", books.c_str());
    }
    for (unsigned s = 0; s < core->size(); ++s) {
      const unsigned wi = core->sibling(s).worker;
      const Worker::View& v = views[wi];
      const auto& pu = snap.pus[s];
      std::string what;
      const FiberFacts r = read_fiber(v.running);
      if (r.ok && r.is_task) what = fmt::format("runs fiber {} (cookie {})", r.id, cookie_text(r.cookie));
      else if (!r.ok && v.running) what = "runs a fiber that has just ended";
      else if (v.forced)
        what = fmt::format("forced idle for {}, wants cookie {}, core held by cookie {}",
                           duration(now - std::min(now, v.forced_since_ns)), cookie_text(v.forced_wanted),
                           cookie_text(v.forced_blocker));
      else
        what = v.idle ? "idle" : "between fibers";
      if (snap.locked && pu.sleeping) what += ", asleep";
      if (pu.preempt) what += ", asked to preempt";
      if (v.local_queue) what += ", fibers on its private queue";
      std::fprintf(out, "  worker %u (cpu %u): publishes cookie %s; %s; %zu queued\n", wi,
                   workers_[wi]->pu().cpu, cookie_text(pu.running).c_str(), what.c_str(), pu.queue);
    }
    for (const auto& q : snap.queued)
      std::fprintf(out, "    queued on worker %u: fiber %llu cookie %s%s%s\n", core->sibling(q.sibling).worker,
                   static_cast<unsigned long long>(q.id), cookie_text(q.cookie).c_str(),
                   q.pinned != kNotPinned ? fmt::format(", pinned to PU {}", q.pinned).c_str() : "",
                   q.fresh ? ", never ran" : "");
    if (snap.queued_total > snap.queued.size())
      std::fprintf(out, "    ... and %zu more queued\n", snap.queued_total - snap.queued.size());
  }

  // Under the list's lock only the headers are copied (plain loads: a
  // listed stack stays mapped), and, where peeks could fault, the fibers
  // and frames too; symbolizing and writing come after it.
  std::vector<HeaderCopy> headers;
  std::vector<StackFacts> stacks;
  const bool checked = peeks_are_checked();
  const bool listed = shared_stacks_.for_each_stack(
      [&](const StackHeader& h) __attribute__((no_sanitize_thread)) {
        // Plain loads into locals here, where TSan is told not to look.
        const Fiber* owner = h.running.load(std::memory_order_acquire);
        if (!owner) return; // pooled
        const HeaderCopy copy{&h, owner, {h.wait.kind, h.wait.what, h.wait.object, h.wait.arg, h.wait.since_ns,
                                          h.wait.frame}};
        if (checked) headers.push_back(copy);
        else stacks.push_back(read_stack(copy));
      },
      100);
  for (const HeaderCopy& h : headers) stacks.push_back(read_stack(h));

  // Frames are named before anything is written: a dump writing to a pipe
  // nobody reads must not keep the other dumps from the symbolizer. A forked
  // child's dumps do not share the parent's: another thread of the parent
  // may have held its lock at the fork.
  {
    SharedSymbolizer& shared = shared_symbolizer();
    std::unique_lock<std::mutex> sym_lock;
    std::unique_ptr<Symbolizer> own;
    if (shared.pid == getpid()) sym_lock = std::unique_lock(shared.mu);
    else own = std::make_unique<Symbolizer>();
    Symbolizer& sym = own ? *own : shared.sym;
    sym.report();
    for (StackFacts& s : stacks)
      for (const std::uintptr_t pc : s.frames) s.names.push_back(sym.name(pc));
  }

  std::size_t started = 0;
  for (const StackFacts& s : stacks) {
    const FiberFacts& f = s.chain.back();
    started += s.chain.size();
    if (!f.ok) {
      std::fputs("fiber (ended while this dump read it)\n", out);
      continue;
    }
    const FiberState st = f.state;
    const bool parked = st == FiberState::parked || st == FiberState::parking;
    const std::uint64_t since = s.wait.since_ns > now ? now : s.wait.since_ns;
    std::string line = fmt::format("fiber {} cookie {} {}", f.id, cookie_text(f.cookie), state_name(st));
    if (st == FiberState::running) line += fmt::format(" on worker {}", f.last_worker);
    else line += fmt::format(", last on worker {}", f.last_worker);
    if (f.pinned != kNotPinned) line += fmt::format(", pinned to PU {}", f.pinned);
    // A fiber parks before it records its wait: until then there is no wait to time.
    if (parked && s.wait.since_ns == 0) line += ", its wait not yet recorded";
    else if (parked) line += fmt::format(", waiting {} for {}", duration(now - since), describe_wait(s.wait, now));
    std::fprintf(out, "%s\n", line.c_str());
    for (auto p = s.chain.rbegin() + 1; p != s.chain.rend(); ++p)
      std::fprintf(out, "    below it on the same stack: fiber %llu cookie %s, joining it inline\n",
                   static_cast<unsigned long long>(p->id), cookie_text(p->cookie).c_str());
    if (s.walked && s.frames.empty()) std::fputs("      (no saved frame on its stack)\n", out);
    for (std::size_t depth = 0; depth < s.frames.size(); ++depth)
      std::fprintf(out, "      #%-2zu %#014lx %s\n", depth, static_cast<unsigned long>(s.frames[depth]),
                   s.names[depth].c_str());
  }
  if (!listed) std::fputs("[the list of stacks stayed locked for 100 ms: started fibers not listed]\n", out);
  else std::fprintf(out, "=== %zu started fibers listed ===\n", started);
  std::fflush(out);
}

} // namespace coresched::detail
