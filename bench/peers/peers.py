#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The peer suite driver: runs the same workloads on coresched, Boost.Fiber,
Go and plain threads, and the echo load generator against three servers, in
one invocation; prints ONE table (stdout) with each figure, the coresched/peer
ratio, the target and whether it is met; progress goes to stderr.

Each figure is the median of --rounds invocations; rounds are interleaved
across peers (round 1 of every peer, then round 2, ...) so a slow phase of this
noisy machine hits every peer alike. Ratios are only ever formed between
figures of the same run. Nothing here knows what a result "should" be.

Standard library only (no numpy). See docs/performance.md.
"""
import argparse
import json
import os
import platform
import select
import shutil
import signal
import statistics
import subprocess
import sys
import time

PEERS = {  # name -> (display name, program in the bin dir, arguments after the workload's)
    "coresched": ("coresched", "peer-coresched", []),
    "boost_fiber": ("Boost.Fiber", "peer-boost-fiber", []),
    "go": ("Go", "peer-go", []),
    "threads": ("threads", "peer-threads", []),
    # wake and channel across two workers with Go's goroutines locked to threads
    # the kernel may place on any CPU: the woken thread then runs on its waker's CPU in 35-54 % of wake-ups
    # (peer.go, lockToCPU), so it is shown beside the pinned `Go` column.
    "go_unpinned": ("Go unpinned", "peer-go", ["-unpinned"]),
    # The same program on the epoll backend (where io_uring is forbidden).
    "coresched_epoll": ("coresched epoll", "peer-coresched", []),
}
# Environment per peer or echo server (added to the suite's own).
PEER_ENV = {"coresched_epoll": {"CORESCHED_IO_BACKEND": "epoll"}}
BASE_PEERS = ["coresched", "boost_fiber", "go", "threads"]
ECHO_SERVERS = {  # name -> (display name, argv after the bin dir)
    "coresched": ("coresched", ["peer-echo-coresched"]),
    "coresched_stream": ("RecvStream", ["peer-echo-coresched", "--recv-stream"]),
    "go": ("Go", ["peer-go", "echo-server"]),
    "epoll": ("epoll", ["peer-echo-epoll"]),
    "coresched_epoll": ("coresched epoll", ["peer-echo-coresched"]),
}
DISPLAY = {**{k: v[0] for k, v in PEERS.items()}, **{k: v[0] for k, v in ECHO_SERVERS.items()}}


class Workload:
    """One workload: its size at full and --quick scale, and per-peer size
    factors where a peer cannot do the full size in reasonable time (the
    figure is per operation, so it stays comparable)."""

    def __init__(self, name, what, full, quick, scale=None, peers=None, higher_is_better=False):
        self.name, self.what, self.full, self.quick = name, what, full, quick
        self.scale = scale or {}
        self.peers = peers or list(BASE_PEERS)
        self.higher_is_better = higher_is_better

    def size(self, peer, quick):
        n = self.quick if quick else self.full
        return max(1, int(n * self.scale.get(peer, 1.0)))


WORKLOADS = [
    Workload("yield", "yield ping-pong, 2 fibers on 1 worker (ns per yield)", 1_000_000, 20_000,
             scale={"threads": 0.05}),
    Workload("spawn_join", "spawn + join an empty fiber, one at a time (ns per fiber)", 500_000, 10_000,
             scale={"threads": 0.02}),
    # Boost.Fiber allocates every fiber's 128 KiB stack at creation and keeps it
    # until join; a million of them exceed the address-space map limit and take
    # minutes, so it (and threads) spawn fewer and report per fiber.
    Workload("spawn_many", "spawn 1M empty fibers, then join all (ns per fiber)", 1_000_000, 20_000,
             scale={"threads": 0.01, "boost_fiber": 0.05}),
    # The same million waited for the way Go's peer waits (a WaitGroup, no
    # handle per fiber): the like-for-like comparison with Go.
    Workload("spawn_many_wg", "spawn 1M detached fibers counting down one WaitGroup, then wait (ns per fiber)",
             1_000_000, 20_000, peers=["coresched", "go"]),
    # Reported per leaf so a peer run at a smaller power of ten stays comparable:
    # Boost.Fiber's malloc'd 128 KiB stack per fiber makes 1M leaves take ~15 s a round here.
    Workload("skynet", "skynet: 1M leaves, 10-ary tree, sum of results (ns per leaf)", 1_000_000, 10_000,
             scale={"boost_fiber": 0.1}, peers=["coresched", "boost_fiber", "go"]),
    Workload("channel", "unbuffered channel round trip across 2 workers (ns)", 200_000, 5_000,
             scale={"threads": 0.05}, peers=BASE_PEERS + ["go_unpinned"]),
    Workload("channel_1w", "unbuffered channel round trip on 1 worker (ns; no target)", 200_000, 5_000,
             scale={"threads": 0.05}),
    # Placed by each runtime (coresched: unpinned fibers; Go: plain goroutines,
    # which Go runs on the sender's thread): what an application gets.
    Workload("channel_any", "unbuffered channel round trip, fibers placed by the runtime (ns)", 200_000, 5_000,
             peers=["coresched", "go"]),
    # Go: waker and woken goroutine locked to OS threads pinned to CPUs 0 and
    # 1, the only way Go has to put them on two CPUs (peer.go, lockToCPU).
    Workload("wake", "cross-worker wake latency, waker pauses --gap-us first (us)", 2_000, 200,
             peers=BASE_PEERS + ["go_unpinned", "coresched_epoll"]),
    Workload("wake_any", "wake latency, fibers placed by the runtime, waker pauses --gap-us first (us)", 2_000, 200,
             peers=["coresched", "go", "coresched_epoll"]),
    # The I/O backends' timers: each backend against the other (no target vs Go).
    Workload("sleep", "lateness of a --gap-us sleep on an otherwise idle worker (us)", 2_000, 200,
             peers=["coresched", "coresched_epoll"]),
    # A runs on for 100 us after the wake-up before it waits (coresched: with
    # preemption points, as cooperative code has them).
    Workload("wake_run_on", "wake latency, placed by the runtime, the waker runs on 100 us (us)", 2_000, 200,
             peers=["coresched", "go"]),
    # A producer and a consumer, 1 us of work each per item, a channel of 64
    # between them: ~1,000 ns per item if they overlap, ~2,000 if they take turns.
    Workload("pipeline", "producer -> channel(64) -> consumer, 1 us of work each per item (ns per item)", 100_000,
             5_000, peers=["coresched", "go"]),
    # A fiber per idle connection: n parked on one Event (Go: one channel),
    # then all released. Start and drain in ns per fiber, RSS in bytes each.
    Workload("park", "park 100k fibers on one Event: start, RSS, drain (per fiber)", 100_000, 5_000,
             peers=["coresched", "go"]),
    Workload("echo", "loopback TCP echo, 64-byte messages (requests/s)", 0, 0,
             peers=list(ECHO_SERVERS), higher_is_better=True),
]
BY_NAME = {w.name: w for w in WORKLOADS}

# (workload, metric, peer) -> (operator, bound) on coresched/peer: the targets.
TARGETS = {
    ("yield", "time", "boost_fiber"): ("<=", 0.35),
    ("spawn_join", "time", "boost_fiber"): ("<=", 0.5),
    ("spawn_join", "time", "go"): ("<=", 0.25),
    ("spawn_many", "time", "boost_fiber"): ("<=", 0.5),
    ("spawn_many", "time", "go"): ("<=", 0.5),
    ("spawn_many_wg", "time", "go"): ("<=", 0.25),
    ("skynet", "time", "go"): ("<=", 0.5),
    ("channel", "time", "go"): ("<=", 0.5),
    # placed by each runtime, and wake-ups
    ("channel_any", "time", "go"): ("<=", 1.0),
    ("wake", "p50", "go"): ("<=", 1.0),
    ("wake", "p99", "go"): ("<=", 1.0),
    ("wake_any", "p50", "go"): ("<=", 1.0),
    ("wake_any", "p99", "go"): ("<=", 1.0),
    ("park", "start", "go"): ("<=", 1.0),
    ("park", "rss", "go"): ("<=", 1.0),
    ("echo", "rps", "epoll"): (">=", 1.1),
}
# The epoll backend's rows: coresched epoll / peer. Its echo against the
# hand-written epoll server; its wake-ups and sleeps against io_uring's.
EPOLL_TARGETS = {
    ("echo", "rps", "epoll"): (">=", 0.95),
    ("wake", "p50", "coresched"): ("<=", 1.1),
    ("wake", "p99", "coresched"): ("<=", 1.1),
    ("wake_any", "p50", "coresched"): ("<=", 1.1),
    ("wake_any", "p99", "coresched"): ("<=", 1.1),
    ("sleep", "p50", "coresched"): ("<=", 1.1),
    ("sleep", "p99", "coresched"): ("<=", 1.1),
}


def log(msg):
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="coresched peer suite: coresched vs Boost.Fiber, Go and threads; one table, ratios in one run.",
        epilog="Workloads: " + ", ".join(w.name for w in WORKLOADS))
    p.add_argument("--build-dir", default="build", help="CMake build directory (default: build)")
    p.add_argument("--bin-dir", help="where the peer programs are (default: BUILD_DIR/bench/peers)")
    p.add_argument("--no-build", action="store_true", help="do not run 'cmake --build BUILD_DIR --target peer-suite' first")
    p.add_argument("--quick", action="store_true", help="small sizes and 2 rounds (a smoke test, seconds)")
    p.add_argument("--rounds", type=int, help="invocations per figure; the median is reported (default 5, --quick 2)")
    p.add_argument("--only", action="append", default=[], metavar="WORKLOAD",
                   help="run only these workloads (repeatable or comma-separated)")
    p.add_argument("--peers", default="", help="comma-separated subset of peers (coresched is always run)")
    p.add_argument("--gap-us", type=float, default=300.0,
                   help="wake: the waker's pause before each wake, so the target has gone idle (default 300)")
    p.add_argument("--connections", type=int, help="echo: connections (default 1000, --quick 100)")
    p.add_argument("--echo-seconds", type=float, help="echo: measured seconds per round (default 2, --quick 0.3)")
    p.add_argument("--json", metavar="FILE", help="also write every figure, trial and ratio as JSON to FILE")
    p.add_argument("--check-json", action="store_true",
                   help="after writing --json, check its structure and that every figure is positive (for ctest)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per program invocation")
    a = p.parse_args(argv)
    a.only = [w for item in a.only for w in item.split(",") if w]
    for w in a.only:
        if w not in BY_NAME:
            p.error(f"unknown workload '{w}' (known: {', '.join(BY_NAME)})")
    a.peer_filter = [x for x in a.peers.split(",") if x]
    for x in a.peer_filter:
        if x not in DISPLAY:
            p.error(f"unknown peer '{x}' (known: {', '.join(DISPLAY)})")
    if a.check_json and not a.json:
        p.error("--check-json needs --json FILE")
    a.rounds = a.rounds or (2 if a.quick else 5)
    a.connections = a.connections or (100 if a.quick else 1000)
    a.echo_seconds = a.echo_seconds or (0.3 if a.quick else 2.0)
    a.bin_dir = a.bin_dir or os.path.join(a.build_dir, "bench", "peers")
    return a


def build(args):
    cmd = ["cmake", "--build", args.build_dir, "--target", "peer-suite"]
    log("building: " + " ".join(cmd))
    r = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
    if r.returncode != 0:
        sys.exit(f"peers: the build failed ({' '.join(cmd)})")


def available_peers(args):
    """Which peers can run; a missing Go is a skipped column, not a failure."""
    ok, skipped = [], []
    for name in DISPLAY:
        if args.peer_filter and name not in args.peer_filter and name != "coresched":
            continue
        progs = [PEERS[name][1]] if name in PEERS else []
        progs += [ECHO_SERVERS[name][1][0]] if name in ECHO_SERVERS else []
        missing = [p for p in progs if not os.access(os.path.join(args.bin_dir, p), os.X_OK)]
        if not missing:
            ok.append(name)
            continue
        why = f"{', '.join(missing)} not found in {args.bin_dir}"
        if PEERS.get(name, ("", ""))[1] == "peer-go" and not shutil.which("go"):
            why += " (go is not installed: apt-get install golang-go, then rebuild)"
        elif name == "coresched":
            sys.exit(f"peers: {why}; build first (cmake --build {args.build_dir} --target peer-suite)")
        log(f"skipping the {DISPLAY[name]} column: {why}")
        skipped.append({"peer": name, "reason": why})
    if not os.access(os.path.join(args.bin_dir, "peer-echo-client"), os.X_OK):
        sys.exit(f"peers: peer-echo-client not found in {args.bin_dir}")
    return ok, skipped


def parse_lines(out):
    figs = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            figs.append(json.loads(line))
    return figs


def peer_env(peer):
    return {**os.environ, **PEER_ENV.get(peer, {})}


def run_program(argv, timeout, env=None):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()[-400:]}")
    figs = parse_lines(r.stdout)
    if not figs:
        raise RuntimeError(f"{' '.join(argv)} printed no figure")
    return figs


def wait_for_port(proc, timeout):
    """Reads the server's 'PORT <n>' line (it prints it once it listens)."""
    deadline = time.monotonic() + timeout
    buf = ""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096).decode()
            if not chunk:
                break
            buf += chunk
            for line in buf.splitlines():
                if line.startswith("PORT "):
                    return int(line.split()[1])
        if proc.poll() is not None:
            break
    err = proc.stderr.read() or ""
    if isinstance(err, bytes):  # a server run with text=False
        err = err.decode(errors="replace")
    raise RuntimeError("the echo server did not announce its port: " + err[-400:])


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_echo(args, server):
    """One round: start `server`, drive it with the one shared client, stop it."""
    argv = [os.path.join(args.bin_dir, ECHO_SERVERS[server][1][0])] + ECHO_SERVERS[server][1][1:]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=False, env=peer_env(server))
    try:
        port = wait_for_port(proc, 20)
        client = [os.path.join(args.bin_dir, "peer-echo-client"), "--port", str(port), "--label", server,
                  "--connections", str(args.connections), "--seconds", str(args.echo_seconds),
                  "--warmup", str(0.1 if args.quick else 0.5)]
        return run_program(client, args.timeout)
    finally:
        stop(proc)


