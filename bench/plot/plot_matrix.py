#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Bar chart of a `coresched-bench matrix --json FILE` result.

Panels: CPU events/s, memory MiB/s and forced idle % per configuration, with
ours (coresched's fibers) beside the kernel's (PR_SCHED_CORE threads,
--compare-kernel) and sysbench's (--compare-sysbench) where the file has them;
each bar the average over the runs, its error bar the population stdev. Where
the two tenants compete for the core, a fourth panel shows the cpu tenant's
share of it, measured by each way, and, for a weighted run (--weights), the
share the weights ask for as a marker.

Prints one line per chart naming the series it drew and how many bars each
has ("drew: cpu ours=6 kernel=6 ..."), so a test can check them.
"""
import argparse
import json
import math
import sys

# The ways a result file can hold, in drawing order: (JSON key, label, color).
# "ours" is the top level; the others sit under their key when available.
WAYS = [("ours", "coresched", "tab:blue"), ("kernel", "kernel (PR_SCHED_CORE)", "tab:red"),
        ("sysbench", "sysbench processes", "tab:green")]

# The share series: (label in the summary line, way, share key, legend, color).
SHARES = [("ours_run", "ours", "cpu_run_pct", "coresched (fibers' run time)", "navy"),
          ("ours_core", "ours", "cpu_core_pct", "coresched (core_ns)", "tab:blue"),
          ("ours_thread", "ours", "cpu_thread_pct", "coresched (thread CPU time)", "lightsteelblue"),
          ("kernel_thread", "kernel", "cpu_thread_pct", "kernel (thread CPU time)", "tab:red")]


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
    p.add_argument("-o", "--output", help="image to write, PNG or SVG by its suffix (default: the JSON path with .png)")
    p.add_argument("--title", help="chart title (default: built from the topology and policy)")
    p.add_argument("--dpi", type=int, default=120, help="resolution (default: 120)")
    return p.parse_args(argv)


def load(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if data.get("benchmark") != "matrix" or "configs" not in data:
        sys.exit(f"{path}: not a coresched-bench matrix result")
    return data


def ways(data):
    """{way: {config name: row}} for each way the file holds rows of, and the
    reasons of those it marks unavailable."""
    rows, skipped = {"ours": {c["name"]: c for c in data["configs"]}}, {}
    for key, _, _ in WAYS[1:]:
        block = data.get(key)
        if not block:
            continue
        if block.get("available") and block.get("configs"):
            rows[key] = {c["name"]: c for c in block["configs"]}
        elif not block.get("available"):
            skipped[key] = block.get("reason", "unavailable")
    return rows, skipped


def figure(row, key):
    """(avg, stdev) of one summary of a row, or None where it lacks it
    (memory for "Alone", forced idle where not measured)."""
    s = row.get(key) if row else None
    if not isinstance(s, dict) or s.get("avg") is None:
        return None
    return s["avg"], s.get("stdev") or 0.0


def grouped(ax, names, series, ylabel, fmt="{:.0f}"):
    """Bars of each (key, legend, color, [(avg, stdev) or None per name])
    side by side per name, error bars the stdev; returns {key: bars drawn}."""
    drawn = {}
    width = 0.8 / max(len(series), 1)
    for k, (key, label, color, values) in enumerate(series):
        xs, avg, err = [], [], []
        for i, v in enumerate(values):
            if v is not None:
                xs.append(i - 0.4 + width * (k + 0.5))
                avg.append(v[0])
                err.append(v[1])
        drawn[key] = len(xs)
        if not xs:
            continue
        bars = ax.bar(xs, avg, width, yerr=err, capsize=3, color=color, edgecolor="black", linewidth=0.5,
                      label=label)
        for b, v, e in zip(bars, avg, err):
            if math.isfinite(v):  # label above the error bar, so neither hides the other
                ax.annotate(fmt.format(v), (b.get_x() + b.get_width() / 2, v + e), ha="center", va="bottom",
                            fontsize=6, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    if any(drawn.values()):
        ax.legend(fontsize=7)
    return drawn


def throughput_series(rows, names, key):
    return [(way, label, color, [figure(rows[way].get(n), key) for n in names])
            for way, label, color in WAYS if way in rows]


def share_panel(ax, data, rows):
    """The cpu tenant's share of the core in the configurations where the
    tenants compete; the expected share as a marker on weighted runs.
    Returns ({series: bars}, markers drawn), or None if no row has shares."""
    names = [n for n, c in rows["ours"].items() if c.get("shares")]
    if not names:
        return None
    series = []
    for label, way, key, legend, color in SHARES:
        if way in rows:
            shares = [(rows[way].get(n) or {}).get("shares") or {} for n in names]
            series.append((label, legend, color, [figure(s, key) for s in shares]))
    counts = grouped(ax, names, series, "cpu tenant's share of the core, %", "{:.1f}")
    markers = 0
    if (data.get("weights") or {}).get("set"):
        expected = [rows["ours"][n]["shares"]["expected_cpu_pct"] for n in names]
        # A dashed line across each group: a point would hide behind the middle bar.
        ax.hlines(expected, [i - 0.45 for i in range(len(names))], [i + 0.45 for i in range(len(names))],
                  colors="black", linestyles="--", linewidth=1.5, zorder=5, label="expected (weight / sum)")
        markers = len(expected)
        w = data["weights"]
        ax.set_title(f"share of the core, weights cpu {w['cpu']} : mem {w['mem']}")
    else:
        ax.set_title("share of the core (equal weights)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=7)
    return counts, markers


def default_title(data):
    topo = data.get("topology", {})
    kind = "real siblings" if topo.get("real_siblings") else "SYNTHETIC siblings"
    spec = topo.get("spec") or topo.get("source", "")
    return (f"coresched matrix — {spec} ({kind}), policy {data.get('policy')}, "
            f"{data.get('runs')} × {data.get('time_s')} s")


def main(argv=None):
    args = parse_args(argv)
    data = load(args.json)
    rows, skipped = ways(data)
    names = list(rows["ours"])
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    (cpu_ax, mem_ax), (idle_ax, share_ax) = axes
    drawn = {
        "cpu": grouped(cpu_ax, names, throughput_series(rows, names, "cpu_events_per_s"), "cpu events/s (higher is better)"),
        "mem": grouped(mem_ax, names, throughput_series(rows, names, "mem_mib_per_s"), "memory MiB/s (higher is better)"),
        "forced_idle": grouped(idle_ax, names, throughput_series(rows, names, "forced_idle_pct"),
                               "forced idle, % of run time x siblings", "{:.1f}"),
    }
    cpu_ax.set_title("sysbench cpu")
    mem_ax.set_title("sysbench memory")
    idle_ax.set_title("forced idle")
    shares = share_panel(share_ax, data, rows)
    if shares is None:
        share_ax.set_axis_off()
    else:
        drawn["shares"] = dict(shares[0], expected=shares[1])
    if skipped:
        fig.text(0.01, 0.005, "; ".join(f"{k} skipped: {why}" for k, why in skipped.items()), fontsize=7)
    fig.suptitle(args.title or default_title(data), fontsize=10)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    out = args.output or (args.json[:-5] if args.json.endswith(".json") else args.json) + ".png"
    fig.savefig(out, dpi=args.dpi)
    print("drew: " + " | ".join(f"{panel} " + " ".join(f"{k}={v}" for k, v in series.items())
                                for panel, series in drawn.items()))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
