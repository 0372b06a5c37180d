#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`coresched-bench top`: the JSON lines are complete and their figures add up
for a workload whose shape is known (two compute tenants that never sleep on
one SMT-2 core: the core always has an owner, the cookies change hands, and
the compute cookies hold most of the CPU); the table mode prints a frame."""
import json
import subprocess
import sys

bench = sys.argv[1]
run = subprocess.run([bench, "top", "--time", "2.6", "--interval", "500", "--json", "--cookies", "2",
                      "--topology", "core:1 pu:2"], capture_output=True, text=True, timeout=60)
assert run.returncode == 0, run.stderr
frames = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
assert len(frames) >= 4, f"expected 6 frames in 2.6 s at 500 ms (the last of 0.1 s), got {len(frames)}:\n{run.stdout}"
for f in frames:
    assert set(f) == {"t", "cores", "cpu_share", "cookies"}, f
    assert len(f["cores"]) == 1, f
    c = f["cores"][0]
    for k in ("core", "owner", "forced_idle_pct", "forced_idle_pus_now", "handovers_per_s", "queued"):
        assert k in c, (k, c)
    assert 0 <= c["forced_idle_pct"] <= 100, c
    assert c["owner"] is not None, f"two busy tenants: the core always has an owner ({c})"
    assert 0 <= sum(f["cpu_share"].values()) <= 1.05, f
    assert c["handovers_per_s"] > 0, f"two busy tenants share the core by turns ({c})"
shares = [sum(f["cpu_share"].values()) for f in frames[1:]]
assert min(shares) > 0.5, f"the compute tenants should hold most of the 2 PUs: {shares}"
times = [f["t"] for f in frames]
assert times == sorted(times), times

table = subprocess.run([bench, "top", "--time", "1.2", "--interval", "500", "--topology", "core:1 pu:2"],
                       capture_output=True, text=True, timeout=60)
assert table.returncode == 0, table.stderr
assert "--- t=" in table.stdout and "hand-overs/s" in table.stdout, table.stdout
print(f"ok: {len(frames)} frames, cpu shares {['%.2f' % s for s in shares]}")