def run_one(args, w, peer):
    if w.name == "echo":
        return run_echo(args, peer)
    n = w.size(peer, args.quick)
    argv = [os.path.join(args.bin_dir, PEERS[peer][1]), w.name, "-n", str(n)] + PEERS[peer][2]
    if w.name.startswith("wake") or w.name == "sleep":
        argv += ["--gap-us", str(args.gap_us)]
    return run_program(argv, args.timeout, peer_env(peer))


def stats(values):
    return {
        "median": statistics.median(values), "min": min(values), "max": max(values),
        "mean": statistics.fmean(values), "stdev": statistics.pstdev(values),  # population stdev
        "trials": values,
    }


def run_all(args, peers_ok):
    """Returns results[workload][metric][peer] = stats + unit + size, and errors."""
    results, errors = {}, []
    selected = [w for w in WORKLOADS if not args.only or w.name in args.only]
    for w in selected:
        peers = [p for p in w.peers if p in peers_ok]
        if "coresched" not in peers:
            continue
        log(f"{w.name}: {w.what}; {', '.join(DISPLAY[p] for p in peers)}; {args.rounds} rounds")
        trials = {}  # (metric, peer) -> [values], plus units
        rounds_of = {}  # (metric, peer) -> the round of each value
        units = {}
        for r in range(args.rounds):
            order = peers[r % len(peers):] + peers[:r % len(peers)]  # rotate who goes first
            for peer in order:
                try:
                    t0 = time.monotonic()
                    figs = run_one(args, w, peer)
                except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
                    log(f"  {w.name} {DISPLAY[peer]}: FAILED: {e}")
                    errors.append({"workload": w.name, "peer": peer, "error": str(e)})
                    continue
                shown = []
                for f in figs:
                    trials.setdefault((f["metric"], peer), []).append(float(f["value"]))
                    rounds_of.setdefault((f["metric"], peer), []).append(r)
                    units[f["metric"]] = f["unit"]
                    shown.append(f"{f['metric']} {f['value']:.4g} {f['unit']}")
                log(f"  round {r + 1}/{args.rounds} {DISPLAY[peer]:<11} {', '.join(shown)}"
                    f"  ({time.monotonic() - t0:.1f} s)")
        for (metric, peer), vals in trials.items():
            entry = stats(vals)
            entry["rounds"] = rounds_of[(metric, peer)]
            entry["unit"] = units[metric]
            entry["size"] = args.connections if w.name == "echo" else w.size(peer, args.quick)
            results.setdefault(w.name, {}).setdefault(metric, {})[peer] = entry
    return results, errors


