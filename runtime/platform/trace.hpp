// SPDX-License-Identifier: Apache-2.0
// Scheduling trace (Options::trace_path or CORESCHED_TRACE=path.json): each
// worker records fiber run spans, forced-idle spans, cookie changes and the
// wake-ups it performs into its own fixed-size ring (no locks, no allocation
// after start; when full, the oldest events are overwritten), and the rings
// are written as Chrome trace-event JSON at shutdown, for Perfetto UI or
// chrome://tracing. When tracing is off, each hook is one branch on a null
// pointer. Events record cookie numbers; the file gives a named cookie's name
// beside its number in each event's args ("cookie_name", "core_cookie_name",
// ...), looked up when the file is written.
#pragma once

#include <coresched/topology.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace coresched::detail {

enum class TraceKind : std::uint8_t {
  run,           // a fiber ran: [ts, ts+dur), id = fiber, cookie
  forced_idle,   // the PU idled for cookie `cookie` while `other` held the core
  cookie_change, // the PU started running cookie `cookie` (instant)
  wakeup,        // this worker made fiber `id` runnable on worker `other` (instant)
  handover,      // the core changed from cookie `other` to `cookie`; [ts, ts+dur) ran neither
};

struct TraceEvent {
  std::uint64_t ts_ns;
  std::uint64_t dur_ns;
  std::uint64_t id;
  std::uint64_t cookie;
  std::uint64_t other;
  TraceKind kind;
};

/// One worker's events. Written only by its worker thread; read at shutdown.
class TraceRing {
public:
  explicit TraceRing(std::size_t capacity) : events_(capacity) {}
  void record(const TraceEvent& e) noexcept {
    events_[next_] = e;
    if (++next_ == events_.size()) next_ = 0;
    ++recorded_;
  }
  /// Events still held, oldest first.
  std::vector<TraceEvent> snapshot() const;
  std::uint64_t dropped() const noexcept { return recorded_ > events_.size() ? recorded_ - events_.size() : 0; }

private:
  std::vector<TraceEvent> events_;
  std::size_t next_ = 0;
  std::uint64_t recorded_ = 0;
};

/// The rings of one runtime and where they go.
class Trace {
public:
  /// Null unless a path is given (in `path` or, if empty, CORESCHED_TRACE).
  /// Capacity per worker: CORESCHED_TRACE_EVENTS (default 65536 events, 48 bytes each).
  static std::unique_ptr<Trace> from_options(const std::string& path, std::size_t workers);
  Trace(std::string path, std::size_t workers, std::size_t capacity);
  TraceRing& ring(unsigned worker) noexcept { return *rings_[worker]; }
  /// Writes the JSON file; returns an error text, or empty on success.
  std::string write(const Topology& topology) const;
  const std::string& path() const noexcept { return path_; }
  std::uint64_t dropped() const noexcept;

private:
  std::string path_;
  std::uint64_t origin_ns_; // timestamps are written relative to the runtime's start
  std::vector<std::unique_ptr<TraceRing>> rings_;
};

} // namespace coresched::detail
