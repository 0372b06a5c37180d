// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file latt_work.hpp
/// What both runs of `coresched-bench latt` share: the work a client does
/// after each wake-up (latt's zlib compression), the background load, and the
/// figures one run yields. The fiber run is latt.cpp, the kernel-thread run of
/// `--compare-threads` latt_threads.cpp.

#include "latency_stats.hpp"

#include <coresched/this_fiber.hpp>
#include <zlib.h>

#include <algorithm>
#include <optional>
#include <random>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace coresched::bench::latt {

using Clock = std::chrono::steady_clock;

inline constexpr int zlib_level = 7; // latt's

/// The buffer every client compresses: pseudo-random over a small alphabet,
/// so it compresses about as well as text, and the same in every run.
inline std::vector<unsigned char> make_input(std::size_t bytes) {
  static constexpr char alphabet[] = "etaoin shrdlucmf";
  std::vector<unsigned char> in(bytes);
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  for (auto& b : in) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17; // xorshift64
    b = static_cast<unsigned char>(alphabet[x % 16]);
  }
  return in;
}

/// One client's zlib stream at latt's level, set up once and reset for each
/// compression: the work is deflate itself, not deflateInit's quarter
/// megabyte of fresh, page-faulting buffers.
class Compressor {
public:
  explicit Compressor(std::size_t input_bytes) : out_(::compressBound(static_cast<uLong>(input_bytes))) {
    if (::deflateInit(&z_, zlib_level) != Z_OK) throw std::runtime_error("zlib: deflateInit failed");
  }
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;
  ~Compressor() { ::deflateEnd(&z_); }

  /// Compresses `in`; returns the compressed size, 0 on a zlib error. The
  /// input goes in slices with a preemption point between them: latt's
  /// clients are processes the kernel preempts, and a fiber that compressed
  /// for milliseconds without one would make other clients' wake-ups wait.
  std::size_t compress(const std::vector<unsigned char>& in) {
    constexpr std::size_t slice_bytes = 8 * 1024; // a few hundred microseconds of deflate at most
    if (::deflateReset(&z_) != Z_OK) return 0;
    z_.next_out = out_.data();
    z_.avail_out = static_cast<uInt>(out_.size());
    for (std::size_t off = 0;;) {
      const std::size_t n = std::min(slice_bytes, in.size() - off);
      z_.next_in = const_cast<Bytef*>(in.data() + off); // zlib's API predates const
      z_.avail_in = static_cast<uInt>(n);
      off += n;
      const bool last = off == in.size();
      const int rc = ::deflate(&z_, last ? Z_FINISH : Z_NO_FLUSH);
      if (last) return rc == Z_STREAM_END ? z_.total_out : 0;
      if (rc != Z_OK) return 0;
      this_fiber::preempt_point();
    }
  }

private:
  z_stream z_{};
  std::vector<unsigned char> out_;
};

struct ClientResult {
  LatencyRecorder wakeup, work;
  std::uint64_t bad_outputs = 0; ///< compressions whose size differs from the reference
};

struct Measurement {
  LatencyRecorder wakeup, work;
  std::uint64_t rounds = 0;
  std::uint64_t bad_outputs = 0;
  double elapsed_s = 0;
};

/// A client's loop: takes each stamp from `next` (an optional time point;
/// nullopt ends it), records the delay since the stamp, then does the work
/// and records its time.
template <class Next>
ClientResult serve(Next next, const std::vector<unsigned char>& in, std::size_t expected,
                   std::atomic<std::uint64_t>& entries) {
  Compressor zip(in.size());
  ClientResult r;
  while (const std::optional<Clock::time_point> stamp = next()) {
    const auto woke = Clock::now();
    r.wakeup.add(micros(woke - *stamp));
    if (zip.compress(in) != expected) ++r.bad_outputs;
    r.work.add(micros(Clock::now() - woke));
    entries.fetch_add(1, std::memory_order_relaxed);
  }
  return r;
}

/// A CPU-bound background fiber (or thread): arithmetic with a preemption
/// point every few microseconds (nothing on a plain thread), until told to stop.
inline std::uint64_t burn(const std::atomic<bool>& stop) {
  std::uint64_t x = 1;
  while (!stop.load(std::memory_order_relaxed)) {
    for (int i = 0; i < 4096; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
    this_fiber::preempt_point();
  }
  return x; // returned so the loop is not optimized away
}

/// The shape of one run, which both runs share.
struct Shape {
  unsigned clients = 8;
  double min_wait_ms = 100, max_wait_ms = 500;
  double time_s = 10;
  std::optional<std::uint64_t> rounds; ///< stop after this many wake rounds instead of after time_s
  unsigned load = 0;                   ///< CPU-bound background fibers (threads)
};

/// The waker's pauses: uniform in [min, max] ms from a fixed seed, so every run
/// (fibers and threads alike) sleeps the same sequence.
class WakeIntervals {
public:
  explicit WakeIntervals(const Shape& s) : dist_(s.min_wait_ms, s.max_wait_ms) {}
  Clock::duration next() {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(dist_(rng_)));
  }

private:
  std::mt19937_64 rng_{3};
  std::uniform_real_distribution<double> dist_;
};

/// `--compare-threads`: the same experiment on plain kernel threads, as the
/// seed's latt runs it: each client a thread blocked in read(2) on its own
/// pipe, the waker a thread writing a timestamp into each pipe in turn, the
/// load `shape.load` busy threads; none pinned, so the kernel's scheduler
/// places them all. `entries` counts finished client rounds (progress). An
/// interrupt (interrupted(), common.hpp) ends the wake rounds early.
Measurement measure_threads(const Shape& shape, const std::vector<unsigned char>& in, std::size_t expected,
                            std::atomic<std::uint64_t>& entries);

} // namespace coresched::bench::latt
