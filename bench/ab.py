#!/usr/bin/env python3
"""Compares two commands run in turn, pair by pair: A B A B ... (after one unmeasured run of
each), each run timed from the outside: wall seconds (a monotonic clock around the child),
user and system CPU seconds and the child's peak RSS (wait4; under GNU time when installed,
since a child forked from this Python process would otherwise report this process's RSS as
its own high-water mark). Prints the min, median and max of every figure for A and B, and of
the ratio A/B taken within each pair, so a machine whose speed drifts during the call still
gives a meaningful ratio. Quote the medians.

    bench/ab.py -n 9 --a 'build/wharf fetch -r s3://b/p/' --b '/tmp/old/build/wharf fetch -r s3://b/p/'

Each command is split as a shell splits words and run without a shell (write `sh -c '...'`
for pipes or redirections); its output is discarded. Exit status: 0 when every run exited 0,
1 otherwise (the figures are printed either way).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

TIME_BIN = "/usr/bin/time"


def run(argv: list[str]) -> dict:
    tfile = None
    if os.access(TIME_BIN, os.X_OK):
        tfile = tempfile.NamedTemporaryFile(prefix="wharf-ab-time-", suffix=".txt")
        argv = [TIME_BIN, "-q", "-o", tfile.name, "-f", "%M", *argv]
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    rss_kib = ru.ru_maxrss
    if tfile is not None:
        try:
            rss_kib = int(open(tfile.name).read().split()[-1])
        except (OSError, ValueError, IndexError):
            pass
        tfile.close()
    return {"rc": p.returncode, "wall s": wall, "user s": ru.ru_utime, "sys s": ru.ru_stime,
            "cpu s": ru.ru_utime + ru.ru_stime, "peak MiB": rss_kib / 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=5, help="measured pairs (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured runs of each first")
    ap.add_argument("--a", required=True, help="command A (the change)")
    ap.add_argument("--b", required=True, help="command B (the baseline)")
    args = ap.parse_args()
    a, b = shlex.split(args.a), shlex.split(args.b)
    for _ in range(args.warmup):
        run(a)
        run(b)
    pairs = []
    for i in range(args.n):
        ra, rb = run(a), run(b)
        pairs.append((ra, rb))
        print(f"pair {i + 1}/{args.n}: A {ra['wall s']:.3f} s, B {rb['wall s']:.3f} s",
              file=sys.stderr, flush=True)
    keys = ["wall s", "user s", "sys s", "cpu s", "peak MiB"]
    print(f"{'':14}{'min':>10}{'median':>10}{'max':>10}   n = {args.n} pairs")
    for side, idx in (("A", 0), ("B", 1)):
        for k in keys:
            v = [p[idx][k] for p in pairs]
            print(f"{side} {k:<12}{min(v):10.3f}{statistics.median(v):10.3f}{max(v):10.3f}")
    for k in ("wall s", "cpu s", "user s"):
        r = [p[0][k] / p[1][k] for p in pairs if p[1][k] > 0]
        if r:
            print(f"A/B {k:<10}{min(r):10.3f}{statistics.median(r):10.3f}{max(r):10.3f}")
    bad = sum(p[0]["rc"] != 0 for p in pairs) + sum(p[1]["rc"] != 0 for p in pairs)
    if bad:
        print(f"{bad} run(s) exited non-zero", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
