// SPDX-License-Identifier: Apache-2.0
#include "platform/trace.hpp"

#include "platform/clock.hpp"
#include "platform/cookie_registry.hpp"

#include <coresched/join_handle.hpp> // UsageError

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <unordered_map>

namespace coresched::detail {

namespace {

constexpr std::size_t kDefaultCapacity = 65536;

std::size_t capacity_from_env() {
  const char* s = std::getenv("CORESCHED_TRACE_EVENTS");
  if (!s || !*s) return kDefaultCapacity;
  // At most 2^24 events a worker (a few hundred MiB of buffers): strtoull
  // takes "-1" as 2^64 - 1, and such counts would end in std::length_error or
  // std::bad_alloc at the buffers' reserve instead of this message.
  constexpr unsigned long long kMax = 1ULL << 24;
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(s, &end, 10);
  if (*end != '\0' || n == 0 || n > kMax || errno == ERANGE || std::strchr(s, '-'))
    throw UsageError(fmt::format("CORESCHED_TRACE_EVENTS='{}': expected a count from 1 to {}", s, kMax));
  return static_cast<std::size_t>(n);
}

// Chrome trace-event timestamps are microseconds; keep nanosecond resolution.
std::string us(std::uint64_t ns) { return fmt::format("{}.{:03}", ns / 1000, ns % 1000); }

// A JSON string's contents. Names refuse control characters at creation, but
// a quote or a backslash in a name would make the whole trace unreadable, and bytes
// that are not UTF-8 make strict parsers (Python's json) refuse it too: they
// become U+FFFD.
std::string json_escape(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const auto u = static_cast<unsigned char>(s[i]);
    if (u < 0x80) {
      if (u == '"' || u == '\\') out += {'\\', s[i]};
      else if (u < 0x20 || u == 0x7f) out += fmt::format("\\u{:04x}", u);
      else out += s[i];
      ++i;
      continue;
    }
    // A UTF-8 sequence: the lead byte gives its length and the second byte's
    // range (no overlong forms, no surrogates, nothing past U+10FFFF).
    std::size_t n = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (u >= 0xc2 && u <= 0xdf) n = 2;
    else if (u >= 0xe0 && u <= 0xef) n = 3, lo = u == 0xe0 ? 0xa0 : 0x80, hi = u == 0xed ? 0x9f : 0xbf;
    else if (u >= 0xf0 && u <= 0xf4) n = 4, lo = u == 0xf0 ? 0x90 : 0x80, hi = u == 0xf4 ? 0x8f : 0xbf;
    std::size_t k = 1;
    for (; k < n && i + k < s.size(); ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? c < lo || c > hi : (c & 0xc0) != 0x80) break;
    }
    if (n && k == n) out.append(s.substr(i, n));
    else out += "\\ufffd";
    i += k;
  }
  return out;
}

// Each cookie's name, escaped for JSON, looked up once per trace: the
// registry is read at write time (names never change, so the name is the one
// the cookie had while the events were recorded).
class CookieNames {
public:
  // `,"<key>_name":"premium"` for a named cookie; nothing for one without a name.
  std::string field(std::uint64_t cookie, std::string_view key) {
    auto [it, fresh] = escaped_.try_emplace(cookie);
    if (fresh)
      if (const char* n = cookie_name(cookie)) it->second = json_escape(n);
    return it->second.empty() ? std::string() : fmt::format(R"(,"{}_name":"{}")", key, it->second);
  }

private:
  std::unordered_map<std::uint64_t, std::string> escaped_;
};

