// SPDX-License-Identifier: Apache-2.0
// `coresched-bench hackbench`: seed 001's message-passing benchmark on fibers.
// Groups of senders and receivers; every sender sends `loops` 100-byte
// messages to every receiver of its group, over fiber channels or, with
// --pipe/--socket, over real file descriptors through coresched::io. The
// figure is the wall time until every receiver has all its messages.
#include "cli_options.hpp"
#include "commands.hpp"
#include "common.hpp"

#include <coresched/io.hpp>
#include <coresched/sync.hpp>
#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <sys/socket.h>
#include <unistd.h>

namespace coresched::bench::hackbench {
namespace {

using Clock = std::chrono::steady_clock;

/// hackbench's DATASIZE. The first bytes name the sender and the message's
/// number, so a receiver can check that each sender's messages arrive whole
/// and in order.
struct Message {
  std::uint32_t sender = 0;
  std::uint32_t seq = 0;
  std::array<std::byte, 92> payload{};
};
static_assert(sizeof(Message) == 100);

enum class Ipc { channel, pipe, socket };

const char* to_string(Ipc i) { return i == Ipc::channel ? "channel" : i == Ipc::pipe ? "pipe" : "socket"; }

struct Settings {
  unsigned groups = 10;
  unsigned fds = 20; ///< senders, and receivers, per group (hackbench's -f)
  unsigned loops = 100;
  unsigned runs = 1;
  bool pipe = false, socket = false;
  unsigned capacity = 64;
  std::optional<Placement> placement;
  bool compare = false;
  std::string topology;
  std::optional<FairnessPolicy> policy;
  std::optional<unsigned> slice_us;
  std::string json_path;

  Ipc ipc() const { return pipe ? Ipc::pipe : socket ? Ipc::socket : Ipc::channel; }
  unsigned fibers() const { return groups * fds * 2; }
};

// ------------------------------------------------------------------ command line

void add_options(CLI::App& sub, Settings& s) {
  sub.add_option("-g,--groups", s.groups, "Groups of senders and receivers")
      ->capture_default_str()->check(CLI::Range(1u, 100000u));
  sub.add_option("-f,--fds", s.fds, "Senders, and receivers, per group")
      ->capture_default_str()->check(CLI::Range(1u, 10000u));
  sub.add_option("-l,--loops", s.loops, "Messages each sender sends to each receiver of its group")
      ->capture_default_str()->check(CLI::Range(1u, 100000000u));
  sub.add_option("--runs", s.runs, "Runs (per placement)")->capture_default_str()->check(CLI::Range(1u, 100000u));
  auto* pipe = sub.add_flag("-p,--pipe", s.pipe, "Send over pipes (hackbench -p), through coresched::io");
  sub.add_flag("--socket", s.socket, "Send over AF_UNIX stream socketpairs (hackbench's default), through "
                                     "coresched::io")->excludes(pipe);
  sub.add_option("--channel-capacity", s.capacity,
                 "Messages a receiver's fiber channel buffers before senders wait (without --pipe/--socket)")
      ->capture_default_str()->check(CLI::Range(1u, 1u << 20));
  auto* placement = add_placement_option(sub, s.placement);
  sub.add_flag("--compare", s.compare, "Run with mask, then with scan placement, and print the time ratio mask/scan")
      ->excludes(placement);
  add_topology_option(sub, s.topology, false);
  add_policy_option(sub, s.policy);
  add_slice_option(sub, s.slice_us);
  add_json_option(sub, s.json_path);
}

// ------------------------------------------------------------------ transports

/// What a receiver found wrong; all zero in a good run.
struct Faults {
  std::uint64_t out_of_order = 0; ///< a sender's messages not whole and in order
  std::uint64_t io_errors = 0;
  std::string first_error;

