#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A/B of builds: runs one `coresched-bench` command with two or more
coresched-bench binaries, alternately (run 1 of each, then run 2, ...), so a
slow phase of this noisy machine hits every build alike, and prints the median,
min and max of chosen figures of the command's --json output per build.

  bench/ab/ab.py --bin old=/tmp/old/coresched-bench --bin new=build/bench/coresched_bench/coresched-bench \\
      --runs 8 --field placements.0.latency.percentiles.p50 --field placements.0.latency.percentiles.p99 \\
      -- schbench --runtime 5

A field is a dotted path into the JSON (list indices are numbers). Progress
goes to stderr; --json FILE writes every run's figures. Standard library only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def lookup(doc, path):
    node = doc
    for part in path.split("."):
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise KeyError(path)
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise KeyError(path)
    if not isinstance(node, (int, float)):
        raise KeyError(path)
    return float(node)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bin", action="append", required=True, metavar="LABEL=PATH",
                   help="a build to compare (two or more)")
    p.add_argument("--runs", type=int, default=6, help="runs of each build (default 6)")
    p.add_argument("--field", action="append", required=True, metavar="PATH",
                   help="a dotted path into the command's --json output")
    p.add_argument("--json", metavar="FILE", help="also write every run's figures here")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the coresched-bench command and its options")
    a = p.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        p.error("give the coresched-bench command after --")
    if "--json" in cmd:
        p.error("the command's --json is set by ab.py")
    if a.runs < 1:
        p.error("--runs must be at least 1")
    bins = []
    for b in a.bin:
        label, sep, path = b.partition("=")
        if not sep or not label or not path:
            p.error(f"--bin wants LABEL=PATH, got {b!r}")
        if not os.access(path, os.X_OK):
            p.error(f"{path}: not an executable file")
        bins.append((label, path))
    if len(bins) < 2:
        p.error("give two or more --bin")
    if len({l for l, _ in bins}) != len(bins):
        p.error("--bin labels must differ")
    return a, cmd, bins


def main(argv):
    a, cmd, bins = parse_args(argv)
    figures = {label: {f: [] for f in a.field} for label, _ in bins}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        for run in range(1, a.runs + 1):
            for label, path in bins:
                print(f"[ab] run {run}/{a.runs}: {label}", file=sys.stderr, flush=True)
                r = subprocess.run([path, *cmd, "--json", out], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True)
                if r.returncode != 0:
                    sys.exit(f"ab.py: {label} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
                with open(out) as fh:
                    doc = json.load(fh)
                for f in a.field:
                    try:
                        figures[label][f].append(lookup(doc, f))
                    except KeyError:
                        sys.exit(f"ab.py: {label}'s output has no number at {f!r}")
    width = max(len(l) for l, _ in bins)
    for f in a.field:
        print(f"{f} (median [min, max] of {a.runs} runs)")
        base = statistics.median(figures[bins[0][0]][f])
        for label, _ in bins:
            v = figures[label][f]
            med = statistics.median(v)
            ratio = f"  {med / base:.3f} of {bins[0][0]}" if base else ""
            print(f"  {label:<{width}}  {med:12.1f}  [{min(v):.1f}, {max(v):.1f}]{ratio}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"command": cmd, "runs": a.runs, "figures": figures}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
