#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs gdb in batch mode against examples/stuck with tools/gdb/coresched.py loaded.

1. Live, under gdb: break once every fiber is parked, then `info fibers` must list each
   fiber of the example with its cookie and that cookie's name (the program links
   name_tenants.cpp; where gdb cannot call into the process, the number and why) and its wait (join, Mutex, Event, io read on the
   pipe, sleep, an inline join) and how long; `fiber bt` of several fibers must show a frame
   in the example's own function; the thread's registers must be back afterwards; and
   `gcore` writes a core file.
2. The core file: `info fibers` again (raw park times, cookies by number), and `fiber bt` by frame-pointer walk.
3. `stuck --abort-after-ms` aborts (no core written: RLIMIT_CORE is 0 for it).

With --no-debug-info the program has none (a Release build without -g): the extension must
say that it reads the layout table the library recorded, and show the same. Otherwise it
must take the layout from the debug information, and find the table in agreement with it.

Exits 77 (the test's SKIP_RETURN_CODE) when gdb, or its Python, or ptrace is unavailable.
"""

import argparse
import os
import py_compile
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile

SKIP = 77
failures = []
# The names tests/gdb/name_tenants.cpp gives the program's cookies 1 and 2.
TENANT_A = 'tenant "A"'
TENANT_B = "tenant\\B"


def check(cond, what, text=None):
    if cond:
        print("ok: " + what)
    else:
        print("FAIL: " + what)
        failures.append(what)
        if text is not None:
            print("---- output ----\n" + text + "\n----------------")


def skip(why):
    print("SKIP: " + why)
    sys.exit(SKIP)


def run_gdb(gdb, args, timeout):
    """gdb's output (the inferior's too). On a timeout gdb and what it runs are killed, and the output so far
    is returned with a note, so that a hang shows where it stopped."""
    env = dict(os.environ)
    env["DEBUGINFOD_URLS"] = ""  # never ask to download debug information
    # gcore cannot read a mapping with a guard marker in it and would leave the
    # stack slabs out of the core file: the example's stacks get mprotect'ed
    # guard pages instead, as docs/observability.md tells users who take cores with gcore.
    env["CORESCHED_STACK_GUARD"] = "mprotect"
    cmd = [gdb, "-nx", "-batch", "-iex", "set pagination off", "-iex", "set confirm off"] + args
    print("$ " + " ".join(cmd), flush=True)
    with tempfile.TemporaryFile(mode="w+", errors="replace") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)
        try:
            p.wait(timeout=timeout)
            note = ""
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            note = "\n[gdb timed out after %d s and was killed]\n" % timeout
        out.seek(0)
        text = out.read() + note
    for pid in re.findall(r"stuck: pid (\d+),", text):  # an inferior left behind by a killed gdb
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return text


def section(text, start, end_marker="(fibers that never ran"):
    """The text of one command's output: from the line matching `start` to the end marker."""
    i = text.find(start)
    if i < 0:
        return ""
    j = text.find(end_marker, i)
    return text[i:j if j >= 0 else len(text)]


