#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Ctrl-C and SIGTERM keep what was measured, and `top` prints every interval
(used by ctest):

- `matrix` sent SIGINT mid-run exits 130 within a few seconds, prints its
  table of the runs that finished and says it was interrupted, and its --json
  file is whole JSON holding those runs and the interruption;
- `tenants` sent SIGTERM does the same, exiting 143;
- no temporary file is left beside the --json file;
- `top --time T --interval I` prints a frame per interval up to T, the last
  one included, and one more for a partial last interval.

usage: check_interrupt.py BENCH
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

bench = sys.argv[1]
env = dict(os.environ, CORESCHED_TOPOLOGY="package:1 l3cache:1 core:1 pu:2")


def interrupt(args, sig, after_s, out_dir):
    """Runs BENCH ARGS --json F, sends `sig` after `after_s` seconds; returns
    (exit status, stdout, stderr, the parsed F)."""
    path = os.path.join(out_dir, "result.json")
    p = subprocess.Popen([bench, *args, "--json", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    time.sleep(after_s)
    assert p.poll() is None, f"{args} ended before the signal (status {p.returncode})"
    sent = time.monotonic()
    p.send_signal(sig)
    out, err = p.communicate(timeout=30)
    took = time.monotonic() - sent
    assert took < 5, f"{args}: {took:.1f} s from the signal to the exit"
    assert os.path.getsize(path) > 0, f"{args}: {path} is empty\n{err}"
    with open(path) as f:
        d = json.load(f)
    left = sorted(set(os.listdir(out_dir)) - {"result.json"})
    assert not left, f"{args}: files left beside the result: {left}"
    return p.returncode, out, err, d


with tempfile.TemporaryDirectory() as tmp:
    rc, out, err, d = interrupt(["matrix", "--time", "1", "--runs", "5"], signal.SIGINT, 2.5, tmp)
    assert rc == 130, f"matrix after SIGINT: exit {rc}, expected 130\n{err}"
    assert "# expected time: about 30 s (6 configurations x 5 runs x 1 s)" in out.splitlines(), out
    runs = sum(len(c["runs"]) for c in d["configs"])
    assert runs >= 1, f"no run in the result: {d['configs']}"
    assert d["interrupted"] == {"signal": "SIGINT", "done": runs, "planned": 30, "unit": "runs"}, d["interrupted"]
    assert f"# interrupted by SIGINT after {runs} of 30 runs" in out, out
    table = [line.split() for line in out.splitlines()]
    assert any(row[:1] == ["config"] for row in table), f"no table:\n{out}"
    assert any(row[:1] == ["Alone"] and float(row[1]) > 0 for row in table), f"no Alone row:\n{out}"
    for c in d["configs"]:
        assert c["runs"] and c["cpu_events_per_s"]["avg"] > 0, c

with tempfile.TemporaryDirectory() as tmp:
    rc, out, err, d = interrupt(["tenants", "--time", "1", "--runs", "5", "--table-mb", "16"], signal.SIGTERM, 2.5,
                                tmp)
    assert rc == 143, f"tenants after SIGTERM: exit {rc}, expected 143\n{err}"
    runs = sum(len(p["runs"]) for p in d["policies"])
    assert runs >= 1 and d["interrupted"]["signal"] == "SIGTERM" and d["interrupted"]["done"] == runs, d
    assert "req/s avg" in out and "# interrupted by SIGTERM" in out, out


def frames(time_s, interval_ms):
    p = subprocess.run([bench, "top", "--time", str(time_s), "--interval", str(interval_ms), "--json"],
                       capture_output=True, text=True, timeout=30, env=env)
    assert p.returncode == 0, p.stderr
    return [json.loads(line)["t"] for line in p.stdout.splitlines() if line.strip()]


ts = frames(1, 500)
assert len(ts) == 2 and abs(ts[-1] - 1.0) < 0.25, f"--time 1 --interval 500: frames at {ts}, expected 0.5 and 1.0"
ts = frames(1.2, 500)
assert len(ts) == 3 and abs(ts[-1] - 1.2) < 0.25, f"--time 1.2 --interval 500: frames at {ts}, expected 0.5, 1.0, 1.2"
print("ok")
