"""ADAPT: self-tuning I/O (issue 15), run by bench/run_bench.py --scenario ADAPT.

One read of many small objects (a single SampleStream, so one engine for the whole run) goes
on while the latency proxy's delay changes under it: 0 -> 25 -> 100 -> 0 ms each way, through
its control socket. The run is repeated with the engine tuning itself (no --inflight) and with
hand-tuned fixed depths (WHARF_INFLIGHT=16, 64, 256, 1024); throughput is counted in 1 s
windows. Per phase it reports the steady throughput (median of the windows after the first
2 s) of each setting, the self-tuned one against the best fixed one, and how long after a
change the self-tuned throughput took to come within 10% of that best. Each setting runs
--repeat times (default 3); the medians are reported.

The self-tuned runs also carry the profiler (wharf.profile per phase): its verdict and the
shares of its stages make the where-time-goes bars. Plots (matplotlib) go next to the
markdown: adapt-<stamp>-throughput.png and adapt-<stamp>-stages.png.
"""
from __future__ import annotations

import json
import math
import os
import socket
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from scenario import main as scenario_main
from scenario import rss_bytes, run_worker

REPO = Path(__file__).resolve().parent.parent
PREFIX = "adapt/"
OBJECT_BYTES = 64 << 10
FIXED = [16, 64, 256, 1024]
SETTLE_S = 2.0  # windows this long after a change are left out of the steady throughput


def phases(quick: bool) -> list[tuple[float, float]]:
    p = 6.0 if quick else 10.0
    return [(0.0, p), (25.0, p), (100.0, p), (0.0, p)]


# ---------------------------------------------------------------- the worker (one run)

def set_delay(control: str, ms: float) -> None:
    host, port = control.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as c:
        c.sendall(f"delay {ms:g}\n".encode())
        c.shutdown(socket.SHUT_WR)
        reply = c.makefile().readline().strip()
    if not reply.startswith("ok"):
        raise RuntimeError(f"proxy control: {reply}")


def worker(spec: dict) -> dict:
    import resource

    import wharf
    if spec["inflight"]:
        wharf.configure(inflight=spec["inflight"])
    store = {"endpoint": spec["endpoint"]}
    index = wharf.SampleIndex.from_manifest(spec["manifest"], **store)
    set_delay(spec["control"], spec["phases"][0][0])
    stream = wharf.SampleStream(index, shuffle=False)
    cpu0 = time.process_time()
    t0 = time.monotonic()
    events = []  # (seconds since t0, objects, bytes)
    depth = []  # (seconds since t0, requests in flight allowed), every 0.25 s
    out_phases = []
    for delay, seconds in spec["phases"]:
        set_delay(spec["control"], delay)
        start = time.monotonic() - t0
        prof = wharf.profile(trace=False).start() if spec["profile"] else None
        end = start + seconds
        while time.monotonic() - t0 < end:
            batch = stream.next_batch(32)
            if not batch:
                raise RuntimeError("the manifest ran out: make it longer")
            now = time.monotonic() - t0
            events.append((now, len(batch), sum(len(d) for _, _, d in batch)))
            if not depth or now - depth[-1][0] >= 0.25:
                depth.append((now, stream.stats["max_in_flight"]))
        ph = {"delay_ms": delay, "start": start, "end": time.monotonic() - t0}
        if prof is not None:
            prof.stop()
            ph["verdict"] = prof.verdict
            ph["reason"] = prof.reason
            ph["stages"] = {k: v["seconds"] for k, v in prof.stages.items()}
            ph["wall_s"] = prof.report["wall_seconds"]
        out_phases.append(ph)
    total = time.monotonic() - t0
    windows = [[0, 0] for _ in range(int(math.ceil(total)))]
    for t, n, b in events:
        w = windows[min(int(t), len(windows) - 1)]
        w[0] += n
        w[1] += b
    return {"phases": out_phases, "windows": windows, "seconds": total, "depth": depth,
            "cpu_s": time.process_time() - cpu0,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_mib": rss_bytes() / 2**20}


# ---------------------------------------------------------------- the data

def ensure_data(rb, server, n: int, reads: int) -> str:
    """n objects of OBJECT_BYTES under adapt/, and a manifest naming them in turn until it
    holds `reads` entries (one stream reads it all run long). Returns the manifest's URI."""
    s3 = rb.boto3_client(server)
    try:
        s3.create_bucket(Bucket=rb.BUCKET)
    except s3.exceptions.ClientError:  # it exists already
        pass
    sizes = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=rb.BUCKET, Prefix=PREFIX):
        sizes.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
    keys = [f"{PREFIX}obj/{i:06d}.bin" for i in range(n)]
    missing = [k for k in keys if sizes.get(k) != OBJECT_BYTES]
    if missing:
        rb.log(f"ADAPT: uploading {len(missing)} objects of {OBJECT_BYTES // 1024} KiB")
        body = os.urandom(OBJECT_BYTES)
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda k: s3.put_object(Bucket=rb.BUCKET, Key=k, Body=body), missing))
    rounds = max(1, math.ceil(reads / n))
    name = f"{PREFIX}manifest-{n}x{rounds}.jsonl"
    if name not in sizes:  # written once; a later run reuses it
        lines = "".join(json.dumps({"key": k[len(PREFIX):], "size": OBJECT_BYTES}) + "\n"
                        for _ in range(rounds) for k in keys)
        s3.put_object(Bucket=rb.BUCKET, Key=name, Body=lines.encode())
    return f"s3://{rb.BUCKET}/{name}"


