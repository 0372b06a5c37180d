#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs plot_matrix.py on a hand-made result with kernel and sysbench rows
(testdata/matrix_kernel_sysbench.json, weights 300:100) and checks that it
writes a PNG and an SVG and that its summary line names every series it
should have drawn: the kernel's and sysbench's bars beside ours, their forced
idle, the shares and the expected-share markers. Then the same file with the
kernel marked unavailable and without weights, which must drop those series.
Exits 77 (skipped, for ctest) where no interpreter has matplotlib.

usage: check_plot_matrix.py PLOT_SCRIPT FIXTURE
"""
import json
import os
import subprocess
import sys
import tempfile

script, fixture = sys.argv[1], sys.argv[2]


def python_with_matplotlib():
    """This interpreter, or the system's (the one scripts/main.sh plots with,
    where Debian's python3-matplotlib lives) when this one lacks matplotlib."""
    for exe in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(exe) and subprocess.run([exe, "-c", "import matplotlib"], capture_output=True).returncode == 0:
            return exe
    return None


python = python_with_matplotlib()
if python is None:
    print("matplotlib is missing: skipped")
    sys.exit(77)


def plot(data, out):
    """Plots `data` to `out`; returns {panel: {series: bars}} from the summary line."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(data, f)
    try:
        p = subprocess.run([python, script, f.name, "-o", out], capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(f.name)
    assert p.returncode == 0, (p.returncode, p.stderr)
    lines = [line for line in p.stdout.splitlines() if line.startswith("drew: ")]
    assert len(lines) == 1, p.stdout
    drawn = {}
    for part in lines[0][len("drew: "):].split(" | "):
        panel, *series = part.split()
        drawn[panel] = {k: int(v) for k, v in (s.split("=") for s in series)}
    return drawn


data = json.load(open(fixture))
with tempfile.TemporaryDirectory() as d:
    png, svg = os.path.join(d, "m.png"), os.path.join(d, "m.svg")
    drawn = plot(data, png)
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert plot(data, svg) == drawn
    with open(svg, encoding="utf-8") as f:
        assert "<svg" in f.read(4096), "not an SVG"

    # Six configurations; memory has no bar for Alone.
    assert drawn["cpu"] == {"ours": 6, "kernel": 6, "sysbench": 6}, drawn
    assert drawn["mem"] == {"ours": 5, "kernel": 5, "sysbench": 5}, drawn
    assert drawn["forced_idle"] == {"ours": 6, "kernel": 6, "sysbench": 6}, drawn
    # Shares where the tenants compete: cpu tagged, mem tagged, both tagged.
    assert drawn["shares"] == {"ours_run": 3, "ours_core": 3, "ours_thread": 3, "kernel_thread": 3, "expected": 3}, drawn

    # The kernel could not run and the run was not weighted: no kernel bars,
    # no expected-share markers; the rest as before.
    data["kernel"] = {"available": False, "reason": "prctl(PR_SCHED_CORE) failed: EINVAL"}
    data["weights"]["set"] = False
    drawn = plot(data, png)
    assert drawn["cpu"] == {"ours": 6, "sysbench": 6}, drawn
    assert drawn["shares"] == {"ours_run": 3, "ours_core": 3, "ours_thread": 3, "expected": 0}, drawn
print("plot_matrix.py drew ours, the kernel's and sysbench's series, the shares and the expected markers")