def ratios(results):
    """coresched / each peer; and the epoll backend / io_uring's and the epoll server (EPOLL_TARGETS)."""
    out = []
    for wname, metrics in results.items():
        w = BY_NAME[wname]
        for metric, by_peer in metrics.items():
            for us, targets in (("coresched", TARGETS), ("coresched_epoll", EPOLL_TARGETS)):
                ours = by_peer.get(us)
                if ours:
                    out += compare(w, metric, us, ours, by_peer, targets)
    return out


def compare(w, metric, us, ours, by_peer, targets):
    out = []
    for peer, theirs in by_peer.items():
        if peer == us or theirs["median"] <= 0:
            continue
        if us == "coresched" and peer == "coresched_epoll":
            continue  # shown once, as epoll / io_uring
        if us == "coresched_epoll" and (w.name, metric, peer) not in targets:
            continue
        # Each round's two figures were taken minutes apart at most, so their
        # ratio is what a slow or fast phase of the machine (it swings by
        # tens of per cent within one run) spares: the ratio is the median of
        # the rounds' ratios, with their spread; the medians' ratio is kept too.
        theirs_by_round = dict(zip(theirs["rounds"], theirs["trials"]))
        per_round = [v / theirs_by_round[r] for r, v in zip(ours["rounds"], ours["trials"])
                     if theirs_by_round.get(r, 0) > 0]
        ratio = statistics.median(per_round) if per_round else ours["median"] / theirs["median"]
        target = targets.get((w.name, metric, peer))
        met = None
        if target:
            met = ratio <= target[1] if target[0] == "<=" else ratio >= target[1]
        out.append({"workload": w.name, "metric": metric, "ours": us, "peer": peer, "ratio": ratio,
                    "ratio_stdev": statistics.pstdev(per_round) if per_round else 0.0, "round_ratios": per_round,
                    "ratio_of_medians": ours["median"] / theirs["median"],
                    "higher_is_better": w.higher_is_better,
                    "target": f"{target[0]}{target[1]}" if target else None, "met": met})
    return out


