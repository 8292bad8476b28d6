#!/usr/bin/env python3
"""Compares two commands run in turn, pair by pair: A B A B ... (after one unmeasured run of
each). Each run is timed from the outside as the benchmark harness times its clients
(run_bench.run_measured: wall seconds around the child, user and system CPU from wait4, the
child's own peak RSS under GNU time when installed). Prints the min, median and max of every
figure for A and B, and of the ratio A/B taken within each pair, so a machine whose speed
drifts during the call still gives a meaningful ratio. Quote the medians.

    bench/ab.py -n 9 --a 'build/wharf fetch -r s3://b/p/' --b '/tmp/old/wharf fetch -r s3://b/p/'

Each command is split as a shell splits words and run without a shell (write `sh -c '...'`
for pipes or redirections), in the current directory with this environment; its output is
not shown. Exit status: 0 when every run exited 0, 1 otherwise (the figures are printed
either way).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_bench as rb  # noqa: E402  (the harness's own measurement of one run)


def run(argv: list[str]) -> dict:
    m = rb.run_measured(argv, dict(os.environ), timeout=3600, cwd=Path.cwd())
    return {"rc": m.rc, "wall s": m.wall, "user s": m.cpu_user, "sys s": m.cpu_sys,
            "cpu s": m.cpu_user + m.cpu_sys, "peak MiB": m.maxrss_kib / 1024,
            "stderr": m.stderr}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=5, help="measured pairs (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured runs of each first")
    ap.add_argument("--a", required=True, help="command A (the change)")
    ap.add_argument("--b", required=True, help="command B (the baseline)")
    args = ap.parse_args()
    if args.n < 1 or args.warmup < 0:
        ap.error("-n must be at least 1 and --warmup at least 0")
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
    failed = [(side, r) for ra, rb_ in pairs for side, r in (("A", ra), ("B", rb_))
              if r["rc"] != 0]
    if failed:
        side, r = failed[0]
        last = (r["stderr"].strip().splitlines() or ["(no output)"])[-1]
        print(f"{len(failed)} run(s) exited non-zero; the first, {side}, exited {r['rc']}: "
              f"{last}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
