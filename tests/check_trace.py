#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs a program with CORESCHED_TRACE set and checks that the trace it leaves
is Chrome trace-event JSON: every event has the fields Perfetto needs, spans
have non-negative durations, there is a run span on some worker, and a named
cookie's name (args "<field>_name" beside the cookie number "<field>") is a
string, the same in every event.

    check_trace.py PROGRAM [ARGS...]
"""
import json
import os
import subprocess
import sys
import tempfile


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        env = dict(os.environ, CORESCHED_TRACE=path)
        subprocess.run(sys.argv[1:], env=env, check=True, stdout=subprocess.DEVNULL)
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
    events = trace["traceEvents"]
    for e in events:
        for field in ("name", "ph", "pid"):
            assert field in e, f"event without {field}: {e}"
        if e["ph"] in ("X", "i"):
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
            assert isinstance(e["tid"], int), e
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
    names = {}
    for e in events:
        args = e.get("args", {})
        for key, value in args.items():
            if not key.endswith("cookie_name"):
                continue
            number = args.get(key[:-len("_name")])
            assert isinstance(number, int) and isinstance(value, str) and value, e
            assert names.setdefault(number, value) == value, f"cookie {number} named {names[number]!r} and {value!r}"
    runs = [e for e in events if e.get("cat") == "run"]
    assert runs, "no run spans in the trace"
    print(f"trace OK: {len(events)} events, {len(runs)} run spans, named cookies {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