  void add(const Faults& o) {
    out_of_order += o.out_of_order;
    io_errors += o.io_errors;
    if (first_error.empty()) first_error = o.first_error;
  }
  void io_error(const char* what, const std::error_code& e) {
    if (io_errors++ == 0) first_error = fmt::format("{}: {}", what, e.message());
  }
};

/// The receivers' mailboxes: fiber channels, or one pipe/socketpair each
/// (receivers read end 0, senders write end 1).
class Mailboxes {
public:
  Mailboxes(const Settings& s) : ipc_(s.ipc()) {
    const unsigned n = s.groups * s.fds;
    if (ipc_ == Ipc::channel) {
      for (unsigned i = 0; i < n; ++i) channels_.push_back(std::make_unique<Channel<Message>>(s.capacity));
      return;
    }
    fds_.reserve(n);
    for (unsigned i = 0; i < n; ++i) {
      std::array<int, 2> fd{};
      const int rc = ipc_ == Ipc::pipe ? ::pipe2(fd.data(), O_CLOEXEC)
                                       : ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fd.data());
      if (rc != 0)
        throw std::runtime_error(fmt::format("{} {} of {}: {}{}", ipc_ == Ipc::pipe ? "pipe" : "socketpair", i + 1, n,
                                             std::strerror(errno),
                                             errno == EMFILE ? " (too many open files: raise `ulimit -n`)" : ""));
      fds_.push_back(fd);
    }
  }
  Mailboxes(const Mailboxes&) = delete;
  Mailboxes& operator=(const Mailboxes&) = delete;
  ~Mailboxes() {
    for (const auto& fd : fds_) ::close(fd[0]), ::close(fd[1]);
  }

  /// Delivers one message to receiver `r` (a global receiver index).
  void send(unsigned r, const Message& m, Faults& f) {
    if (ipc_ == Ipc::channel) return void(channels_[r]->send(m));
    const auto* p = reinterpret_cast<const std::byte*>(&m);
    for (std::size_t done = 0; done < sizeof m;) { // a short write is continued, as hackbench does
      const auto res = io::write(fds_[r][1], std::span(p + done, sizeof m - done));
      if (!res) return f.io_error("write", res.error);
      done += static_cast<std::size_t>(res.value);
    }
  }

  /// Takes the next message for receiver `r`; false on an error.
  bool recv(unsigned r, Message& m, Faults& f) {
    if (ipc_ == Ipc::channel) {
      m = *channels_[r]->recv(); // never closed while receivers run
      return true;
    }
    auto* p = reinterpret_cast<std::byte*>(&m);
    for (std::size_t done = 0; done < sizeof m;) {
      const auto res = io::read(fds_[r][0], std::span(p + done, sizeof m - done));
      if (!res || res.value == 0) {
        f.io_error("read", res ? std::make_error_code(std::errc::broken_pipe) : res.error);
        return false;
      }
      done += static_cast<std::size_t>(res.value);
    }
    return true;
  }

private:
  Ipc ipc_;
  std::vector<std::unique_ptr<Channel<Message>>> channels_;
  std::vector<std::array<int, 2>> fds_;
};

// ------------------------------------------------------------------ one run

/// Everyone is created and waiting before the clock starts, as in hackbench.
struct StartLine {
  Latch ready;
  Event go;
};

void sender(Mailboxes& mb, const Settings& s, unsigned group, unsigned me, StartLine& start, Faults& f) {
  start.ready.count_down();
  start.go.wait();
  Message m;
  m.sender = me;
  for (unsigned l = 0; l < s.loops; ++l) {
    m.seq = l;
    for (unsigned r = 0; r < s.fds; ++r) mb.send(group * s.fds + r, m, f);
  }
}

Faults receiver(Mailboxes& mb, const Settings& s, unsigned rcv, StartLine& start) {
  start.ready.count_down();
  start.go.wait();
  Faults f;
  std::vector<std::uint32_t> next(s.fds, 0); // the seq each sender's next message must carry
  Message m;
  for (std::uint64_t n = std::uint64_t{s.loops} * s.fds; n > 0; --n) {
    if (!mb.recv(rcv, m, f)) break;
    if (m.sender >= s.fds || m.seq != next[m.sender]++) ++f.out_of_order;
  }
  return f;
}

struct Run {
  double time_s = 0;
  Faults faults;
};

Run run_once(Runtime& rt, const Settings& s) {
  Mailboxes mb(s);
  StartLine start{Latch(s.fibers()), Event()};
  std::vector<Faults> send_faults(s.groups * s.fds);
  std::vector<JoinHandle<Faults>> receivers;
  std::vector<JoinHandle<void>> senders;
  for (unsigned g = 0; g < s.groups; ++g)
    for (unsigned i = 0; i < s.fds; ++i) {
      const unsigned id = g * s.fds + i;
      receivers.push_back(rt.spawn([&mb, &s, id, &start] { return receiver(mb, s, id, start); }));
      senders.push_back(rt.spawn([&, g, i, id] { sender(mb, s, g, i, start, send_faults[id]); }));
    }
  start.ready.wait();
  Run r;
  const auto t0 = Clock::now();
  start.go.set();
  for (auto& h : receivers) r.faults.add(h.join());
  r.time_s = seconds(Clock::now() - t0); // every message has arrived
  for (auto& h : senders) h.join();
  for (const auto& f : send_faults) r.faults.add(f);
  return r;
}

struct Result {
  Placement placement;
  std::vector<Run> runs;