def fmt(v):
    if v >= 1e5:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def table(results, rats):
    """The one table: a row per (workload, metric, ours, peer); `ours` is
    coresched (its default backend) or coresched on epoll."""
    by_key = {(r["workload"], r["metric"], r["ours"], r["peer"]): r for r in rats}
    rows = [("workload", "metric", "unit", "ours", "value", "peer", "peer value", "ratio", "target", "met")]
    for w in WORKLOADS:
        for metric, by_peer in results.get(w.name, {}).items():
            first = True
            for us in ("coresched", "coresched_epoll"):
                ours = by_peer.get(us)
                if not ours:
                    continue
                ours_s = f"{fmt(ours['median'])} ±{fmt(ours['stdev'])}"
                shown = False
                for peer in [p for p in DISPLAY if p in by_peer and (w.name, metric, us, p) in by_key]:
                    theirs, r = by_peer[peer], by_key[(w.name, metric, us, peer)]
                    rows.append((w.name if first else "", metric if first else "", ours["unit"] if first else "",
                                 DISPLAY[us] if not shown else "", ours_s if not shown else "", DISPLAY[peer],
                                 f"{fmt(theirs['median'])} ±{fmt(theirs['stdev'])}",
                                 f"{r['ratio']:.3f} ±{r['ratio_stdev']:.3f}",
                                 r.get("target") or "", {True: "yes", False: "NO", None: ""}[r.get("met")]))
                    first, shown = False, True
                if not shown:  # no peer measured
                    rows.append((w.name if first else "", metric if first else "", ours["unit"] if first else "",
                                 DISPLAY[us], ours_s, "-", "-", "-", "", ""))
                    first = False
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(str(c).ljust(widths[j]) if j < 7 else str(c).rjust(widths[j])
                               for j, c in enumerate(row)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * wd for wd in widths))
    return "\n".join(lines)


