#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs `coresched-bench matrix --weights 300:100` and `tenants --weights
300:100` briefly on CORESCHED_TOPOLOGY="core:1 pu:2" and checks their JSON
carries the weights, the expected shares and the measured ones, in shape and
roughly (the exact share is the runtime's own tests' to check), and that bad
--weights fail with a message and a parse error's exit status, never a crash
(used by ctest).

usage: check_weights.py BENCH
"""
import json
import math
import os
import subprocess
import sys
import tempfile

bench = sys.argv[1]
env = dict(os.environ, CORESCHED_TOPOLOGY="core:1 pu:2")


def run_json(args, timeout=120):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([bench, *args, "--json", out.name], check=True, stdout=subprocess.DEVNULL, env=env,
                       timeout=timeout)
        return json.load(open(out.name))


def summary(s, what):
    assert isinstance(s, dict) and s["unit"] == "%", (what, s)
    assert 0 <= s["avg"] <= 100 and s["stdev"] >= 0, (what, s)
    return s["avg"]


# matrix: the weights, and the shares where the two cookies compete.
d = run_json(["matrix", "--weights", "300:100", "--time", "0.5", "--runs", "2", "--config", "Alone",
              "--config", "no tag", "--config", "cpu tagged", "--config", "both tagged"])
assert d["topology"]["spec"].replace("package:1 l3cache:1 ", "") == "core:1 pu:2", d["topology"]
w = d["weights"]
assert w["set"] is True and (w["cpu"], w["mem"]) == (300, 100), w
# 300:100 = 3: nice -5 (3121 / 1024 = 3.05) for the cpu threads, the default-weight tenant at nice 0.
assert w["kernel_nice"] == {"cpu": -5, "mem": 0} and w["kernel_weight"] == {"cpu": 3121, "mem": 1024}, w
rows = {c["name"]: c for c in d["configs"]}
for name in ("Alone", "no tag"):
    assert rows[name]["shares"] is None, (name, rows[name]["shares"])  # nothing to divide
for name in ("cpu tagged", "both tagged"):
    s = rows[name]["shares"]
    assert s["expected_cpu_pct"] == 75 and s["expected_mem_pct"] == 25, (name, s)
    for by in ("run", "core", "thread"):
        cpu = summary(s[f"cpu_{by}_pct"], (name, by))
        assert math.isclose(cpu + summary(s[f"mem_{by}_pct"], (name, by)), 100), (name, by, s)
    # Loose: well above the even split that ignored weights would give.
    # The runtime's books count wall time held, so a busy machine moves this little.
    assert 55 <= s["cpu_core_pct"]["avg"] <= 95, (name, s["cpu_core_pct"])
    assert 55 <= s["cpu_run_pct"]["avg"] <= 95, (name, s["cpu_run_pct"])
    for run in rows[name]["runs"]:
        for k in ("cpu_owned_ns", "mem_owned_ns", "cpu_run_ns", "mem_run_ns", "cpu_thread_cpu_ns", "mem_thread_cpu_ns"):
            assert run[k] > 0, (name, k, run)

# Without --weights: both at the default, an even split expected.
d = run_json(["matrix", "--time", "0.3", "--runs", "1", "--config", "both tagged"])
assert d["weights"]["set"] is False and (d["weights"]["cpu"], d["weights"]["mem"]) == (100, 100), d["weights"]
assert d["configs"][0]["shares"]["expected_cpu_pct"] == 50, d["configs"][0]["shares"]

# tenants: the weights and tenant A's share by core_ns and cpu_ns.
t = run_json(["tenants", "--weights", "300:100", "--time", "0.4", "--runs", "1", "--table-mb", "8"])
assert t["weights"] == {"set": True, "a": 300, "b": 100, "expected_a_share_pct": 75}, t["weights"]
# Shape only: in a run this short the tenants' start-up (the clients' first
# requests, the GEMM fibers' first placements) weighs too much for a bound.
for p in t["policies"]:
    summary(p["a_cpu_share_pct"], "tenants cpu_ns")
    summary(p["a_core_share_pct"], "tenants core_ns")
    assert p["runs"][0]["a_core_s"] > 0 and p["runs"][0]["b_core_s"] > 0, p["runs"][0]

# Bad input: CLI11's parse error (non-zero, not a signal) naming the option and the rule.
for sub in ("matrix", "tenants"):
    for bad, why in (("0:5", "1 to 10000"), ("abc", "A:B"), ("1:20000", "1 to 10000"), ("300", "A:B"),
                     ("300:100:5", "A:B"), ("-1:100", "1 to 10000"), ("3.5:1", "1 to 10000")):
        p = subprocess.run([bench, sub, "--weights", bad], capture_output=True, text=True, env=env, timeout=30)
        err = p.stderr + p.stdout
        assert 0 < p.returncode < 128, (sub, bad, p.returncode, err)
        assert "--weights" in err and why.replace(" to ", "") in err.replace(" to ", ""), (sub, bad, err)
print("weights ok: matrix cpu share (core_ns) "
      + ", ".join(f"{n} {rows[n]['shares']['cpu_core_pct']['avg']:.1f}%" for n in ("cpu tagged", "both tagged"))
      + " of 75% expected")
