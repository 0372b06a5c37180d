#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Counts the instructions of coresched's hot paths with callgrind and fails
when one needs more than its budget (bench/budget/budgets.json).

    check_budgets.py BINARY                 # check every operation
    check_budgets.py BINARY --only yield    # one operation
    check_budgets.py BINARY --json out.json # also write the figures

BINARY is coresched-instr-budget from a Release build (instruction counts
depend on the compiler and its flags; the budgets were recorded with Debian
12's g++ 12 at -O3). Instruction counts do not depend on the machine's load,
so a regression shows up whatever else runs.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def totals(path: str) -> int:
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("totals:") or line.startswith("summary:"):
                return int(line.split()[1])
    sys.exit(f"check_budgets: no totals in {path}")


def calls_to(path: str, function: str) -> int:
    """How many times `function` was called, from the call records of a dump."""
    # Names are compressed: "(id) name" the first time a function appears, in
    # an fn= or a cfn= line, and "(id)" after that.
    ids, calls, pending = {}, 0, False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith(("fn=", "cfn=")):
                ident, _, name = line.split("=", 1)[1].strip().partition(" ")
                if name:
                    ids[ident] = name
                pending = line.startswith("cfn=") and ids.get(ident) == function
            elif line.startswith("calls=") and pending:
                calls += int(line.split()[0][len("calls="):])
                pending = False
    return calls


def count(binary: str, op: str, spec: dict, n: int, tmp: str, timeout: float) -> tuple[int, int]:
    """Returns (instructions counted, operations they cover).

    Default: the stretch between the program's client requests (one numbered
    dump), and the operation count the program prints. With "toggle_collect":
    only instructions inside that function, over the whole run, per call of it
    (the program cannot know how many of its wake-ups took the full path)."""
    out = os.path.join(tmp, f"callgrind.{op}.{n}")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p"]
    if "toggle_collect" in spec:
        cmd += ["--collect-atstart=no", f"--toggle-collect={spec['toggle_collect']}"]
    try:
        proc = subprocess.run(cmd + [binary, op, "-n", str(n)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"check_budgets: {op}: valgrind ran longer than {timeout} s (a livelock under valgrind's "
                 "one-thread-at-a-time scheduling?)")
    if proc.returncode != 0:
        sys.exit(f"check_budgets: {op}: {binary} failed under valgrind:\n{proc.stderr[-2000:]}")
    ops = int(proc.stdout.split()[-1])
    dumps = sorted(glob.glob(out + ".*"))
    if "toggle_collect" in spec:
        final = [p for p in dumps if p.count(".") == out.count(".") + 1]  # callgrind.OP.N.PID, no part number
        calls = calls_to(final[0], spec["toggle_collect"])
        if calls == 0:
            sys.exit(f"check_budgets: {op}: {spec['toggle_collect']} was never called")
        return totals(final[0]), calls
    # CALLGRIND_DUMP_STATS_AT writes one numbered part; its totals are the stretch.
    for path in dumps:
        with open(path, encoding="utf-8", errors="replace") as f:
            if f"Client Request: {op}" in f.read():
                return totals(path), ops
    sys.exit(f"check_budgets: {op}: no callgrind dump for the measured stretch in {tmp}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("--budgets", default=os.path.join(HERE, "budgets.json"))
    ap.add_argument("--only", help="check one operation")
    ap.add_argument("--json", help="write the measured figures here")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds one valgrind run may take before the check fails (default 300)")
    args = ap.parse_args()
    if not shutil.which("valgrind"):
        sys.exit("check_budgets: valgrind is not installed (bash scripts/deps.sh installs it)")
    if not os.access(args.binary, os.X_OK):
        sys.exit(f"check_budgets: {args.binary} is not an executable")
    with open(args.budgets, encoding="utf-8") as f:
        budgets = json.load(f)["budgets"]
    if args.only and args.only not in budgets:
        sys.exit(f"check_budgets: no budget named {args.only!r} (have: {', '.join(budgets)})")
    results, failed = {}, []
    print(f"{'operation':<20} {'instr/op':>10} {'budget':>8}  verdict")
    with tempfile.TemporaryDirectory() as tmp:
        for op, spec in budgets.items():
            if args.only and op != args.only:
                continue
            print(f"[budget] {op}...", file=sys.stderr, flush=True)
            if "toggle_collect" in spec:  # already per call of one function
                instructions, ops = count(args.binary, op, spec, spec["count"], tmp, args.timeout)
                per_op = instructions / ops
            else:
                # Two runs, n and 2n operations: the difference cancels whatever does
                # not scale with n (start-up on other threads, warm-up, the loop's set-up).
                i1, o1 = count(args.binary, op, spec, spec["count"], tmp, args.timeout)
                i2, o2 = count(args.binary, op, spec, 2 * spec["count"], tmp, args.timeout)
                ops = o2 - o1
                per_op = (i2 - i1) / ops
            ok = per_op <= spec["max_instructions"]
            report_only = spec.get("report_only", False)  # not deterministic enough to gate on
            results[op] = {"instructions_per_op": round(per_op, 1), "budget": spec["max_instructions"],
                           "operations": ops, "ok": ok, "report_only": report_only}
            verdict = "ok" if ok else "over (report only)" if report_only else "OVER BUDGET"
            print(f"{op:<20} {per_op:>10.1f} {spec['max_instructions']:>8}  {verdict}")
            if not ok and not report_only:
                failed.append(op)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"unit": "instructions per operation", "results": results}, f, indent=2)
    if failed:
        print(f"over budget: {', '.join(failed)} (profile: valgrind --tool=callgrind {args.binary} OP; "
              "callgrind_annotate)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
