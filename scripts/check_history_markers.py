#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fails if a tracked file names a past work period, whoever found a thing, an
issue number or a date of work: the tree says what is true now and why;
history goes in commit messages.

    check_history_markers.py [REPO]      # exit 1 and list the lines found

Only this script is left out: its pattern names what it looks for.
"""
import re
import subprocess
import sys

PATTERN = re.compile(
    r"\bsession\s+\d+|\bsessions\s+\d+|\bhelper-\d+|\bissue\s+#?\d+|\(#\d+\b|\b20\d\d-[01]\d-[0-3]\d\b",
    re.IGNORECASE)
SKIP = {"scripts/check_history_markers.py"}


def main() -> int:
    repo = sys.argv[1] if len(sys.argv) > 1 else "."
    files = subprocess.run(["git", "-C", repo, "ls-files"], capture_output=True, text=True, check=True).stdout.split()
    found = 0
    for name in files:
        if name in SKIP:
            continue
        try:
            with open(f"{repo}/{name}", encoding="utf-8") as f:
                lines = f.readlines()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for number, line in enumerate(lines, 1):
            if PATTERN.search(line):
                print(f"{name}:{number}: {line.strip()[:160]}")
                found += 1
    if found:
        print(f"{found} line(s) name history (a work period, a finder, an issue or a date): "
              "say what holds now and why, and put the history in the commit message", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
