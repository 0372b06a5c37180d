#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs `coresched-bench matrix` briefly on synthetic siblings and checks its
JSON is complete and sane (used by ctest)."""
import json
import os
import subprocess
import sys
import tempfile

bench = sys.argv[1]
with tempfile.NamedTemporaryFile(suffix=".json") as out:
    subprocess.run([bench, "matrix", "--topology", "package:1 l3cache:1 core:1 pu:2", "--time", "0.6",
                    "--runs", "2", "--json", out.name], check=True, stdout=subprocess.DEVNULL)
    d = json.load(open(out.name))

rows = {c["name"]: c for c in d["configs"]}
expected = ["Alone", "nosmt", "no tag", "cpu tagged", "mem tagged", "both tagged"]
assert list(rows) == expected, f"configs {list(rows)}"
assert d["topology"]["real_siblings"] is False
assert d["io_backend"] in ("io_uring", "epoll") and d["io_backend_reason"], (d["io_backend"], d["io_backend_reason"])
for name, c in rows.items():
    cpu = c["cpu_events_per_s"]
    assert cpu["avg"] > 0 and cpu["stdev"] >= 0 and cpu["unit"] == "events/s", (name, cpu)
    assert len(c["runs"]) == 2
    if name != "Alone":
        mem = c["mem_mib_per_s"]
        assert mem["avg"] > 0 and mem["stdev"] >= 0, (name, mem)
alone = rows["Alone"]["cpu_events_per_s"]["avg"]
both = rows["both tagged"]
# Different cookies share the core: each fiber gets about half of it. Wide
# bounds: the rows run at different moments on a possibly shared machine; the
# failures they catch are co-running (~1.0) and starvation (~0).
ratio_cpu = both["cpu_events_per_s"]["avg"] / alone
ratio_mem = both["mem_mib_per_s"]["avg"] / rows["no tag"]["mem_mib_per_s"]["avg"]
assert 0.15 <= ratio_cpu <= 0.8, f"both tagged cpu / Alone = {ratio_cpu:.2f}"
assert 0.15 <= ratio_mem <= 0.8, f"both tagged mem / no tag mem = {ratio_mem:.2f}"
assert both["forced_idle_pct"]["avg"] > 30, both["forced_idle_pct"]
assert rows["no tag"]["forced_idle_pct"]["avg"] < 5
# --slice-us reaches the runtime (Options::slice); a bad one fails with a message. The I/O backend the runtime
# runs on (here the one CORESCHED_IO_BACKEND asks for) is in the header and the JSON.
with tempfile.NamedTemporaryFile(suffix=".json") as out:
    p = subprocess.run([bench, "matrix", "--topology", "package:1 l3cache:1 core:1 pu:2", "--time", "0.3", "--runs",
                        "1", "--config", "Alone", "--slice-us", "4000", "--json", out.name], check=True,
                       stdout=subprocess.PIPE, text=True, env=dict(os.environ, CORESCHED_IO_BACKEND="epoll"))
    d = json.load(open(out.name))
    assert d["slice_us"] == 4000
    assert d["io_backend"] == "epoll" and d["io_backend_reason"], (d["io_backend"], d["io_backend_reason"])
    assert f"# io backend: epoll ({d['io_backend_reason']})" in p.stdout.splitlines(), p.stdout
for bad in ("0", "x"):
    p = subprocess.run([bench, "matrix", "--slice-us", bad], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "slice-us" in p.stderr + p.stdout, (bad, p.returncode, p.stderr)
# --compare-alternation: two plain threads take turns on the same CPUs, so
# the cpu thread holds the turn about half the run (both at once would hold
# it throughout: 1.00 with the baton not waiting), and its per-ms-of-turn
# figure and ours over it are written. (Its events over its own Alone's are
# no check: a test running beside this one slows the two rows unevenly.)
with tempfile.NamedTemporaryFile(suffix=".json") as out:
    subprocess.run([bench, "matrix", "--topology", "package:1 l3cache:1 core:1 pu:2", "--time", "0.4", "--runs", "1",
                    "--config", "Alone", "--config", "both tagged", "--compare-alternation", "--json", out.name],
                   check=True, stdout=subprocess.DEVNULL)
    alt = json.load(open(out.name))["alternation"]
assert alt["available"] is True and alt["turn_us"] == 1000, alt
arows = {c["name"]: c for c in alt["configs"]}
assert list(arows) == ["Alone", "both tagged"], list(arows)
run = arows["both tagged"]["runs"][0]
held = run["cpu_owned_ns"] / 1e9 / run["elapsed_s"]
assert 0.2 <= held <= 0.8, f"alternation: the cpu thread held its turn {held:.2f} of the run"
assert arows["both tagged"]["mem_mib_per_s"]["avg"] > 0
assert 0.3 <= alt["both_tagged_cpu_events_per_turn_ms_over_alone"] <= 1.5, alt
assert alt["ours_over_alternation"] > 0, alt
# Without both rows it is skipped with the reason, not run half.
with tempfile.NamedTemporaryFile(suffix=".json") as out:
    subprocess.run([bench, "matrix", "--topology", "package:1 l3cache:1 core:1 pu:2", "--time", "0.2", "--runs", "1",
                    "--config", "Alone", "--compare-alternation", "--json", out.name], check=True, stdout=subprocess.DEVNULL)
    alt = json.load(open(out.name))["alternation"]
assert alt["available"] is False and "both tagged" in alt["reason"], alt
print(f"matrix JSON ok: both tagged cpu {ratio_cpu:.2f} of Alone, mem {ratio_mem:.2f} of no tag")