  Summary time() const {
    std::vector<double> xs;
    for (const auto& r : runs) xs.push_back(r.time_s);
    return summarize(xs);
  }
};

/// The runs, until an interrupt: a run under way when it comes finishes (it
/// ends when every message has arrived).
Result measure(Runtime& rt, const Settings& s) {
  Result res{rt.options().placement, {}};
  const std::string label = fmt::format("hackbench/{}", to_string(res.placement));
  for (unsigned i = 1; i <= s.runs && !interrupted(); ++i) {
    progress_begin(label, fmt::format("run {}/{} ...", i, s.runs));
    res.runs.push_back(run_once(rt, s));
    progress_end(fmt::format(" {:.3f} s", res.runs.back().time_s));
  }
  return res;
}

// ------------------------------------------------------------------ output

void print_hackbench_header(const Settings& s, const Runtime& rt) {
  const auto& o = rt.options();
  const std::string over = s.ipc() == Ipc::channel ? fmt::format("fiber channels of {} messages", s.capacity)
                           : s.ipc() == Ipc::pipe  ? std::string("pipes through coresched::io")
                                                   : std::string("AF_UNIX socketpairs through coresched::io");
  print_header("hackbench", rt, {
      {"policy", to_string(o.policy)},
      {"wakeup placement", s.compare ? std::string("mask, then scan (--compare)") : to_string(o.placement)},
      {"slice", fmt::format("{} us", o.slice.count())},
      {"groups", fmt::format("{} of {} senders + {} receivers (== {} fibers)", s.groups, s.fds, s.fds, s.fibers())},
      {"messages", fmt::format("each sender passes {} messages of {} bytes to each receiver, over {}", s.loops,
                               sizeof(Message), over)},
      {"run length", fmt::format("{} run(s){}", s.runs, s.compare ? " per placement" : "")},
  });
}

std::string render(const Result& r) {
  const Summary t = r.time();
  std::string out = fmt::format("\nPlacement {}\nTime: {:.3f}\n", to_string(r.placement), t.avg);
  if (r.runs.size() > 1) out += fmt::format("(average of {} runs, stdev {:.3f})\n", r.runs.size(), t.stdev);
  return out;
}

/// Prints one placement's time as soon as it is measured (nothing when an
/// interrupt came before its first run ended).
Result report(Result r) {
  if (r.runs.empty()) return r;
  std::fputs(render(r).c_str(), stdout);
  std::fflush(stdout);
  return r;
}

std::optional<double> time_ratio(const std::vector<Result>& rs) {
  if (rs.size() != 2 || rs[1].time().avg == 0) return std::nullopt;
  return rs[0].time().avg / rs[1].time().avg;
}

void write_settings(JsonWriter& j, const Settings& s) {
  j.field("groups", s.groups).field("senders_per_group", s.fds).field("receivers_per_group", s.fds);
  j.field("loops", s.loops).field("message_bytes", static_cast<unsigned>(sizeof(Message)));
  j.field("ipc", to_string(s.ipc()));
  s.ipc() == Ipc::channel ? j.field("channel_capacity", s.capacity) : j.key("channel_capacity").null();
  j.field("messages_per_run", std::uint64_t{s.groups} * s.fds * s.fds * s.loops);
  j.field("runs", s.runs).field("compare", s.compare);
  j.key("units").begin_object().field("time_s", "s").end_object();
}

void write_results(JsonWriter& j, const std::vector<Result>& rs) {
  j.key("placements").begin_array();
  for (const auto& r : rs) {
    j.begin_object().field("placement", to_string(r.placement));
    j.summary("time_s", r.time(), "s");
    j.key("runs").begin_array();
    for (const auto& run : r.runs) {
      j.begin_object().field("time_s", run.time_s).field("out_of_order", run.faults.out_of_order);
      j.field("io_errors", run.faults.io_errors).end_object();
    }
    j.end_array().end_object();
  }
  j.end_array();
  const auto ratio = time_ratio(rs);
  ratio ? j.field("time_ratio_mask_over_scan", *ratio) : j.key("time_ratio_mask_over_scan").null();
}

/// A bad message or an I/O error is a failed run, not a slow one.
bool faults_ok(const std::vector<Result>& rs) {
  bool ok = true;
  for (const auto& r : rs)
    for (const auto& run : r.runs)
      if (run.faults.out_of_order || run.faults.io_errors) {
        std::fprintf(stderr, "coresched-bench hackbench: %s: %llu message(s) out of order, %llu I/O error(s)%s%s\n",
                     to_string(r.placement), static_cast<unsigned long long>(run.faults.out_of_order),
                     static_cast<unsigned long long>(run.faults.io_errors),
                     run.faults.first_error.empty() ? "" : ", first: ", run.faults.first_error.c_str());
        ok = false;
      }
  return ok;
}

int run(const Settings& s) {
  const auto runtimes = variants(runtime_options(s.topology, s.policy, s.placement, s.slice_us), s.compare, &Options::placement,
                                 {Placement::mask, Placement::scan});
  return run_variants<Result>(
      "hackbench", s.json_path, runtimes, [&](const Runtime& rt) { print_hackbench_header(s, rt); },
      [&](Runtime& rt) { return report(measure(rt, s)); },
      [&](JsonWriter& j, const std::vector<Result>& rs) {
        if (const auto ratio = time_ratio(rs))
          std::printf("\ntime ratio mask/scan: %.3f (below 1: the idle mask is faster)\n", *ratio);
        Progress progress{0, static_cast<double>(s.runs * runtimes.size()), "runs"};
        for (const auto& r : rs) progress.done += static_cast<double>(r.runs.size());
        print_interrupted(progress);
        write_settings(j, s);
        write_results(j, rs);
        write_interrupted(j, progress);
        return faults_ok(rs);
      });
}

} // namespace
} // namespace coresched::bench::hackbench

namespace coresched::bench {

Command register_hackbench(CLI::App& parent) {
  return make_command<hackbench::Settings>(
      parent, "hackbench",
      "How fast message passing runs under heavy wake-up traffic, as hackbench measured the idle-CPU mask for "
      "wake-up placement in the original proposal: groups of sender and receiver fibers pass 100-byte messages over "
      "channels, pipes or socketpairs; wall time, with mask or scan wakeup placement (--compare runs both)",
      hackbench::add_options, hackbench::run);
}

} // namespace coresched::bench
