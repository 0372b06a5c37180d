// SPDX-License-Identifier: Apache-2.0
#include "sched/scheduler.hpp"

#include "platform/cookie_registry.hpp"
#include "platform/kernel_cookie.hpp"
#include "platform/log.hpp"
#include "sched/stack_guard.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <thread>

namespace coresched::detail {

namespace {
std::atomic<std::uint64_t> next_fiber_id{1};

std::size_t round_to_pages(std::size_t n) {
  const std::size_t ps = page_size();
  return (n + ps - 1) / ps * ps;
}

// A stack size as asked (Options or SpawnOptions), checked and in whole pages.
std::size_t checked_stack_size(std::size_t asked, const char* what) {
  if (asked == 0) throw UsageError(std::string("coresched: ") + what + " must not be zero");
  if (asked > kMaxStackBytes)
    throw UsageError(std::string("coresched: ") + what + " of " + std::to_string(asked) +
                     " bytes is more than the largest stack a fiber may ask for (1 GiB)");
  return round_to_pages(asked);
}
} // namespace

Scheduler::Scheduler(Options options, Runtime* owner)
    : options_(std::move(options)), owner_(owner), topology_(Topology::discover(options_.topology, options_.cpus)),
      claim_(topology_, topology_.spec()),
      shared_stacks_(mapped_stack_bytes(round_to_pages(std::clamp<std::size_t>(options_.stack_size, 1, kMaxStackBytes)))),
      blocking_pool_(std::max<unsigned>(4, static_cast<unsigned>(topology_.pus().size()))) {
  if (options_.shutdown_report_after.count() < 0 || options_.shutdown_report_after > std::chrono::hours(24))
    throw UsageError("coresched: Options::shutdown_report_after must be 0 (no report) to 24 hours");
  set_logger(options_.logger);
  set_log_level(options_.log_level);
  install_overflow_handler();
  default_stack_ = checked_stack_size(options_.stack_size, "Options::stack_size");
  shared_stacks_.keep_reserve();
  if (options_.slice.count() <= 0) throw UsageError("coresched: Options::slice must be positive");
  if (options_.stall_threshold.count() < 0)
    throw UsageError("coresched: Options::stall_threshold must not be negative (zero disables stall reports)");
  // Both become nanoseconds and are added to clock readings: microseconds::max()
  // overflowed there, and a slice meant as "never" ticked every 90 us.
  constexpr auto kDay = std::chrono::hours(24);
  if (options_.slice > kDay) throw UsageError("coresched: Options::slice must be at most 24 hours");
  if (options_.stall_threshold > kDay)
    throw UsageError("coresched: Options::stall_threshold must be at most 24 hours (zero disables stall reports)");
  stall_ns_ = static_cast<std::uint64_t>(std::chrono::nanoseconds(options_.stall_threshold).count());
  handover_spin_ = options_.handover_spin;
  if (const char* env = std::getenv("CORESCHED_HANDOVER_SPIN")) handover_spin_ = handover_spin_ || std::string(env) == "1";
  if (const char* env = std::getenv("CORESCHED_WAKE_AFFINE")) {
    const std::string v(env);
    if (v != "0" && v != "1") throw UsageError("coresched: CORESCHED_WAKE_AFFINE must be 0 or 1, not '" + v + "'");
    options_.wake_affine = options_.wake_affine && v == "1"; // options() tells what is in force
  }
  wake_affine_ = options_.wake_affine;
  io_choice_ = choose_io_backend(options_.io_backend);
  options_.io_backend = io_choice_.backend; // options() tells what is in force
  slice_ns_ = static_cast<std::uint64_t>(std::chrono::nanoseconds(options_.slice).count());
  options_.topology = topology_.spec();
  trace_ = Trace::from_options(options_.trace_path, topology_.pus().size());
  const CoreConfig cfg{options_.policy,
                       static_cast<std::uint64_t>(std::chrono::nanoseconds(options_.slice).count()) / 2};
  for (const auto& c : topology_.cores())
    if (c.pus.size() > kMaxPusPerCore)
      throw TopologyError("coresched: core " + std::to_string(c.index) + " of topology \"" + topology_.spec() +
                          "\" has " + std::to_string(c.pus.size()) + " PUs; at most " +
                          std::to_string(kMaxPusPerCore) + " per core are supported (a core's wake list has "
                          "a fixed size; SMT-8 is the widest shipping core); Options::cpus can leave PUs out");
  for (const auto& c : topology_.cores()) cores_.push_back(std::make_unique<CoreCoordinator>(c.index, c.pus, cfg));
  for (const auto& pu : topology_.pus()) {
    const auto& sibs = topology_.cores()[pu.core].pus;
    const auto pos = static_cast<unsigned>(std::find(sibs.begin(), sibs.end(), pu.index) - sibs.begin());
    workers_.push_back(std::make_unique<Worker>(*this, pu, *cores_[pu.core], pos, shared_stacks_, spawn_records()));
  }
  std::vector<CoreCoordinator*> core_ptrs;
  for (auto& c : cores_) core_ptrs.push_back(c.get());
  placement_ = std::make_unique<PlacementIndex>(topology_, std::move(core_ptrs));
  // Steal order: other cores of the same LLC first, then the rest, nearest index first.
  for (const auto& pu : topology_.pus()) {
    std::vector<unsigned> order;
    for (const auto& c : topology_.cores())
      if (c.index != pu.core) order.push_back(c.index);
    std::stable_sort(order.begin(), order.end(), [&](unsigned a, unsigned b) {
      const bool la = topology_.cores()[a].llc == pu.llc, lb = topology_.cores()[b].llc == pu.llc;
      if (la != lb) return la;
      const auto da = a > pu.core ? a - pu.core : pu.core - a, db = b > pu.core ? b - pu.core : pu.core - b;
      return da < db;
    });
    steal_order_.push_back(std::move(order));
  }
  ticker_ = std::make_unique<Ticker>(std::chrono::nanoseconds(options_.slice) / 4, [this](unsigned units) { return tick(units); });
  if (options_.kernel_cookie) maybe_kernel_cookie();
  const int dump_signal = resolve_dump_signal(options_.dump_signal);
  log().info("{}", topology_.describe());
  start_workers();
  debug_ = {nullptr, this, shared_stacks_.stack_list(), dump_signal};
  register_runtime(&debug_);
}

void Scheduler::start_workers() {
  for (auto& w : workers_) w->start();
  std::string error;
  for (auto& w : workers_) {
    const std::string e = w->wait_ready();
    if (!e.empty() && error.empty()) error = e;
  }
  if (error.empty()) return;
  // A worker could not start (its io_uring, say): stop the others and report.
  exiting_.store(true, std::memory_order_release);
  wake_all_workers();
  for (auto& w : workers_) w->join();
  ticker_->stop();
  throw std::runtime_error(error);
}

Scheduler::~Scheduler() { shutdown(); }

void Scheduler::maybe_kernel_cookie() {
  std::string why;
  if (tag_threads_with_kernel_cookie(why)) log().info("kernel core-scheduling cookie set on the runtime's threads");
  else log().warn("kernel core scheduling unavailable ({}); continuing without it", why);
}

// ---------------------------------------------------------------- spawning

void check_cookie(std::uint64_t value) {
  if (value == kNoCookie)
    throw UsageError("coresched: cookie value 18446744073709551615 (UINT64_MAX) is reserved for \"no cookie\"; "
                     "use Cookie::create()");
}

Task* Scheduler::spawn(const SpawnOptions& opts, std::size_t size, std::size_t align,
                       void (*construct)(void*, void*), void* arg) {
  const std::size_t stack_size = opts.stack_size ? checked_stack_size(*opts.stack_size, "a fiber's stack size") : default_stack_;
  if (opts.cookie) check_cookie(opts.cookie->value());
  if (opts.pin_to_pu && *opts.pin_to_pu >= workers_.size())
    throw UsageError("coresched: pin_to_pu " + std::to_string(*opts.pin_to_pu) + " is out of range (" +
                     std::to_string(workers_.size()) + " PUs)");
  if (align > kTaskAlign)
    throw UsageError("coresched: callables aligned beyond alignof(std::max_align_t) are not supported");
  Worker* here = Worker::current();
  const bool mine = here && &here->scheduler() == this;
  const bool local = mine && here->in_task();
  // Once shutdown has begun every spawn is refused, from this runtime's fibers
  // too: a fiber spawning in a loop (its sleeps end at once while the runtime
  // stops) would otherwise keep shutdown waiting for ever. A fiber of this
  // runtime cannot race the flag: shutdown waits for it, and its spawn counts
  // before it retires. Anyone else is counted *before* the check (both
  // seq_cst, against shutdown's store-then-count): either the spawn sees
  // `stopping` and is refused, or shutdown sees the count and waits for the
  // fiber. Checking first and counting after let a spawn slip between the
  // two: its fiber never ran.
  if (local && stopping_.load(std::memory_order_acquire)) throw UsageError("coresched: spawn after shutdown began");
  if (!local) {
    external_spawned_.fetch_add(1, std::memory_order_seq_cst);
    if (stopping_.load(std::memory_order_seq_cst)) {
      external_spawned_.fetch_sub(1, std::memory_order_relaxed);
      throw UsageError("coresched: spawn after shutdown began");
    }
  }
  struct Uncount { // a spawn that throws below was never a fiber
    std::atomic<std::uint64_t>* n;
    ~Uncount() { if (n) n->fetch_sub(1, std::memory_order_relaxed); }
  } uncount{local ? nullptr : &external_spawned_};
  // Everything computed first, so that each field of the two records below is
  // written once (a call between two stores keeps the first).
  const std::uint64_t id = mine ? here->new_fiber_id() : new_fiber_ids(1);
  // Unset: the spawning fiber's cookie, whichever runtime that fiber belongs to
  // (a tenant's fiber spawning into another runtime must not drop its tag),
  // or the cookie of the blocking call that spawns it (untagged, its child
  // could never run beside the call's hold: a call that joined it hung).
  const std::uint64_t cookie = !opts.cookie && !here ? plain_thread_cookie()
                               : opts.cookie          ? opts.cookie->value()
                               : here->in_task()      ? here->running()->cookie
                                                      : 0;
  // Two blocks: the scheduling record, freed when the fiber retires, and the
  // join record with the task, which a handle keeps (join_record.hpp says why).
  void* fmem = mine ? here->records().get() : spawn_records().take_one();
  const bool recyclable = kTaskOffset + size <= kRecordBytes;
  void* jmem = nullptr;
  try {
    jmem = !recyclable ? ::operator new(kTaskOffset + size) : mine ? here->records().get() : spawn_records().take_one();
  } catch (...) {
    free_record(fmem, true);
    throw;
  }
  auto* j = new (jmem) JoinRecord(static_cast<Fiber*>(fmem), id, opts.detached, recyclable);
  try {
    construct(static_cast<char*>(jmem) + kTaskOffset, arg);
  } catch (...) {
    j->~JoinRecord();
    free_record(jmem, recyclable);
    free_record(fmem, true);
    throw;
  }
  uncount.n = nullptr;
  auto* f = new (fmem) Fiber;
  f->join = j;
  f->owner = this;
  f->id = id;
  f->cookie = cookie;
  f->stack_size = stack_size;
  f->pinned = opts.pin_to_pu ? static_cast<int>(*opts.pin_to_pu) : kNotPinned;
  Task* t = opts.detached ? nullptr : j->task();
  if (local) here->count_spawned();
  if (f->pinned != kNotPinned && !(local && here->index() == static_cast<unsigned>(f->pinned))) {
    f->last_worker = static_cast<unsigned>(f->pinned);
    enqueue_on(f->last_worker, f, Arrival::spawned);
  } else if (local) {
    // Spawned by a fiber: queue locally (cache-warm); a backlog wakes a helper to steal.
    f->last_worker = here->index();
    const bool on_ring = here->enqueue_spawned(f);
    if (here->core().queued_hint() > 1) wake_helper(*here, on_ring ? Help::spawned : Help::queued);
  } else {
    f->last_worker = next_external_.fetch_add(1, std::memory_order_relaxed) % static_cast<unsigned>(workers_.size());
    place(f, Arrival::spawned);
  }
  return t;
}

void Scheduler::enqueue_on(unsigned w, Fiber* f, Arrival why) {
  Worker& target = *workers_[w];
  WakeList wakes;
  target.core().lock().lock();
  const bool needs_tick = target.core().enqueue_locked(target.sibling_index(), f, wakes, why);
  target.core().lock().unlock();
  wakes.notify();
  if (needs_tick) want_fine_ticks();
}

void Scheduler::place(Fiber* f, Arrival why) {
  if (why == Arrival::woken) {
    if (Worker* here = affine_worker(*f)) return place_affine(*here, f);
    if (Worker* here = Worker::current(); here && here->collecting_early()) why = Arrival::collected;
  }
  const unsigned to = f->pinned != kNotPinned ? static_cast<unsigned>(f->pinned) : choose_worker(*f, f->last_worker);
  if (trace_) [[unlikely]]
    trace_wakeup(*f, to);
  enqueue_on(to, f, why);
}

// Wake-affine placement (Go's runnext): a fiber woken by a running fiber of
// its own cookie, on a worker with nothing else queued, waits there to run
// next. The waker usually blocks at once (a reply, a hand-off down a pipeline,
// a join), and the woken fiber then starts on a warm CPU within a microsecond
// instead of after a cross-CPU wake-up (10-90 us to a sleeping vCPU here).
// Same cookie only: it must not bring a cookie the core is not running.
// Queued fibers there, or a pinned fiber: the usual placement below.
Worker* Scheduler::affine_worker(const Fiber& f) const noexcept {
  if (!wake_affine_ || f.pinned != kNotPinned) return nullptr; // (Options::wake_affine)
  Worker* here = Worker::current();
  if (!here || &here->scheduler() != this) return nullptr; // woken from a plain thread
  const Fiber* waker = here->running();
  if (!waker || !waker->is_task || waker->cookie != f.cookie || here->waking_for_runtime() || !here->nothing_queued())
    return nullptr;
  return here;
}

void Scheduler::place_affine(Worker& here, Fiber* f) {
  if (trace_) [[unlikely]]
    here.trace_wakeup(*f, here.index());
  CoreCoordinator& c = here.core();
  WakeList wakes;
  c.lock().lock();
  (void)c.enqueue_locked(here.sibling_index(), f, wakes, Arrival::woken); // same cookie as the waker's: no turn to end
  c.note_affine_locked();
  c.lock().unlock();
  const bool sibling_takes_it = !wakes.empty(); // a sleeping sibling of this core can run it now
  wakes.notify();
  if (sibling_takes_it) return;
  // A worker elsewhere is idle: should the waker run on instead of blocking,
  // it stops at its next preemption point and an idle worker is woken then
  // (Worker::note_affine_wake). One that reaches none: the slice tick's
  // backlog rule (tick()).
  if (idle_hint()) {
    here.note_affine_wake();
    here.sibling().ask_preempt();
  }
}

void Scheduler::trace_wakeup(const Fiber& f, unsigned to) noexcept {
  Worker* here = Worker::current();
  if (here && &here->scheduler() == this) here->trace_wakeup(f, to); // wakes from plain threads are not traced
}

// ---------------------------------------------------------------- placement

unsigned Scheduler::choose_worker(const Fiber& f, unsigned prev) const {
  if (f.pinned != kNotPinned) return static_cast<unsigned>(f.pinned);
  // The index finds only idle workers: with none (a busy server, whose I/O
  // completions each come here), skip its search of the masks.
  if (idle_hint()) {
    const unsigned w = placement_->choose(f.cookie, prev, options_.placement);
    if (w != PlacementIndex::kNone) return w;
  }
  // Busy everywhere: stay near the waker (cache-warm, as Go's runnext), unless
  // fibers already wait there. Then go back to the fiber's previous worker,
  // where it preempts the runner if it slept long enough (fiber_vtime.hpp):
  // a waker that wakes eight clients must not stack them all on its own
  // worker, as the kernel's wake_affine does not (latt, seed 003).
  Worker* here = Worker::current();
  if (here && &here->scheduler() == this && here->nothing_queued()) return here->index();
  return prev;
}

// ---------------------------------------------------------------- idle workers

void Scheduler::note_idle(const Worker& w, bool idle) noexcept {
  placement_->set_idle(w.index(), idle);
  idle_count_.fetch_add(idle ? 1 : -1, std::memory_order_relaxed);
}

bool Scheduler::wake_helper(const Worker& from, Help why) {
  const bool for_backlog = why == Help::backlog;
  // seq_cst loads (plain loads on x86), after a spawner's seq_cst add to its
  // queued count: a single-PU worker sets its idle bit and `sleeping` before
  // the fence in sleep_once, so either this call sees them or that worker,
  // looking once more before it sleeps, sees the spawn (see LockedFlag). A
  // spinner is trusted to find the work, as before.
  if (!for_backlog && spinning_.load(std::memory_order_seq_cst) > 0) return true; // a spinner will find the work
  const unsigned nllc = placement_->llc_count();
  for (unsigned i = 0; i < nllc; ++i) {
    const unsigned llc = (from.pu().llc + i) % nllc;
    bool woke = false;
    placement_->for_each_idle(llc, [&](unsigned wi) {
      Worker& w = *workers_[wi];
      if (&w == &from) return false;
      // For a backlog the woken worker must be able to take it: not a PU of
      // the runner's core, and not one beside a sibling that runs a cookie,
      // which may steal only that cookie and would go back to sleep, leaving
      // the backlog to wait for the runner while the rule counts it as shared
      // (a child on a single-PU worker's ring would wait for the whole run
      // while a single-PU worker slept).
      if (for_backlog && (w.pu().core == from.pu().core || w.core().running_cookie() != kNoCookie)) return false;
      // A single-PU worker that does not say it sleeps is awake (picking,
      // stealing, adopting what it stole) or will look at the queued counts
      // before it sleeps: pass it by without its lock (waiting for that lock
      // would be the spawner's spin here, 7 % of 1M spawns' samples). An SMT
      // worker does not look before sleeping: read the flag under the lock.
      Sibling& s = w.sibling();
      if (why == Help::spawned && w.core().single_pu() && !s.sleeping.read_unlocked()) return false;
      WakeList wakes;
      w.core().lock().lock();
      if (s.sleeping && !(for_backlog && s.forced_idle)) {
        s.sleeping = false;
        wakes.add(w.core(), w.sibling_index());
        woke = true;
      }
      w.core().lock().unlock();
      wakes.notify();
      return woke;
    });
    if (woke) return true;
  }
  return false;
}

bool Scheduler::queued_elsewhere(const Worker& w) const noexcept {
  for (const auto& c : cores_)
    if (c->index() != w.pu().core && c->single_pu() && c->queued_hint() > 0) {
      // The count was read relaxed: make the ring slots written before it
      // visible to the steal that follows (no instruction on x86).
      std::atomic_thread_fence(std::memory_order_acquire);
      return true;
    }
  return false;
}

unsigned Scheduler::steal_for(Worker& thief, const Pick& p, Fiber** out) {
  thief.steal_grace().new_attempt();
  if (p.steal == Pick::Steal::none) return 0;
  for (unsigned ci : steal_order_[thief.index()]) {
    CoreCoordinator& c = *cores_[ci];
    if (c.queued_hint() <= 0) continue;
    if (!thief.steal_grace().allows(ci, c.affine_seq(), c.queued_hint())) continue;
    // Fibers spawned on a single-PU core: lock-free, half at a time. Only for
    // a thief on a single-PU core that may take any cookie: the ring mixes
    // cookies, and an SMT core takes one cookie per steal (steal_locked, which
    // drains the ring first).
    if (p.steal == Pick::Steal::any && thief.core().single_pu())
      if (const unsigned n = c.steal_spawned(out, kStealBatch)) return n;
    if (!c.lock().try_lock()) continue;
    const unsigned n = c.steal_locked(p.steal_cookie, p.steal == Pick::Steal::any, out, kStealBatch);
    c.lock().unlock();
    if (n > 0) return n;
  }
  return 0;
}

// Out of line: the spawn path of a fiber (the instruction budget's) never
// reads this thread-local.
[[gnu::noinline]] std::uint64_t plain_thread_cookie() noexcept { return tls_call_cookie ? *tls_call_cookie : 0; }

std::uint64_t new_fiber_ids(std::uint64_t n) noexcept { return next_fiber_id.fetch_add(n, std::memory_order_relaxed); }

// Retired counts are read before spawned ones. Both only grow, so the result
// is never below the number of fibers live when the last retired count was
// read, and zero means none was live then (and none can be spawned without
// one, once external spawns are refused).
std::uint64_t Scheduler::live_fibers() const noexcept {
  const std::uint64_t retired = retired_fibers();
  std::uint64_t spawned = 0;
  for (const auto& w : workers_) spawned += w->spawned_count();
  spawned += external_spawned_.load(std::memory_order_seq_cst);
  return spawned - retired;
}

std::uint64_t Scheduler::retired_fibers() const noexcept {
  std::uint64_t retired = 0;
  for (const auto& w : workers_) retired += w->retired_count();
  return retired;
}

// ---------------------------------------------------------------- shutdown

void Scheduler::shutdown() {
  std::lock_guard lk(shutdown_mu_);
  if (shut_down_) return;
  Worker* here = Worker::current();
  if (here && &here->scheduler() == this)
    throw UsageError("coresched: shutdown() called from one of the runtime's own fibers");
  shut_down_ = true;
  stopping_.store(true, std::memory_order_seq_cst); // before live_fibers() reads the counts (see spawn)
  wake_all_workers(); // each cancels its in-flight I/O: sleeping fibers wake now
  deadlines_.expire_all(); // and timed sync waits end, timed out
  wait_for_fibers();
  call_threads_.wait_idle(); // a call that woke its fiber may still be in the scheduler
  exiting_.store(true, std::memory_order_release);
  wake_all_workers();
  for (auto& w : workers_) w->join();
  ticker_->stop();
  claim_.release(); // no fiber of this runtime runs any more
  unregister_runtime(&debug_); // a dump signal during the shutdown above still reached it
  write_trace();
  const char* env = std::getenv("CORESCHED_STATS");
  if (env && std::string(env) == "1") std::fprintf(stderr, "%s", stats().to_table().c_str());
}

// Fibers parked in untimed waits (an Event nobody sets, a join of such a
// fiber) keep shutdown waiting for ever: say so, and say what each waits for.
void Scheduler::wait_for_fibers() {
  using Clock = std::chrono::steady_clock;
  const auto every = options_.shutdown_report_after;
  const auto start = Clock::now();
  auto next_report = start + every;
  while (live_fibers() > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (every.count() == 0 || Clock::now() < next_report) continue;
    next_report = Clock::now() + every;
    if (!log().should_log(spdlog::level::warn)) continue;
    char* text = nullptr;
    std::size_t len = 0;
    if (std::FILE* f = open_memstream(&text, &len)) {
      // On a thread of its own, as Runtime::dump: this may be another
      // runtime's fiber, whose stack is too small for the symbolizer.
      std::thread([&] { dump(f); }).join();
      std::fclose(f);
    }
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    log().warn("shutdown has waited {} ms for {} fiber(s) still alive (Options::shutdown_report_after); it waits on. "
               "What they wait for:\n{}",
               waited.count(), live_fibers(), text ? text : "(no dump)");
    std::free(text);
  }
}

void Scheduler::report_detached_exception(std::exception_ptr e) noexcept {
  if (options_.on_detached_exception) {
    try {
      options_.on_detached_exception(e);
      return;
    } catch (...) {
      log().error("Options::on_detached_exception threw ({}); reporting the fiber's exception here instead",
                  describe_exception(std::current_exception()));
    }
  }
  Worker* w = Worker::current();
  const Fiber* f = w ? w->running() : nullptr;
  log().error("fiber {} (cookie {}) ended by an exception that nobody will join: {}", f ? f->id : 0,
              f ? cookie_label(f->cookie) : std::string("?"), describe_exception(e));
}

void Scheduler::wake_all_workers() {
  for (auto& c : cores_) {
    WakeList wakes;
    c->lock().lock();
    for (unsigned s = 0; s < c->size(); ++s) {
      if (c->sibling(s).sleeping) {
        c->sibling(s).sleeping = false;
        wakes.add(*c, s);
      }
    }
    c->lock().unlock();
    wakes.notify();
  }
}

void Scheduler::write_trace() {
  if (!trace_) return;
  const std::string error = trace_->write(topology_);
  if (!error.empty()) {
    log().error("{}", error); // the application's work is done: report, do not throw from shutdown
    return;
  }
  log().info("scheduling trace written to {}", trace_->path());
  if (const auto dropped = trace_->dropped())
    log().warn("trace: the per-worker rings were full; the oldest {} events were dropped "
               "(CORESCHED_TRACE_EVENTS sets their size)", dropped);
}

Stats Scheduler::stats() {
  Stats st;
  std::unordered_map<std::uint64_t, CookieStats> cookies;
  for (auto& w : workers_) {
    WorkerStats ws;
    w->collect(cookies, ws);
    st.workers.push_back(ws);
  }
  for (auto& c : cores_) {
    for (auto [cookie, ns] : c->ownership()) {
      auto& cs = cookies[cookie];
      cs.cookie = Cookie::from_value(cookie);
      cs.core_ns += ns;
    }
    CoreStats cs;
    cs.core = c->index();
    cs.cookie_switches = c->cookie_switches.load(std::memory_order_relaxed);
    const auto h = c->handovers();
    cs.handovers = h.count;
    cs.handover_gap_p50_ns = h.p50_ns;
    cs.handover_gap_p99_ns = h.p99_ns;
    cs.handover_gap_max_ns = h.max_ns;
    cs.forced_idle_ns = c->forced_idle_ns.load(std::memory_order_relaxed);
    const CoreSnapshot snap = c->snapshot(1000);
    cs.has_owner = snap.locked && !c->single_pu() && snap.owner != kNoCookie;
    if (cs.has_owner) cs.owner = Cookie::from_value(snap.owner);
    for (const auto& pu : snap.pus) cs.forced_idle_pus += pu.forced_idle;
    for (auto [cookie, n] : snap.runnable) cs.queued.push_back({Cookie::from_value(cookie), n});
    std::sort(cs.queued.begin(), cs.queued.end(),
              [](const auto& a, const auto& b) { return a.cookie.value() < b.cookie.value(); });
    st.cores.push_back(std::move(cs));
  }
  for (auto& [k, v] : cookies) {
    v.name = v.cookie.name();
    v.weight = v.cookie.weight();
    st.cookies.push_back(std::move(v));
  }
  std::sort(st.cookies.begin(), st.cookies.end(),
            [](const CookieStats& a, const CookieStats& b) { return a.cookie.value() < b.cookie.value(); });
  st.isolation_violations = isolation_violations.load(std::memory_order_relaxed);
  st.ticks = ticker_->wakeups();
  return st;
}

} // namespace coresched::detail
