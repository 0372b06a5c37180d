#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks bench/peers/echo_ab.py (used by ctest): one echo server under two
labels, one short round each; every label's requests/s and its threads are
reported, the --json holds each round; bad input fails with a message.

usage: check_echo_ab.py ECHO_AB_PY SERVER CLIENT
"""
import json
import subprocess
import sys
import tempfile


def ab(echo_ab, args):
    return subprocess.run([sys.executable, echo_ab, *args], capture_output=True, text=True, timeout=120)


def main(echo_ab, server, client):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        p = ab(echo_ab, ["--server", f"a={server}", "--server", f"b={server},--slice-us,2000", "--client", client,
                         "--rounds", "1", "--connections", "20", "--seconds", "0.6", "--warmup", "0.1",
                         "--json", out.name])
        assert p.returncode == 0, p.stderr
        for label in ("a", "b"):
            assert any(line.startswith(label + " ") for line in p.stdout.splitlines()), p.stdout
        doc = json.load(open(out.name))
        for label in ("a", "b"):
            rounds = doc["results"][label]
            assert len(rounds) == 1 and rounds[0]["rps"] > 0, doc
            assert any(name.startswith("coresched-w") for name in rounds[0]["threads"]), rounds[0]
    bad = [
        (["--server", f"a={server}"], "at least two"),
        (["--server", f"a={server}", "--server", "b=/nonexistent"], "not an executable"),
        (["--server", f"a={server}", "--server", f"a={server}"], "a label of its own"),
        (["--server", f"a={server}", "--server", "nolabel"], "LABEL=PATH"),
        (["--server", f"a={server}", "--server", f"b={server}", "--client", client, "--rounds", "0"], "positive"),
        # a server that exits at start (its own usage error): the message, no traceback
        (["--server", f"a={server}", "--server", f"b={server},--slice-us,abc", "--client", client, "--rounds", "1",
          "--seconds", "0.6"], "did not announce its port"),
    ]
    for args, want in bad:
        p = ab(echo_ab, args)
        assert p.returncode != 0 and want in p.stderr, (args, p.returncode, p.stderr)
        assert "Traceback" not in p.stderr, p.stderr
    print("echo_ab.py: ok")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