def listing_rows(text):
    """{id: (cookie, state, worker, wait, for)} from an `info fibers` listing (the cookie as printed: "1" or
    "1 (name)"; columns are two spaces apart or more)."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^\s+(\d+)  (\S.*?)\s{2,}(runnable|running|parking|parked|finishing|\?\d+)\s+(\d+)\*?\s+(.*?)\s*$",
                     line)
        if not m:
            continue
        rest = m.group(5)
        # The last column (FOR / PARKED AT) is separated by two spaces or more.
        parts = re.split(r"\s{2,}", rest)
        wait, since = (parts[0], parts[-1]) if len(parts) > 1 else (parts[0], "")
        rows[int(m.group(1))] = (m.group(2), m.group(3), int(m.group(4)), wait, since)
    return rows


def fiber_sections(text):
    """{id: text} for each `fiber N (cookie ...` header of `fiber bt` output."""
    out = {}
    parts = re.split(r"(?m)^(?=fiber \d+ \(cookie )", text)
    for part in parts:
        m = re.match(r"fiber (\d+) \(cookie ", part)
        if m:
            out.setdefault(int(m.group(1)), part)
    return out


def frames_naming(section_text, function):
    return [l for l in section_text.splitlines() if l.startswith("#") and re.search(r"\b%s\b" % function, l)]


def check_layout_source(text, no_debug_info, where=""):
    """Where the extension says its layout came from."""
    if no_debug_info:
        check("no debug information for coresched's types" in text and "`coresched_debug_layout` (format 1)" in text,
              where + "without debug information the extension says it reads the library's layout table",
              text[:3000])
    else:
        check("coresched_debug_layout" not in text and "no debug information" not in text,
              where + "the layout comes from the debug information, and the library's table agrees with it",
              text[:3000])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gdb", default="gdb")
    ap.add_argument("--example", required=True)
    ap.add_argument("--script", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--keep-core", action="store_true")
    ap.add_argument("--no-debug-info", action="store_true", help="the program was built without -g")
    a = ap.parse_args()

    # The script at least compiles, with or without gdb.
    os.makedirs(a.workdir, exist_ok=True)
    py_compile.compile(a.script, cfile=os.path.join(a.workdir, "coresched.pyc"), doraise=True)

    gdb = a.gdb if os.path.isabs(a.gdb) and os.access(a.gdb, os.X_OK) else shutil.which(a.gdb)
    if not gdb:
        skip("gdb not found (Debian: apt-get install gdb); the gdb extension was not tested")
    probe = run_gdb(gdb, ["-ex", "python print('python-' + 'ok')"], 60)
    if "python-ok" not in probe:
        skip("this gdb has no Python support:\n" + probe)

    if not os.access(a.example, os.X_OK):
        print("FAIL: no program %s" % a.example)
        return 1
    # stuck_ids' fields by index: without debug information gdb knows no type for it.
    ids = "((long*)&stuck_ids)" if a.no_debug_info else "stuck_ids"  # (`fiber bt` takes one word)
    mutex_waiter_expr = ids + ("[1]" if a.no_debug_info else ".mutex_waiter")
    inline_parent_expr = ids + ("[6]" if a.no_debug_info else ".inline_parent")

    core = os.path.join(a.workdir, "stuck.core")
    if os.path.exists(core):
        os.remove(core)

    # ---- 1. live
    # The example's inline join runs the child on the joiner's stack unless the worker was asked to stop
    # at that moment (a join is a preemption point; a slice may end there on a loaded machine): then the
    # joiner parks in a plain join, and the program runs again, up to three times.
    attempts = 3
    for attempt in range(attempts):
        live = run_gdb(gdb, [
            "-x", a.script,
            "-ex", "break stuck_all_parked",
            "-ex", "run",
            "-ex", "echo ==call-probe==\\n", "-ex", "print (int) getpid()",
            "-ex", "echo ==info-fibers==\\n", "-ex", "info fibers",
            "-ex", "echo ==bt-mutex==\\n", "-ex", "fiber bt " + mutex_waiter_expr,
            "-ex", "echo ==bt-all==\\n", "-ex", "fiber bt all",
            "-ex", "echo ==fiber-inline==\\n", "-ex", "fiber " + inline_parent_expr,
            "-ex", "echo ==after==\\n", "-ex", "bt 1",
            "-ex", "gcore " + core,
            "-ex", "kill",
            "--args", a.example], 180)
        if re.search(r"ptrace: Operation not permitted|Could not trace the inferior|Cannot create process|"
                     r"During startup program exited", live):
            skip("gdb cannot run a program here (no ptrace?):\n" + live)
        print(live)
        parent = re.search(r"inline parent (\d+) \(cookie 1\)", live)
        row = listing_rows(section(live, "==info-fibers==")).get(int(parent.group(1))) if parent else None
        if attempt < attempts - 1 and row is not None and row[3].startswith("join of fiber"):
            print("(the inline parent joined its child without running it inline this time: running it again)")
            continue
        break

    m = re.search(r"stuck: pid \d+, fibers parked: holder (\d+) \(cookie 1\), mutex waiter (\d+) \(cookie 2\), event "
                  r"waiter (\d+) \(cookie 2\), reader (\d+) \(cookie 1, fd (\d+)\), sleeper (\d+) \(cookie 2\), "
                  r"joiner (\d+) \(cookie 1\), inline parent (\d+) \(cookie 1\)", live)
    check(m is not None, "the example reports its fibers and stops at stuck_all_parked", live)
    if m is None:
        return 1
    holder, mutex_waiter, event_waiter, reader, fd, sleeper, joiner, inline_parent = map(int, m.groups())

    check_layout_source(live, a.no_debug_info)
    listing = section(live, "==info-fibers==")
    rows = listing_rows(listing)
    # The program names its cookies (name_tenants.cpp); a live process is asked for the names. Where gdb
    # cannot call a function in the inferior at all (some VMs: "Couldn't write extended state status"), the
    # listing must show numbers and say why instead.
    calls = re.search(r"^\$\d+ = \d+$", section(live, "==call-probe==", "==info-fibers=="), re.M) is not None
    if calls:
        named = {"1": " (%s)" % TENANT_A, "2": " (%s)" % TENANT_B}
    else:
        named = {"1": "", "2": ""}
        print("note: this gdb cannot call functions in the inferior here; names are not expected")
        check("coresched_cookie_name could not be called" in listing,
              "info fibers says why it shows cookies by number", listing)
    want = {
        holder: ("1", r"Event at 0x[0-9a-f]+"),
        mutex_waiter: ("2", r"Mutex at 0x[0-9a-f]+"),
        event_waiter: ("2", r"Event at 0x[0-9a-f]+"),
        reader: ("1", r"io read on fd %d" % fd),
        sleeper: ("2", r"sleep, [\d.]+ s left"),
        joiner: ("1", r"join of fiber %d" % reader),
        inline_parent: ("1", r"joins fiber \d+ inline"),
    }
    for fid, (number, wait) in want.items():
        cookie = number + named[number]
        row = rows.get(fid)
        check(row is not None and row[0] == cookie and row[1] == "parked" and re.match(wait, row[3]) is not None,
              "info fibers: fiber %d cookie %s parked, waiting for /%s/ (got %s)" % (fid, cookie, wait, row), listing)
    parked_for = [r[4] for fid, r in rows.items() if fid in want and fid != inline_parent]
    check(all(re.fullmatch(r"[\d.]+ (us|ms|s)", s) for s in parked_for),
          "info fibers: a live process shows how long each fiber has waited (%s)" % parked_for, listing)
    child = re.search(r"joins fiber (\d+) inline", rows.get(inline_parent, ("", "", 0, "", ""))[3])
    if child:
        row = rows.get(int(child.group(1)))
        check(row is not None and row[1] == "parked" and row[3].startswith("Event at 0x"),
              "info fibers: the inline child %s waits on the Event" % child.group(1), listing)

    bt = section(live, "==bt-mutex==", "==bt-all==")
    # (at -O3 Mutex::lock_slow ends in a tail call to the wait queue: no frame of its own)
    runtime_frame = r"WaitQueue::wait" if a.no_debug_info else r"Mutex::lock_slow"
    check(bool(frames_naming(bt, "wait_for_mutex")) and bool(frames_naming(bt, runtime_frame)),
          "fiber bt (mutex waiter): frames in %s and the example's wait_for_mutex" % runtime_frame, bt)
    check("make_fcontext" in bt and "?? ()" not in bt, "fiber bt ends at the fiber's first frame", bt)
    check(("fiber %d (cookie 2%s, parked" % (mutex_waiter, named["2"])) in bt,
          "fiber bt: the header names the fiber's cookie", bt)

    every = fiber_sections(section(live, "==bt-all==", "==fiber-inline=="))
    for fid, function in [(holder, "hold_mutex_and_wait"), (event_waiter, "wait_for_event"),
                          (reader, "read_from_pipe"), (sleeper, "sleep_an_hour"), (joiner, "join_the_reader")]:
        text = every.get(fid, "")
        check(bool(frames_naming(text, function)), "fiber bt all: fiber %d has a frame in %s" % (fid, function),
              text or section(live, "==bt-all==", "==fiber-inline=="))

    inl = section(live, "==fiber-inline==", "==after==")
    check("joins fiber" in inl and "inline" in inl and bool(frames_naming(inl, "inline_child_waits"))
          and bool(frames_naming(inl, "join_inline_child")),
          "fiber N of an inline joiner: shows the shared stack, child and parent frames", inl)

    after = section(live, "==after==", "Saved corefile")
    check(re.search(r"#0\s+(0x[0-9a-f]+ in )?stuck_all_parked", after) is not None,
          "the thread's registers are restored after the fiber backtraces", after)
    check(os.path.exists(core), "gcore wrote a core file", live[-2000:])
    if not os.path.exists(core):
        return 1

    # ---- 2. the core file
    try:
        dead = run_gdb(gdb, [
            "-x", a.script, a.example, core,
            "-ex", "echo ==info-fibers==\\n", "-ex", "info fibers",
            "-ex", "echo ==bt-mutex==\\n", "-ex", "fiber bt %d" % mutex_waiter,
            "-ex", "echo ==bt-reader==\\n", "-ex", "fiber bt %d" % reader,
            "-ex", "echo ==end==\\n"], 180)
    finally:
        if not a.keep_core:
            os.remove(core)
    print(dead)
    check_layout_source(dead, a.no_debug_info, "core file: ")
    listing = section(dead, "==info-fibers==")
    rows = listing_rows(listing)
    check("PARKED AT" in listing, "core file: info fibers prints raw park times", listing)
    check("a core file shows cookies by number" in listing, "core file: info fibers says names are not read",
          listing)
    for fid, (cookie, wait) in want.items():
        if fid == sleeper:
            wait = r"sleep until \d+ \(steady clock ns\)"
        row = rows.get(fid)
        check(row is not None and row[0] == cookie and row[1] == "parked" and re.match(wait, row[3]) is not None,
              "core file: info fibers: fiber %d cookie %s parked, waiting for /%s/ (got %s)" % (fid, cookie, wait,
                                                                                               row), listing)
    bt = section(dead, "==bt-mutex==", "==bt-reader==")
    check("frame-pointer walk" in bt and bool(frames_naming(bt, "wait_for_mutex")),
          "core file: fiber bt (mutex waiter) walks frame pointers to wait_for_mutex", bt)
    bt = section(dead, "==bt-reader==", "==end==")
    check(bool(frames_naming(bt, "read_from_pipe")), "core file: fiber bt (reader) names read_from_pipe", bt)

    # ---- 3. --abort-after-ms
    def no_core():
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    p = subprocess.run([a.example, "--abort-after-ms", "50"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       preexec_fn=no_core, timeout=120, text=True, errors="replace")
    check(p.returncode == -signal.SIGABRT and "aborting" in p.stdout,
          "stuck --abort-after-ms 50 aborts (exit %d)" % p.returncode, p.stdout)

    print("%d check(s) failed" % len(failures) if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
