#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks that runtime/ keeps its layers: a file includes runtime headers only
from its own folder or from a lower layer, and every runtime include names
its folder ("core/core_coordinator.hpp"). An upward include is how a lower
layer starts to depend on the one built on it (used by ctest).

Within sched/, the worker's files see their scheduler only through
WorkerHost (sched/worker_host.hpp): they may not include sched/scheduler.hpp,
or the worker grows calls into the scheduler's internals again.

usage: check_layers.py [REPO]
"""
import os
import re
import sys

# Lowest first. Folders of one rank do not include each other.
RANKS = {"platform": 0, "fiber": 1, "reactor": 2, "core": 3, "sched": 4, "sync": 5, "io": 5, "debug": 5, "api": 6}
# The worker's half of sched/: files that may not include the scheduler.
WORKER_FILES = re.compile(r"^(worker.*|forced_idle|fiber_lifecycle|stack_guard|cookie_books|local_queue)\.(hpp|cpp)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def main() -> int:
    repo = sys.argv[1] if len(sys.argv) > 1 else "."
    root = os.path.join(repo, "runtime")
    headers = {}  # name -> folder
    for folder in sorted(os.listdir(root)):
        path = os.path.join(root, folder)
        if not os.path.isdir(path):
            continue
        if folder not in RANKS:
            print(f"runtime/{folder}/: a folder with no layer (add it to RANKS and docs/design.md)")
            return 1
        for name in os.listdir(path):
            if name.endswith(".hpp"):
                headers[name] = folder
    bad = 0
    for folder in sorted(RANKS):
        path = os.path.join(root, folder)
        for name in sorted(os.listdir(path)) if os.path.isdir(path) else []:
            with open(os.path.join(path, name), encoding="utf-8") as f:
                text = f.read()
            for inc in INCLUDE.findall(text):
                where, _, base = inc.rpartition("/")
                if base not in headers:
                    continue
                if where != headers[base]:
                    print(f"runtime/{folder}/{name}: include \"{inc}\" as \"{headers[base]}/{base}\"")
                    bad += 1
                elif folder == "sched" and WORKER_FILES.match(name) and base == "scheduler.hpp":
                    print(f"runtime/sched/{name}: a worker's file includes the scheduler (use sched/worker_host.hpp)")
                    bad += 1
                elif RANKS[where] > RANKS[folder] or (RANKS[where] == RANKS[folder] and where != folder):
                    print(f"runtime/{folder}/{name}: includes {inc}, from layer {where} above {folder}")
                    bad += 1
    if bad:
        print(f"{bad} include(s) break the layers (lowest first: {', '.join(RANKS)})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
