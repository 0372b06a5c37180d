#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks bench/ab/ab.py (used by ctest): two labels for one coresched-bench
binary, a one-second schbench each, two rounds; every figure reported per
label, its --json holding each run's number; bad input fails with a message.

usage: check_ab.py AB_PY BENCH
"""
import json
import subprocess
import sys
import tempfile

FIELD = "placements.0.latency.percentiles.p50"
CMD = ["--", "schbench", "--runtime", "1", "-m", "1", "-t", "2", "--sleeptime", "2000", "--cputime", "500",
       "--topology", "package:1 l3cache:1 core:1 pu:2"]


def ab(ab_py, args):
    return subprocess.run([sys.executable, ab_py, *args], capture_output=True, text=True, timeout=120)


def main(ab_py, bench):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        p = ab(ab_py, ["--bin", f"a={bench}", "--bin", f"b={bench}", "--runs", "2", "--field", FIELD,
                       "--json", out.name, *CMD])
        assert p.returncode == 0, p.stderr
        lines = p.stdout.splitlines()
        assert lines[0].startswith(FIELD), p.stdout
        assert lines[1].split()[0] == "a" and lines[2].split()[0] == "b", p.stdout
        assert "1.000 of a" in lines[1], p.stdout
        d = json.load(open(out.name))
        for label in ("a", "b"):
            runs = d["figures"][label][FIELD]
            assert len(runs) == 2 and all(v > 0 for v in runs), runs
        assert "run 2/2: b" in p.stderr, p.stderr  # progress
    bad = [
        (["--bin", f"a={bench}", "--field", FIELD, *CMD], "one build"),
        (["--bin", f"a={bench}", "--bin", f"a={bench}", "--field", FIELD, *CMD], "the same label twice"),
        (["--bin", f"a={bench}", "--bin", "b=/nonexistent", "--field", FIELD, *CMD], "no such binary"),
        (["--bin", f"a={bench}", "--bin", f"b={bench}", "--field", FIELD], "no command"),
        (["--bin", f"a={bench}", "--bin", f"b={bench}", "--field", "placements.0.nope", "--runs", "1", *CMD],
         "a field the output lacks"),
        (["--bin", f"a={bench}", "--bin", f"b={bench}", "--field", FIELD, "--", "schbench", "--runtime", "-1"],
         "a command the binary rejects"),
    ]
    for args, why in bad:
        p = ab(ab_py, args)
        assert p.returncode != 0, f"{why}: exited 0"
        assert p.stderr.strip(), f"{why}: failed without a message"
        assert "Traceback" not in p.stderr, f"{why}: crashed:\n{p.stderr}"
    print("ab.py: ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