# ---------------------------------------------------------------- analysis

def steady(r: dict, i: int) -> float | None:
    """MB/s of phase i after it settled: the median of its whole 1 s windows."""
    ph = r["phases"][i]
    lo, hi = ph["start"] + SETTLE_S, ph["end"]
    xs = [w[1] / 1e6 for k, w in enumerate(r["windows"]) if k >= lo and k + 1 <= hi]
    return statistics.median(xs) if xs else None


def time_to(r: dict, i: int, target: float) -> float | None:
    """Seconds from the start of phase i to the end of the first window at >= target MB/s
    (None when none of the phase's windows reaches it)."""
    ph = r["phases"][i]
    for k, w in enumerate(r["windows"]):
        if k < math.floor(ph["start"]) or k + 1 > ph["end"]:
            continue
        if w[1] / 1e6 >= target:
            return max(0.0, k + 1 - ph["start"])
    return None


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs: dict[str, list[dict]], n_phases: int) -> list[dict]:
    """Per phase: medians per setting over the rounds, and the self-tuned run against the
    best fixed setting OF ITS OWN ROUND (the machine's speed drifts between rounds more than
    between the settings of one round), as the median over rounds."""
    rows = []
    rounds = sorted({r["round"] for rs in runs.values() for r in rs})
    for i in range(n_phases):
        per = {cfg: med(steady(r, i) for r in rs) for cfg, rs in runs.items()}
        fixed = {cfg: v for cfg, v in per.items() if cfg != "auto" and v is not None}
        best_cfg = max(fixed, key=fixed.get) if fixed else None
        ratios, reach = [], []
        for rnd in rounds:
            mine = {cfg: next((r for r in rs if r["round"] == rnd), None)
                    for cfg, rs in runs.items()}
            auto_run = mine.get("auto")
            bests = [steady(r, i) for cfg, r in mine.items() if cfg != "auto" and r]
            bests = [b for b in bests if b is not None]
            if not auto_run or not bests or steady(auto_run, i) is None:
                continue
            ratios.append(steady(auto_run, i) / max(bests))
            reach.append(time_to(auto_run, i, 0.9 * max(bests)))
        first = runs.get("auto", [{}])[0].get("phases", [{}] * n_phases)[i]
        rows.append({"phase": i, "delay_ms": first.get("delay_ms"), "per": per,
                     "best_cfg": best_cfg, "best": fixed.get(best_cfg), "auto": per.get("auto"),
                     "ratio": med(ratios), "ratios": ratios, "reach_s": med(reach),
                     "verdict": first.get("verdict"), "reason": first.get("reason")})
    return rows


def fmt(v, spec=".1f", none="-"):
    return none if v is None else format(v, spec)


