#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Bar chart of a `coresched-bench matrix --json FILE` result.

Two panels side by side: CPU events/s and memory MiB/s per configuration,
each bar the average over the runs with the population stdev as error bar.
"""
import argparse
import json
import math
import sys


def pyplot():
    """matplotlib with the Agg backend (files only: no display on build machines).

    Imported on use so that --help works, and a missing package gets a hint."""
    try:
        import matplotlib
    except ImportError:
        sys.exit("matplotlib is missing: apt-get install python3-matplotlib (and run /usr/bin/python3)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", help="result file written by `coresched-bench matrix --json`")
    p.add_argument("-o", "--output", help="PNG to write (default: the JSON path with .png)")
    p.add_argument("--title", help="chart title (default: built from the topology and policy)")
    p.add_argument("--dpi", type=int, default=120, help="resolution (default: 120)")
    return p.parse_args(argv)


def load(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if data.get("benchmark") != "matrix" or "configs" not in data:
        sys.exit(f"{path}: not a coresched-bench matrix result")
    return data


def series(configs, key):
    """Averages and stdevs of one figure; NaN (no bar) where a configuration
    lacks it, e.g. memory for "Alone"."""
    nan = float("nan")
    avg, err = [], []
    for c in configs:
        s = c.get(key)
        avg.append(s["avg"] if s else nan)
        err.append(s["stdev"] if s else nan)
    return avg, err


def default_title(data):
    topo = data.get("topology", {})
    kind = "real siblings" if topo.get("real_siblings") else "SYNTHETIC siblings"
    spec = topo.get("spec") or topo.get("source", "")
    return (f"coresched matrix — {spec} ({kind}), policy {data.get('policy')}, "
            f"{data.get('runs')} × {data.get('time_s')} s")


def panel(ax, names, avg, err, ylabel, color):
    bars = ax.bar(names, avg, yerr=err, capsize=4, color=color, edgecolor="black", linewidth=0.5)
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", rotation=30)
    ax.grid(axis="y", alpha=0.3)
    for b, v, e in zip(bars, avg, err):
        if math.isfinite(v):  # label above the error bar, so neither hides the other
            ax.annotate(f"{v:.0f}", (b.get_x() + b.get_width() / 2, v + e), ha="center", va="bottom", fontsize=8,
                        xytext=(0, 2), textcoords="offset points")


def main(argv=None):
    args = parse_args(argv)
    data = load(args.json)
    configs = data["configs"]
    names = [c["name"] for c in configs]
    plt = pyplot()
    fig, (cpu_ax, mem_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
    panel(cpu_ax, names, *series(configs, "cpu_events_per_s"), "cpu events/s (higher is better)", "tab:blue")
    panel(mem_ax, names, *series(configs, "mem_mib_per_s"), "memory MiB/s (higher is better)", "tab:orange")
    cpu_ax.set_title("sysbench cpu")
    mem_ax.set_title("sysbench memory")
    fig.suptitle(args.title or default_title(data), fontsize=10)
    fig.tight_layout()
    out = args.output or (args.json[:-5] if args.json.endswith(".json") else args.json) + ".png"
    fig.savefig(out, dpi=args.dpi)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
