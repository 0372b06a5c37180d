#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Percentile chart of `coresched-bench latt` and `schbench` results.

One line per latency measurement: latt's wake-up and work latencies, or
schbench's wake-up latency per wakeup placement (two lines with --compare).
The x axis runs through the percentiles the JSON holds, then the maximum; the
y axis is microseconds on a log scale. Several files go on one chart, e.g. latt
idle beside latt under load:

    plot_latency.py idle.json loaded.json -o latt.png --labels idle loaded
"""
import argparse
import json
import math
import os
import sys

from plot_matrix import pyplot  # the Agg-backend loader every chart here shares


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", nargs="+", help="result file(s) written by `coresched-bench latt|schbench --json`")
    p.add_argument("-o", "--output", help="PNG to write (default: the first JSON path with .png)")
    p.add_argument("--labels", nargs="+", help="one name per file for the legend (default: the file names)")
    p.add_argument("--title", help="chart title (default: built from the first file)")
    p.add_argument("--linear", action="store_true", help="linear y axis instead of log")
    p.add_argument("--dpi", type=int, default=120, help="resolution (default: 120)")
    args = p.parse_args(argv)
    if args.labels and len(args.labels) != len(args.json):
        p.error(f"--labels needs one name per file ({len(args.json)}), got {len(args.labels)}")
    return args


def load(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if data.get("benchmark") not in ("latt", "schbench"):
        sys.exit(f"{path}: not a coresched-bench latt or schbench result")
    return data


def measurements(data):
    """(name, latency block) pairs: what one file holds."""
    if data["benchmark"] == "latt":
        return [("wake-up", data["wakeup"]), ("work", data["work"])]
    return [(f"wake-up, {p['placement']}", p["latency"]) for p in data["placements"]]


def percentile_value(name):
    """'p99.5' -> 99.5, for ordering the x axis."""
    return float(name[1:])


def x_axis(blocks):
    """Every percentile any block has, in order, then the maximum."""
    names = sorted({k for b in blocks for k in b["percentiles"]}, key=percentile_value)
    return names + ["max"]


def ys(block, names):
    """The block's value at each x (NaN, drawn as a gap, where it lacks one)."""
    return [block["max"] if n == "max" else block["percentiles"].get(n, float("nan")) for n in names]


def default_title(data, several):
    """Built from the first file; the per-run settings only when it is the only one."""
    topo = data.get("topology", {})
    kind = "real siblings" if topo.get("real_siblings") else "SYNTHETIC siblings"
    spec = topo.get("spec") or topo.get("source", "")
    head = f"coresched {data['benchmark']} — {spec} ({kind}), policy {data.get('policy')}"
    if several:
        return head
    if data["benchmark"] == "latt":
        load = data.get("load", {})
        what = f"{data['clients']} clients, load: {load.get('fibers', 0)} fibers" + (
            f" + `{load['cmd']}`" if load.get("cmd") else "")
    else:
        what = f"{data['message_fibers']} x {data['workers_per_message_fiber']} workers"
    return f"{head}, {what}"


def main(argv=None):
    args = parse_args(argv)
    files = [load(p) for p in args.json]
    labels = args.labels or [os.path.basename(p) for p in args.json]
    series = []
    for label, data in zip(labels, files):
        for name, block in measurements(data):
            series.append((name if len(files) == 1 else f"{label}: {name}", block))
    names = x_axis([b for _, b in series])
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    for name, block in series:
        ax.plot(names, ys(block, names), marker="o", label=f"{name} (n={block['count']})")
    if not args.linear and all(v > 0 for _, b in series for v in ys(b, names) if math.isfinite(v)):
        ax.set_yscale("log")  # tails span decades; a zero would not fit a log axis
    ax.set_xlabel("percentile")
    ax.set_ylabel("latency, µs (lower is better)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(args.title or default_title(files[0], len(files) > 1), fontsize=9)
    fig.tight_layout()
    first = args.json[0]
    out = args.output or (first[:-5] if first.endswith(".json") else first) + ".png"
    fig.savefig(out, dpi=args.dpi)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