std::string event_json(const TraceEvent& e, unsigned tid, std::uint64_t origin, CookieNames& names) {
  const std::uint64_t ts = e.ts_ns > origin ? e.ts_ns - origin : 0;
  switch (e.kind) {
  case TraceKind::run:
    return fmt::format(R"({{"name":"fiber {}","cat":"run","ph":"X","pid":1,"tid":{},"ts":{},"dur":{},)"
                       R"("args":{{"fiber":{},"cookie":{}{}}}}})",
                       e.id, tid, us(ts), us(e.dur_ns), e.id, e.cookie, names.field(e.cookie, "cookie"));
  case TraceKind::forced_idle:
    return fmt::format(R"({{"name":"forced idle","cat":"forced_idle","ph":"X","pid":1,"tid":{},"ts":{},"dur":{},)"
                       R"("args":{{"waiting_cookie":{},"core_cookie":{}{}{}}}}})",
                       tid, us(ts), us(e.dur_ns), e.cookie, e.other, names.field(e.cookie, "waiting_cookie"),
                       names.field(e.other, "core_cookie"));
  case TraceKind::cookie_change:
    return fmt::format(R"({{"name":"cookie {}","cat":"cookie","ph":"i","s":"t","pid":1,"tid":{},"ts":{},)"
                       R"("args":{{"cookie":{}{}}}}})",
                       e.cookie, tid, us(ts), e.cookie, names.field(e.cookie, "cookie"));
  case TraceKind::handover:
    return fmt::format(R"({{"name":"hand-over","cat":"handover","ph":"X","pid":1,"tid":{},"ts":{},"dur":{},)"
                       R"("args":{{"from_cookie":{},"to_cookie":{}{}{}}}}})",
                       tid, us(ts), us(e.dur_ns), e.other, e.cookie,
                       names.field(e.other, "from_cookie"), names.field(e.cookie, "to_cookie"));
  case TraceKind::wakeup:
    return fmt::format(R"({{"name":"wake fiber {}","cat":"wakeup","ph":"i","s":"t","pid":1,"tid":{},"ts":{},)"
                       R"("args":{{"fiber":{},"cookie":{},"to_worker":{}{}}}}})",
                       e.id, tid, us(ts), e.id, e.cookie, e.other, names.field(e.cookie, "cookie"));
  }
  return {};
}

} // namespace

std::vector<TraceEvent> TraceRing::snapshot() const {
  std::vector<TraceEvent> out;
  if (recorded_ >= events_.size())
    out.insert(out.end(), events_.begin() + static_cast<std::ptrdiff_t>(next_), events_.end());
  out.insert(out.end(), events_.begin(), events_.begin() + static_cast<std::ptrdiff_t>(next_));
  return out;
}

std::unique_ptr<Trace> Trace::from_options(const std::string& path, std::size_t workers) {
  std::string p = path;
  if (p.empty())
    if (const char* env = std::getenv("CORESCHED_TRACE")) p = env;
  if (p.empty()) return nullptr;
  return std::make_unique<Trace>(p, workers, capacity_from_env());
}

Trace::Trace(std::string path, std::size_t workers, std::size_t capacity)
    : path_(std::move(path)), origin_ns_(now_ns()) {
  for (std::size_t i = 0; i < workers; ++i) rings_.push_back(std::make_unique<TraceRing>(capacity));
}

std::uint64_t Trace::dropped() const noexcept {
  std::uint64_t n = 0;
  for (const auto& r : rings_) n += r->dropped();
  return n;
}

std::string Trace::write(const Topology& topology) const {
  std::FILE* out = std::fopen(path_.c_str(), "w");
  if (!out) return fmt::format("cannot write the trace to '{}': {}", path_, std::strerror(errno));
  std::string text = R"({"displayTimeUnit":"ns","traceEvents":[)";
  text += fmt::format(R"j({{"name":"process_name","ph":"M","pid":1,"args":{{"name":"coresched ({} siblings)"}}}})j",
                      topology.real_siblings() ? "REAL" : "SYNTHETIC");
  for (const auto& pu : topology.pus()) {
    text += fmt::format(
        R"j(,{{"name":"thread_name","ph":"M","pid":1,"tid":{},"args":{{"name":"worker {} (core {}, CPU {})"}}}})j",
        pu.index, pu.index, pu.core, pu.cpu);
    text += fmt::format(R"(,{{"name":"thread_sort_index","ph":"M","pid":1,"tid":{},"args":{{"sort_index":{}}}}})",
                        pu.index, pu.index);
  }
  std::fputs(text.c_str(), out);
  CookieNames names;
  for (unsigned w = 0; w < rings_.size(); ++w)
    for (const TraceEvent& e : rings_[w]->snapshot()) {
      std::fputc(',', out);
      std::fputs(event_json(e, w, origin_ns_, names).c_str(), out);
    }
  std::fputs("]}\n", out);
  const bool ok = std::ferror(out) == 0;
  if (std::fclose(out) != 0 || !ok)
    return fmt::format("writing the trace to '{}' failed: {}", path_, std::strerror(errno));
  return {};
}

} // namespace coresched::detail
