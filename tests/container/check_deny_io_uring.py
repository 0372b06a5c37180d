#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs programs under coresched-deny-io-uring (io_uring denied by seccomp,
as Docker's default profile denies it) and checks their exit status and
output (used by ctest).

    check_deny_io_uring.py launcher LAUNCHER PROBE   the launcher itself: --help, bad command lines, exit
                                                     status passed through, and PROBE (probe_io_uring) sees
                                                     all three io_uring calls fail with EPERM
    check_deny_io_uring.py fallback LAUNCHER HELLO   the auto backend falls back to epoll: HELLO exits 0
                                                     and a log line names epoll and the reason
    check_deny_io_uring.py forced LAUNCHER HELLO     CORESCHED_IO_BACKEND=io_uring: HELLO fails with a
                                                     message naming the reason, without a crash
    check_deny_io_uring.py suite LAUNCHER TESTS SPEC the Catch2 binary TESTS passes the tests SPEC selects
                                                     ("[io]~[io_uring]": the I/O tests but io_uring's own)
    check_deny_io_uring.py main-job LAUNCHER BENCH  coresched-bench matrix (the main job, short) runs on epoll

Exit status 77 (a skip) when the launcher cannot install its filter here
(a kernel without seccomp filters): then nothing can be checked.
"""
import os
import subprocess
import sys

SKIP = 77
TOPOLOGY = "core:2 pu:2"


class Failed(Exception):
    pass


def run(cmd, env_changes=None, timeout=60):
    """Runs cmd; returns (exit status, stdout + stderr). A negative status is the signal that killed it."""
    env = dict(os.environ)
    env.pop("CORESCHED_IO_BACKEND", None)  # the default (auto) unless a check sets it
    env.update(env_changes or {})
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise Failed(f"{cmd} did not finish within {timeout} s; output so far:\n{out}")
    if "cannot install the seccomp filter" in p.stdout and p.returncode == 125:
        print(p.stdout, end="")
        print("SKIP: the seccomp filter cannot be installed on this kernel")
        sys.exit(SKIP)
    return p.returncode, p.stdout


def show(cmd, rc, out):
    print(f"$ {' '.join(cmd)}\n{out}{'' if out.endswith(chr(10)) or not out else chr(10)}-> exit {rc}")


def expect(cond, what, cmd=None, rc=None, out=None):
    if not cond:
        if cmd is not None:
            show(cmd, rc, out)
        raise Failed(what)


def no_crash(cmd, rc, out):
    expect(rc >= 0, f"killed by signal {-rc}", cmd, rc, out)
    for sign in ("terminate called", "Segmentation fault", "AddressSanitizer", "ThreadSanitizer",
                 "runtime error:"):
        expect(sign not in out, f"the output shows a crash or sanitizer report ({sign!r})", cmd, rc, out)


def check_launcher(launcher, probe):
    cmd = [launcher, "--help"]
    rc, out = run(cmd)
    expect(rc == 0 and "Usage:" in out and "EPERM" in out, "--help must succeed and print the usage", cmd, rc, out)

    for cmd, code, words in (([launcher], 2, "no command given"),
                             ([launcher, "--"], 2, "no command given"),
                             ([launcher, "--bogus", "true"], 2, "unknown option"),
                             ([launcher, "--", "/nonexistent/coresched-no-such-program"], 127, "cannot run"),
                             ([launcher, "--", "/"], 126, "cannot run")):
        rc, out = run(cmd)
        expect(rc == code and words in out, f"expected exit {code} and '{words}'", cmd, rc, out)

    # Other system calls are allowed, and the command's exit status comes back unchanged.
    for code in (0, 3):
        cmd = [launcher, "--", "sh", "-c", f"exit {code}"]
        rc, out = run(cmd)
        expect(rc == code, f"sh -c 'exit {code}' under the launcher must exit {code}", cmd, rc, out)

    # Without the launcher the kernel answers (informational: this host may itself deny io_uring).
    rc, out = run([probe])
    print(f"without the filter:\n{out}", end="")
    # Under it, as in a default container: all three calls fail with EPERM, in the command and in its children.
    for cmd in ([launcher, "--", probe], [launcher, "sh", "-c", f"exec '{probe}'"]):
        rc, out = run(cmd)
        show(cmd, rc, out)
        expect(rc == 0, "io_uring must be denied with EPERM (probe_io_uring exits 0 only then)")
        expect(out.count("EPERM (") == 3, "all three calls must report EPERM")
    return "io_uring_setup, io_uring_enter and io_uring_register all fail with EPERM under the filter"


def check_fallback(launcher, hello):
    cmd = [launcher, "--", hello]
    rc, out = run(cmd, {"CORESCHED_TOPOLOGY": TOPOLOGY})
    show(cmd, rc, out)
    no_crash(cmd, rc, out)
    expect(rc == 0, "hello must succeed on the epoll backend")
    expect("sum of squares 0..7 = 140" in out, "hello's fibers must all have run")
    lines = [line for line in out.splitlines() if "epoll" in line]
    expect(lines, "no line names epoll: the fallback must be logged")
    reason = [line for line in lines if "not permitted" in line.lower() or "EPERM" in line]
    expect(reason, "the line naming epoll must give the reason (io_uring_setup: Operation not permitted)")
    return reason[0].strip()


def check_forced(launcher, hello):
    cmd = [launcher, "--", hello]
    rc, out = run(cmd, {"CORESCHED_TOPOLOGY": TOPOLOGY, "CORESCHED_IO_BACKEND": "io_uring"})
    show(cmd, rc, out)
    no_crash(cmd, rc, out)
    expect(rc > 0, "a forced io_uring backend that cannot start must fail")
    expect("sum of squares" not in out, "no fiber may have run")
    lines = [line for line in out.splitlines()
             if "io_uring" in line and ("seccomp" in line or "io_uring_disabled" in line)]
    expect(lines, "the message must name io_uring and the likely cause (seccomp or kernel.io_uring_disabled)")
    return lines[0].strip()


def check_suite(launcher, tests, spec):
    cmd = [launcher, "--", tests, spec]
    rc, out = run(cmd, timeout=540)
    no_crash(cmd, rc, out)
    expect(rc == 0, f"the tests {spec} must pass with io_uring denied", cmd, rc, out)
    fallbacks = [line for line in out.splitlines() if "epoll" in line]
    expect(fallbacks, "the runtimes must have logged their fallback to epoll", cmd, rc, out)
    print(f"{len(fallbacks)} log lines name epoll, the first: {fallbacks[0].strip()}")
    rest = "\n".join(line for line in out.splitlines() if "epoll" not in line)
    print(rest[-4000:])
    summary = [line for line in out.splitlines() if line.startswith("All tests passed")]
    return summary[0] if summary else "passed"


def check_main_job(launcher, bench):
    cmd = [launcher, "--", bench, "matrix", "--time", "0.3", "--runs", "1", "--config", "Alone",
           "--config", "both tagged"]
    rc, out = run(cmd, {"CORESCHED_TOPOLOGY": TOPOLOGY}, timeout=120)
    show(cmd, rc, out)
    no_crash(cmd, rc, out)
    expect(rc == 0, "the fairness matrix must run on the epoll backend")
    header = [line for line in out.splitlines() if line.startswith("# io backend: epoll")]
    expect(header, "the matrix's header must say it ran on epoll")
    expect("both tagged" in out, "the matrix must print its rows")
    return header[0].strip()


def main(argv):
    checks = {"launcher": (check_launcher, 2), "fallback": (check_fallback, 2), "forced": (check_forced, 2),
              "suite": (check_suite, 3), "main-job": (check_main_job, 2)}
    if len(argv) < 2 or argv[1] not in checks or len(argv) != 2 + checks[argv[1]][1]:
        print(__doc__, file=sys.stderr)
        return 2
    fn, _ = checks[argv[1]]
    try:
        print("OK:", fn(*argv[2:]))
    except Failed as e:
        print(f"FAIL: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