def machine():
    info = {"cpus": os.cpu_count(), "allowed_cpus": len(os.sched_getaffinity(0)),
            "kernel": platform.release(), "python": platform.python_version()}
    go = shutil.which("go")
    if go:
        try:
            info["go"] = subprocess.run([go, "version"], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return info


def check_json(path):
    """The ctest check: structure and positive numbers, never timing."""
    with open(path) as f:
        doc = json.load(f)
    problems = []
    for key in ("suite", "machine", "command", "rounds", "results", "ratios", "skipped", "errors"):
        if key not in doc:
            problems.append(f"missing key '{key}'")
    if doc.get("errors"):
        problems.append(f"{len(doc['errors'])} invocation(s) failed: {doc['errors'][0]}")
    for wname, metrics in doc.get("results", {}).items():
        if wname not in BY_NAME:
            problems.append(f"unknown workload {wname}")
        for metric, by_peer in metrics.items():
            if "coresched" not in by_peer:
                problems.append(f"{wname}/{metric}: no coresched figure")
            for peer, s in by_peer.items():
                for k in ("median", "min", "max", "mean", "stdev", "trials", "unit", "size"):
                    if k not in s:
                        problems.append(f"{wname}/{metric}/{peer}: missing '{k}'")
                if not s.get("trials") or any(not (v > 0) for v in s.get("trials", [])):
                    problems.append(f"{wname}/{metric}/{peer}: a trial is not positive: {s.get('trials')}")
                if not (s.get("median", 0) > 0) or s.get("stdev", -1) < 0:
                    problems.append(f"{wname}/{metric}/{peer}: bad median/stdev")
    for r in doc.get("ratios", []):
        if not (r.get("ratio", 0) > 0) or not (r.get("ratio_of_medians", 0) > 0) or r.get("ratio_stdev", -1) < 0:
            problems.append(f"ratio not positive, or its stdev negative: {r}")
    return problems


def main(argv):
    args = parse_args(argv)
    if not args.no_build:
        build(args)
    peers_ok, skipped = available_peers(args)
    started = time.time()
    results, errors = run_all(args, peers_ok)
    rats = ratios(results)
    print(f"coresched peer suite: {machine()['allowed_cpus']} CPUs, {'quick' if args.quick else 'full'} sizes, "
          f"median of {args.rounds} rounds ± population stdev; ratio = ours / peer, the median of each round's "
          f"ratio ± their stdev (echo: requests/s, higher is better; everything else: lower is better)")
    print(table(results, rats))
    for s in skipped:
        print(f"skipped: {DISPLAY[s['peer']]}: {s['reason']}")
    for e in errors:
        print(f"FAILED: {e['workload']} on {DISPLAY[e['peer']]}: {e['error']}")
    log(f"done in {time.time() - started:.0f} s")
    if args.json:
        doc = {"suite": "coresched-peers", "version": 1, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "machine": machine(), "command": " ".join([sys.argv[0]] + argv), "quick": args.quick,
               "rounds": args.rounds, "gap_us": args.gap_us, "connections": args.connections,
               "echo_seconds": args.echo_seconds, "results": results, "ratios": rats,
               "skipped": skipped, "errors": errors}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
        if args.check_json:
            problems = check_json(args.json)
            for p in problems:
                print(f"check: {p}", file=sys.stderr)
            if problems:
                return 1
            log(f"{args.json}: structure OK, every figure positive")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