def render(results: list[dict]) -> str:
    runs: dict[str, list[dict]] = {}
    for r in results:
        if r.get("scenario") == "ADAPT" and r.get("status") == "ok":
            runs.setdefault(str(r["config"]), []).append(r)
    if "auto" not in runs:
        return "ADAPT: no self-tuned run succeeded\n"
    n_phases = len(runs["auto"][0]["phases"])
    rows = summarize(runs, n_phases)
    out = ["### ADAPT: self-tuned I/O against hand-tuned depths while the latency changes\n",
           f"64 KiB objects read by one SampleStream; the proxy's delay switches during the "
           f"run; MB/s = median of 1 s windows after the first {SETTLE_S:g} s of each phase, "
           f"median of {len(runs['auto'])} runs; within a round the settings run one after "
           f"the other, so the ratio compares runs a minute apart.\n",
           "| phase | delay ms (each way) | best fixed (inflight) MB/s | self-tuned MB/s | "
           "self-tuned / best of its round (per round) | seconds to within 10% of that best | "
           "profiler verdict |",
           "|---|---|---|---|---|---|---|"]
    for row in rows:
        each = ", ".join(fmt(x, ".2f") for x in row["ratios"])
        out.append(f"| {row['phase'] + 1} | {fmt(row['delay_ms'], 'g')} | "
                   f"{fmt(row['best'])} ({row['best_cfg']}) | {fmt(row['auto'])} | "
                   f"{fmt(row['ratio'], '.2f')} ({each}) | "
                   f"{fmt(row['reach_s'], '.0f', 'never')} | {row['verdict'] or '-'} |")
    cfgs = ["auto"] + [str(n) for n in FIXED if str(n) in runs]
    out += ["", "MB/s per setting and phase:", "",
            "| setting | " + " | ".join(f"phase {r['phase'] + 1} ({fmt(r['delay_ms'], 'g')} ms)"
                                        for r in rows) + " | peak RSS MiB | CPU s |",
            "|---|" + "---|" * (len(rows) + 2)]
    for cfg in cfgs:
        rs = runs[cfg]
        out.append(f"| {'self-tuned' if cfg == 'auto' else 'inflight ' + cfg} | "
                   + " | ".join(fmt(r["per"].get(cfg)) for r in rows)
                   + f" | {fmt(med(x['peak_rss_mib'] for x in rs), '.0f')}"
                   + f" | {fmt(med(x['cpu_s'] for x in rs), '.1f')} |")
    reasons = [f"- phase {r['phase'] + 1}: {r['verdict']}: {r['reason']}"
               for r in rows if r.get("verdict")]
    if reasons:
        out += ["", "Profiler verdicts of the self-tuned run:", ""] + reasons
    plots = [r for r in results if r.get("scenario") == "ADAPT" and r.get("plots")]
    for p in plots:
        out += [""] + [f"![{name}]({name})" for name in p["plots"]]
    return "\n".join(out) + "\n"


