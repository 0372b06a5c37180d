#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs one of `coresched-bench latt|schbench|hackbench|tenants` briefly on
synthetic siblings and checks its JSON is complete and sane, and that bad
arguments fail with a message (used by ctest).

usage: check_seed_json.py BENCH SUBCOMMAND
"""
import json
import math
import subprocess
import sys
import tempfile
import time

SYNTHETIC = "package:1 l3cache:1 core:1 pu:2"


def run_json(bench, args, timeout=60):
    """Runs the subcommand with --json; returns the parsed file."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([bench, *args, "--json", out.name], check=True, stdout=subprocess.DEVNULL, timeout=timeout)
        return json.load(open(out.name))


def rejects(bench, args, why):
    """The arguments must fail with a non-zero exit and say something on stderr."""
    p = subprocess.run([bench, *args], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0, f"{args} ({why}) exited 0"
    assert p.stderr.strip() or p.stdout.strip(), f"{args} ({why}) failed without a message"


def check_head(d, benchmark):
    assert d["benchmark"] == benchmark, d["benchmark"]
    topo = d["topology"]
    assert topo["real_siblings"] is False and topo["pus_total"] == 2, topo
    for k in ("policy", "wakeup_placement", "slice_us", "coresched_version", "units"):
        assert k in d, f"missing {k}"
    assert d["io_backend"] in ("io_uring", "epoll") and d["io_backend_reason"], (d["io_backend"],
                                                                                 d["io_backend_reason"])


def check_latency(block, ps, what):
    """count > 0, 0 <= min <= avg <= max, stdev >= 0, stdev_mean = stdev/sqrt(n),
    percentiles present and ordered between min and max."""
    n = block["count"]
    assert n > 0, (what, block)
    assert 0 <= block["min"] <= block["avg"] <= block["max"], (what, block)
    assert block["stdev"] >= 0 and block["unit"] == "us", (what, block)
    assert math.isclose(block["stdev_mean"], block["stdev"] / math.sqrt(n), rel_tol=1e-9, abs_tol=1e-9), (what, block)
    values = [block["percentiles"][f"p{p}"] for p in ps]
    assert values == sorted(values), (what, values)
    assert block["min"] <= values[0] and values[-1] <= block["max"], (what, values, block)


def check_summary(s, unit, what):
    assert s["avg"] > 0 and s["stdev"] >= 0 and s["unit"] == unit, (what, s)


def latt(bench):
    d = run_json(bench, ["latt", "--topology", SYNTHETIC, "-c", "4", "--time", "1.5", "--min-wait", "20",
                         "--max-wait", "60", "--work-kb", "16", "--load-fibers", "2"])
    check_head(d, "latt")
    assert d["clients"] == 4 and d["rounds"] > 0, d
    assert d["entries"] == d["rounds"] * d["clients"], (d["entries"], d["rounds"])
    assert 0 < d["compressed_bytes"] < 16 * 1024, d["compressed_bytes"]
    for k in ("wakeup", "work"):
        check_latency(d[k], [50, 90, 99], k)
        assert d[k]["count"] == d["entries"]
    assert d["threads"] is None, d["threads"]
    # --compare-threads: the same rounds on kernel threads, and the ratios of the two.
    d = run_json(bench, ["latt", "--topology", SYNTHETIC, "-c", "3", "--runs", "3", "--min-wait", "10",
                         "--max-wait", "20", "--work-kb", "16", "--load-fibers", "1", "--compare-threads"])
    t = d["threads"]
    assert d["rounds"] == 3 and t["rounds"] == 3 and t["entries"] == 9 and d["entries"] == 9, (d["rounds"], t)
    for k in ("wakeup", "work"):
        check_latency(t[k], [50, 90, 99], "threads " + k)
        r = d["ratios_fibers_over_threads"][k + "_avg"]
        assert math.isclose(r, d[k]["avg"] / t[k]["avg"], rel_tol=1e-6), (k, r)
    # A background process is killed at the end, with its children: this must not wait a minute.
    t0 = time.monotonic()
    d = run_json(bench, ["latt", "--topology", SYNTHETIC, "-c", "2", "--runs", "2", "--min-wait", "5", "--max-wait",
                         "10", "--load-cmd", "sleep 60 & sleep 60", "--slice-us", "2000"], timeout=30)
    assert time.monotonic() - t0 < 10, "the load command was not killed"
    assert d["load"]["cmd"] == "sleep 60 & sleep 60" and d["load"]["cmd_exited_early"] is False, d["load"]
    assert d["rounds"] == 2 and d["entries"] == 4, d
    assert d["slice_us"] == 2000, d["slice_us"]  # --slice-us reaches the runtime
    rejects(bench, ["latt", "--min-wait", "600", "--max-wait", "500"], "min above max")
    rejects(bench, ["latt", "--slice-us", "0"], "zero slice")
    rejects(bench, ["latt", "--time", "0"], "zero time")
    return f"{d['entries']} entries"


def schbench(bench):
    d = run_json(bench, ["schbench", "--topology", SYNTHETIC, "-m", "2", "-t", "4", "--runtime", "0.8",
                         "--sleeptime", "5000", "--cputime", "1000", "--compare"])
    check_head(d, "schbench")
    assert [p["placement"] for p in d["placements"]] == ["mask", "scan"], d["placements"]
    for p in d["placements"]:
        check_latency(p["latency"], [50, 75, 90, 95, 99, 99.5, 99.9], p["placement"])
        assert p["elapsed_s"] > 0.5, p
    assert d["p99_ratio_mask_over_scan"] is not None and d["p99_ratio_mask_over_scan"] > 0
    rejects(bench, ["schbench", "--placement", "nearest"], "unknown placement")
    rejects(bench, ["schbench", "--compare", "--placement", "scan"], "--compare with --placement")
    return f"p99 mask/scan {d['p99_ratio_mask_over_scan']:.2f}"


def hackbench(bench):
    results = []
    for ipc in ([], ["--pipe"], ["--socket"]):
        d = run_json(bench, ["hackbench", "--topology", SYNTHETIC, "-g", "2", "-f", "5", "-l", "20", "--runs", "2",
                             "--compare", *ipc])
        check_head(d, "hackbench")
        assert d["ipc"] == (ipc[0][2:] if ipc else "channel"), d["ipc"]
        assert d["messages_per_run"] == 2 * 5 * 5 * 20, d["messages_per_run"]
        assert [p["placement"] for p in d["placements"]] == ["mask", "scan"]
        for p in d["placements"]:
            check_summary(p["time_s"], "s", p["placement"])
            assert len(p["runs"]) == 2
            for r in p["runs"]:
                assert r["time_s"] > 0 and r["out_of_order"] == 0 and r["io_errors"] == 0, r
        assert d["time_ratio_mask_over_scan"] > 0
        results.append(f"{d['ipc']} {d['placements'][0]['time_s']['avg'] * 1e3:.1f} ms")
    rejects(bench, ["hackbench", "--pipe", "--socket"], "two transports")
    rejects(bench, ["hackbench", "-g", "0"], "no groups")
    return ", ".join(results)


def tenants(bench):
    d = run_json(bench, ["tenants", "--topology", SYNTHETIC, "--time", "0.6", "--runs", "2", "--compare",
                         "--table-mb", "8", "--compute-fibers", "2", "--request-fibers", "2"])
    check_head(d, "tenants")
    assert [p["policy"] for p in d["policies"]] == ["core_vruntime", "forceidle_balance"], d["policies"]
    for p in d["policies"]:
        for k, unit in (("requests_per_s", "requests/s"), ("latency_avg", "us"), ("latency_p95", "us"),
                        ("gemms_per_s", "GEMMs/s")):
            check_summary(p[k], unit, (p["policy"], k))
        assert 0 < p["a_cpu_share_pct"]["avg"] < 100, p["a_cpu_share_pct"]
        assert 0 <= p["forced_idle_pct"]["avg"] <= 100, p["forced_idle_pct"]
        assert len(p["runs"]) == 2
        for r in p["runs"]:
            assert r["requests"] > 0 and r["gemms"] > 0 and r["bad_results"] == 0, r
            check_latency(r["latency"], [50, 95, 99, 99.9], p["policy"])
    assert d["kernel"] is None and d["coresched_over_kernel"] is None, (d["kernel"], d["coresched_over_kernel"])
    ratios = d["core_vruntime_over_forceidle_balance"]
    assert ratios and all(v > 0 for v in ratios.values()), ratios
    # --think-us: the clients sleep between requests; the field reaches the JSON and requests still complete.
    t = run_json(bench, ["tenants", "--topology", SYNTHETIC, "--time", "0.4", "--runs", "1", "--table-mb", "8",
                         "--compute-fibers", "2", "--request-fibers", "2", "--think-us", "200",
                         "--preempt-rows", "16"])
    assert t["think_us"] == 200, t["think_us"]
    assert t["preempt_rows"] == 16, t["preempt_rows"]
    tr = t["policies"][0]["runs"][0]
    assert tr["requests"] > 0 and tr["bad_results"] == 0, tr
    # 2 clients, each at most one request per 200 us think: at most 10,000 req/s (a closed loop does ~250,000).
    assert t["policies"][0]["requests_per_s"]["avg"] < 10000, t["policies"][0]["requests_per_s"]
    # --compare-kernel: the kernel's side where PR_SCHED_CORE works (the SMT guest), else skipped with the reason.
    k = run_json(bench, ["tenants", "--topology", SYNTHETIC, "--time", "0.4", "--runs", "1", "--table-mb", "8",
                         "--compute-fibers", "2", "--request-fibers", "2", "--compare-kernel"])
    assert k["compare_kernel"] is True, k["compare_kernel"]
    assert k["preempt_rows"] == 1, k["preempt_rows"]  # the default: a preemption point after every GEMM row
    if k["kernel"]["available"]:
        kr = k["kernel"]["runs"]
        assert len(kr) == 1 and kr[0]["requests"] > 0 and kr[0]["gemms"] > 0 and kr[0]["bad_results"] == 0, kr
        check_latency(kr[0]["latency"], [50, 95, 99, 99.9], "kernel")
        assert k["coresched_over_kernel"]["latency_p99"] > 0, k["coresched_over_kernel"]
    else:
        assert "PR_SCHED_CORE" in k["kernel"]["reason"], k["kernel"]
        assert k["coresched_over_kernel"] is None, k["coresched_over_kernel"]
    rejects(bench, ["tenants", "--compare", "--compare-kernel"], "--compare with --compare-kernel")
    rejects(bench, ["tenants", "--compare", "--policy", "core_vruntime"], "--compare with --policy")
    rejects(bench, ["tenants", "--reads", "0"], "no reads")
    rejects(bench, ["tenants", "--think-us", "-1"], "negative think time")
    # --requests-alone: tenant B without tenant A, on both sides where the kernel's side runs.
    alone = run_json(bench, ["tenants", "--topology", SYNTHETIC, "--time", "0.4", "--runs", "1", "--table-mb", "8",
                             "--request-fibers", "2", "--think-us", "200", "--requests-alone", "--compare-kernel"])
    assert alone["requests_alone"] is True and alone["compute_fibers"] == 0, alone
    ar = alone["policies"][0]["runs"][0]
    assert ar["requests"] > 0 and ar["gemms"] == 0 and ar["bad_results"] == 0, ar
    if alone["kernel"]["available"]:
        assert alone["kernel"]["runs"][0]["requests"] > 0 and alone["kernel"]["runs"][0]["gemms"] == 0, alone["kernel"]
        # No GEMMs on either side: no GEMM ratio (null), the latency ratios as usual.
        q = alone["coresched_over_kernel"]
        assert q["gemms_per_s"] is None and q["latency_p99"] > 0, q
    for other in (["--compute-fibers", "2"], ["--preempt-rows", "4"], ["--weights", "300:100"], ["--compare"]):
        rejects(bench, ["tenants", "--requests-alone", *other], f"--requests-alone with {other[0]}")
    rejects(bench, ["tenants", "--preempt-rows", "0"], "no rows between preemption points")
    rejects(bench, ["tenants", "--preempt-rows", "65"], "more rows than a GEMM has")
    return f"req/s ratio {ratios['requests_per_s']:.2f}"


def main():
    bench, sub = sys.argv[1], sys.argv[2]
    checks = {"latt": latt, "schbench": schbench, "hackbench": hackbench, "tenants": tenants}
    print(f"{sub} JSON ok: {checks[sub](bench)}")


if __name__ == "__main__":
    main()
