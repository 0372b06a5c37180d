#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A/B of echo servers: runs two or more echo server programs alternately
(round 1 of each, then round 2, ...) against peer-echo-client, so a slow phase
of this noisy machine hits every server alike, and prints per server the
requests/s of each round and, from /proc over the measured seconds, the CPU of
each of its threads and how often each woke (voluntary context switches: for
coresched, `coresched-tick` is the slice ticker).

  bench/peers/echo_ab.py --server old=/tmp/old/peer-echo-coresched \\
      --server new=build/bench/peers/peer-echo-coresched --rounds 4

A server prints "PORT <n>" once it listens and serves until SIGTERM, as the
servers here do (peer-echo-coresched, peer-echo-epoll). Arguments after a
server's path, separated by commas, go to it: --server "slow=PATH,--slice-us,20000".
--json FILE writes every round's figures. Standard library only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (wait_for_port, stop, parse_lines)


def thread_table(pid):
    """{tid: (name, cpu ticks, voluntary switches)} for every thread of `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                vol = next(int(l.split()[1]) for l in f if l.startswith("voluntary_ctxt_switches"))
        except (FileNotFoundError, StopIteration, ProcessLookupError):
            continue
        out[tid] = (name, int(fields[11]) + int(fields[12]), vol)  # utime + stime
    return out


def one_round(argv, client, args):
    """Starts the server, drives it, returns {rps, threads: {name: [cpu_s, wakeups_per_s]}}."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        port = peers.wait_for_port(proc, 20)
        cmd = [client, "--port", str(port), "--connections", str(args.connections), "--seconds", str(args.seconds),
               "--warmup", str(args.warmup), "--label", "server"]
        drive = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(args.warmup + 0.1)
            t0, before = time.monotonic(), thread_table(proc.pid)
            time.sleep(max(args.seconds - 0.2, 0.1))
            t1, after = time.monotonic(), thread_table(proc.pid)
            out, err = drive.communicate(timeout=args.seconds + 60)
        finally:
            if drive.poll() is None:
                drive.kill()
                drive.wait()
        if drive.returncode != 0:
            raise RuntimeError(f"the client exited {drive.returncode}: {err.strip()[-300:]}")
        figs = peers.parse_lines(out)
        if not figs:
            raise RuntimeError("the client printed no figure")
        hz = os.sysconf("SC_CLK_TCK")
        threads = {}
        for tid, (name, cpu, vol) in after.items():
            if tid in before:
                cpu0, vol0 = before[tid][1], before[tid][2]
                agg = threads.setdefault(name, [0.0, 0.0])
                agg[0] += (cpu - cpu0) / hz
                agg[1] += (vol - vol0) / (t1 - t0)
        return {"rps": figs[0]["value"], "threads": threads}
    finally:
        peers.stop(proc)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--server", action="append", required=True, metavar="LABEL=PATH[,ARG...]",
                   help="a server to compare (two or more)")
    p.add_argument("--client", default="build/bench/peers/peer-echo-client", help="the load generator")
    p.add_argument("--rounds", type=int, default=4, help="rounds per server (default 4)")
    p.add_argument("--connections", type=int, default=1000, help="connections (default 1000)")
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per round (default 3)")
    p.add_argument("--warmup", type=float, default=0.5, help="warm-up seconds per round (default 0.5)")
    p.add_argument("--json", metavar="FILE", help="also write every round's figures to FILE")
    args = p.parse_args(argv)
    servers = []
    for s in args.server:
        label, sep, rest = s.partition("=")
        if not sep or not label or not rest:
            p.error(f"--server wants LABEL=PATH[,ARG...], not '{s}'")
        cmd = rest.split(",")
        if not os.access(cmd[0], os.X_OK):
            p.error(f"--server {label}: '{cmd[0]}' is not an executable file")
        servers.append((label, cmd))
    if len(servers) < 2:
        p.error("give at least two --server")
    if len({label for label, _ in servers}) != len(servers):
        p.error("each --server needs a label of its own")
    if not os.access(args.client, os.X_OK):
        p.error(f"the client '{args.client}' is not an executable file (--client)")
    if args.rounds < 1 or args.connections < 1 or not args.seconds > 0.5 or args.warmup < 0:
        p.error("--rounds and --connections must be positive, --seconds above 0.5, --warmup not negative")
    results = {label: [] for label, _ in servers}
    try:
        for r in range(args.rounds):
            for label, cmd in servers:
                res = one_round(cmd, args.client, args)
                results[label].append(res)
                print(f"[echo_ab] round {r + 1}/{args.rounds} {label}: {res['rps']:,.0f} req/s", file=sys.stderr)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        sys.exit(f"echo_ab: {e}")
    # The ratio to the first server is the median of each round's ratio: a
    # round's servers ran back to back, so a slow phase of the machine
    # between rounds cancels out.
    first = results[servers[0][0]]
    print(f"{'server':<12} {'req/s median':>13} {'vs ' + servers[0][0]:>10}  rounds; per thread: CPU s, wake-ups/s")
    for label, _ in servers:
        rounds = results[label]
        med = statistics.median(x["rps"] for x in rounds)
        vs = statistics.median(x["rps"] / f["rps"] for x, f in zip(rounds, first))
        print(f"{label:<12} {med:>13,.0f} {vs:>10.3f}  " + " ".join(f"{x['rps']:,.0f}" for x in rounds))
        names = sorted({n for x in rounds for n in x["threads"]})
        for n in names:
            cpu = statistics.median(x["threads"].get(n, [0, 0])[0] for x in rounds)
            wake = statistics.median(x["threads"].get(n, [0, 0])[1] for x in rounds)
            print(f"    {n:<20} {cpu:6.2f} s  {wake:8,.0f}/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"servers": {l: c for l, c in servers}, "connections": args.connections,
                       "seconds": args.seconds, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
