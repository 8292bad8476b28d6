"""What the scenario modules run by bench/run_bench.py (ckpt_bench.py, serve_bench.py) share:
each measurement runs in a fresh process (`<module>.py --worker SPEC`) that prints one JSON
line, and a run's tables can be printed again from its JSON (`<module>.py --render FILE`)."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def rss_bytes() -> int:
    """This process's resident set now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_worker(python: str, script: str, spec: dict, env: dict, timeout: float,
               cwd=None) -> dict:
    """Runs `script --worker SPEC` in a fresh process: its last stdout line (JSON) with
    status "ok", or {"status": "failed", "error": [last line of its output]}."""
    cmd = [str(python), str(script), "--worker", json.dumps(spec)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                           cwd=cwd)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "error": [f"timed out after {timeout:.0f} s"]}
    if p.returncode != 0:
        return {"status": "failed", "error": (p.stderr or p.stdout).strip().splitlines()[-1:]
                or [f"exit {p.returncode}"]}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["status"] = "ok"
    return r


def median_ok(rs, key):
    """The median of `key` over the results that succeeded and have it; None without any."""
    xs = [r.get(key) for r in rs if r.get("status") == "ok" and r.get(key) is not None]
    return statistics.median(xs) if xs else None


def main(worker, render, scenario: str, script: str) -> None:
    """The command line of a scenario module: --worker SPEC or --render FILE."""
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(worker(json.loads(sys.argv[2]))))
        sys.exit(0)
    if len(sys.argv) == 3 and sys.argv[1] == "--render":
        data = json.loads(Path(sys.argv[2]).read_text())
        print(render(data["results"] if isinstance(data, dict) else data))
        sys.exit(0)
    sys.exit(f"run through bench/run_bench.py --scenario {scenario} "
             f"(or: bench/{script} --render bench-results/bench-<time>.json)")