def plot(results: list[dict], out_dir: Path, stamp: str) -> list[str]:
    """Throughput over time of one run of each setting, and the self-tuned run's
    where-time-goes bars per phase. Returns the file names written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    first: dict[str, dict] = {}
    for r in results:
        if r.get("scenario") == "ADAPT" and r.get("status") == "ok":
            first.setdefault(str(r["config"]), r)
    if "auto" not in first:
        return []
    names = []
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for cfg, r in first.items():
        whole = [w for k, w in enumerate(r["windows"]) if k + 1 <= r["seconds"]]  # no stub
        xs = [k + 0.5 for k in range(len(whole))]
        ys = [w[1] / 1e6 for w in whole]
        label = "self-tuned" if cfg == "auto" else f"inflight {cfg}"
        ax.plot(xs, ys, label=label, linewidth=2.5 if cfg == "auto" else 1.2,
                color="black" if cfg == "auto" else None)
    for ph in first["auto"]["phases"]:
        ax.axvline(ph["start"], color="grey", linestyle=":", linewidth=1)
        ax.text(ph["start"] + 0.2, ax.get_ylim()[1] * 0.95, f"{ph['delay_ms']:g} ms",
                fontsize=8, color="grey", va="top")
    if first["auto"].get("depth"):
        ax2 = ax.twinx()
        ax2.plot([t for t, _ in first["auto"]["depth"]], [d for _, d in first["auto"]["depth"]],
                 color="black", linestyle="--", linewidth=1, label="self-tuned depth")
        ax2.set_yscale("log", base=2)
        ax2.set_ylabel("self-tuned requests in flight (dashed)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MB/s (1 s windows)")
    ax.set_title("ADAPT: throughput while the store's latency changes")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    names.append(f"adapt-{stamp}-throughput.png")
    fig.savefig(out_dir / names[-1], dpi=110)
    plt.close(fig)

    phases_ = [p for p in first["auto"]["phases"] if p.get("stages")]
    if phases_:
        stages = ["list", "budget", "first_byte", "transfer", "io_wait", "parse", "transform",
                  "collate", "consumer_wait", "step"]
        fig, ax = plt.subplots(figsize=(9, 3.5))
        labels = [f"phase {i + 1}: {p['delay_ms']:g} ms ({p['verdict']})"
                  for i, p in enumerate(phases_)]
        for si, st in enumerate(stages):
            vals = [p["stages"].get(st, 0) / max(p["wall_s"], 1e-9) for p in phases_]
            if not any(vals):
                continue
            left = [sum(p["stages"].get(s, 0) / max(p["wall_s"], 1e-9) for s in stages[:si])
                    for p in phases_]
            ax.barh(labels, vals, left=left, label=st.replace("_", " "))
        ax.set_xlabel("stage seconds per wall second (requests overlap: > 1 is concurrency)")
        ax.set_title("Where the time goes (self-tuned run, wharf.profile per phase)")
        ax.legend(fontsize=8, loc="lower right")
        ax.invert_yaxis()
        fig.tight_layout()
        names.append(f"adapt-{stamp}-stages.png")
        fig.savefig(out_dir / names[-1], dpi=110)
        plt.close(fig)
    return names


# ---------------------------------------------------------------- the scenario

def run(rb, a, server, proxy_bin, avail: dict, results: list) -> list[str]:
    ph = phases(a.quick)
    n = 600 if a.quick else 2000
    # Enough entries that no run reaches the end: 8000 objects/s at most, on this box.
    manifest = ensure_data(rb, server, n, int(8000 * sum(s for _, s in ph)))
    configs: list = ["auto"] + FIXED
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with rb.Proxy(proxy_bin, server.endpoint, 0, [*a.proxy_arg, "--control", "127.0.0.1:0"]) \
            as proxy:
        env = dict(os.environ)
        env.update(server.env)
        env.update(AWS_ENDPOINT_URL=proxy.url, PYTHONPATH=str(REPO / "python"))
        env.pop("WHARF_INFLIGHT", None)
        for rnd in range(a.repeat):
            for cfg in configs:
                spec = {"endpoint": proxy.url, "control": proxy.control, "manifest": manifest,
                        "phases": ph, "inflight": 0 if cfg == "auto" else cfg,
                        "profile": cfg == "auto"}
                r = run_worker(rb.VENV_PY, Path(__file__), spec, env,
                               timeout=sum(s for _, s in ph) + 120)
                r.update(scenario="ADAPT", config=cfg, round=rnd)
                results.append(r)
                if r["status"] == "ok":
                    rates = " / ".join(fmt(steady(r, i)) for i in range(len(ph)))
                    depths = ""
                    if cfg == "auto":  # the last depth sampled in each phase
                        depths = ", depth at phase ends " + " / ".join(
                            str(next((d for t, d in reversed(r["depth"]) if t <= p["end"]), 0))
                            for p in r["phases"])
                    rb.log(f"ADAPT {cfg} round {rnd}: MB/s by phase {rates}{depths}")
                else:
                    rb.log(f"ADAPT {cfg} round {rnd}: {r['status']} {r.get('error')}")
    names = plot(results, Path(a.out), stamp)
    if names:
        results.append({"scenario": "ADAPT", "plots": names})
    return [render(results)]


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "python"))
    scenario_main(worker, render, "ADAPT", "adapt_bench.py")
