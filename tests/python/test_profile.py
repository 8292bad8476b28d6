"""The profiler (wharf.profile, WHARF_PROFILE=1, wharf fetch --profile): the verdict on three
constructed cases (latency-bound through the latency proxy, a CPU-bound transform, a slow
consumer), DataLoader workers' stages merged into the parent's table, and a trace in Chrome's
trace event format."""
import json
import os
import stat
import subprocess
import sys
import time

import pytest
import torch
import torch.utils.data

import wharf
from conftest import ROOT, run_wharf
from wharf.torch import IterableDataset

SAMPLES = 96


@pytest.fixture
def dataset(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for i in range(SAMPLES):
        (d / f"{i:03d}.bin").write_bytes(bytes([i]) * 2048)
    return d


def burn(sample):
    """A CPU-bound transform: ~4 ms of arithmetic per sample."""
    end = time.process_time() + 0.004
    x = 0
    while time.process_time() < end:
        x += 1
    return torch.tensor([len(sample.data), x > 0])


def to_tensor(sample):
    return torch.tensor([len(sample.data)])


def trace_events(path):
    with open(path) as f:
        trace = json.load(f)
    assert isinstance(trace["traceEvents"], list)
    for e in trace["traceEvents"]:
        assert e["ph"] in ("X", "M"), e  # spans and names of processes and lanes
        assert isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] > 0
    return trace["traceEvents"]


def test_a_cpu_bound_transform_is_client_cpu(dataset, tmp_path):
    ds = IterableDataset.from_prefix(f"file://{dataset}/", transform=burn, shuffle=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=8)
    trace = tmp_path / "trace.json"
    with wharf.profile(trace=str(trace)) as p:
        batches = list(p.iterate(loader))
    assert sum(len(b) for b in batches) == SAMPLES
    assert p.verdict == "client-cpu", p.table()
    assert p.stages["transform"]["count"] == SAMPLES
    assert p.stages["consumer_wait"]["count"] == SAMPLES // 8
    assert p.stages["collate"]["count"] == SAMPLES // 8
    assert p.stages["transform"]["seconds"] >= SAMPLES * 0.004 * 0.9
    assert "transform" in p.table() and "verdict: client-cpu" in p.table()
    assert p.trace == str(trace)
    assert stat.S_IMODE(os.stat(trace).st_mode) == 0o600
    names = {e["name"] for e in trace_events(trace) if e["ph"] == "X"}
    assert {"transform", "collate", "consumer wait", "consumer step"} <= names


def test_a_slow_consumer_is_consumer(dataset):
    # No iterate(): the dataset read in this process measures its consumer itself.
    ds = IterableDataset.from_prefix(f"file://{dataset}/", transform=to_tensor, shuffle=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=8)
    with wharf.profile(trace=False) as p:
        for _ in loader:
            time.sleep(0.03)  # the training step
    assert p.trace is None
    assert p.verdict == "consumer", p.table()
    assert p.stages["step"]["seconds"] >= 0.9 * (SAMPLES // 8) * 0.03
    assert p.stages["consumer_wait"]["count"] == SAMPLES


def test_store_latency_through_the_latency_proxy(bucket, s3_client, aws, slow_link):
    for i in range(48):
        s3_client.put_object(Bucket=bucket, Key=f"p/{i:03d}.bin", Body=bytes([i]) * 4096)
    endpoint = slow_link(delay_ms=25)  # every request 50 ms
    with wharf.profile(trace=False) as p:
        # Requests one batch at a time: the loader waits for the store's first bytes.
        ds = IterableDataset.from_prefix(f"s3://{bucket}/p/", endpoint=endpoint,
                                         shuffle=False, transform=to_tensor, batch_size_hint=4)
        loader = torch.utils.data.DataLoader(ds, batch_size=4)
        n = sum(len(b) for b in p.iterate(loader))
    assert n == 48
    assert p.verdict == "store-latency", p.table()
    gets = p.stages["first_byte"]
    assert gets["count"] >= 48
    assert gets["seconds"] / gets["count"] >= 0.045  # 2 x 25 ms per request
    assert p.stages["list"]["count"] >= 1
    assert p.stages["io_wait"]["seconds"] > 0.5 * p.stages["consumer_wait"]["seconds"]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_hand_their_stages_to_the_parent(dataset, tmp_path, context):
    ds = IterableDataset.from_prefix(f"file://{dataset}/", transform=burn, shuffle=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2,
                                         multiprocessing_context=context)
    trace = tmp_path / "trace.json"
    with wharf.profile(trace=str(trace)) as p:
        n = sum(len(b) for b in p.iterate(loader))
    assert n == SAMPLES
    assert p.report["processes"] == 3, p.table()
    assert p.stages["transform"]["count"] == SAMPLES  # all in the workers
    assert p.stages["collate"]["count"] == SAMPLES // 8
    assert p.verdict == "client-cpu", p.table()
    events = trace_events(trace)
    pids = {e["pid"] for e in events if e["ph"] == "X" and e["name"] == "transform"}
    assert len(pids) == 2 and os.getpid() not in pids
    workers = [e for e in events if e["ph"] == "M" and "DataLoader worker" in e["args"]["name"]]
    assert len(workers) == 2
    assert not list(tmp_path.glob("wharf-profile-*"))  # the spool folder is gone


def test_one_profile_at_a_time_and_results_only_after_it(dataset):
    p = wharf.profile(trace=False).start()
    try:
        with pytest.raises(wharf.WharfError, match="already running"):
            wharf.profile(trace=False).start()
        with pytest.raises(RuntimeError, match="still running"):
            p.verdict
    finally:
        p.stop()
    assert p.verdict in ("store-latency", "bandwidth", "client-cpu", "parse", "consumer")
    with pytest.raises(TypeError, match="not 5"):
        wharf.profile(trace=5)
    with pytest.raises(ValueError, match="cannot write in .*/missing"):
        wharf.profile(trace=f"{dataset}/missing/t.json").start()
    with pytest.raises(ValueError, match="is a directory"):
        wharf.profile(trace=str(dataset)).start()


def test_wharf_profile_env_profiles_the_whole_process(dataset, tmp_path):
    trace = tmp_path / "whole.json"
    code = ("import wharf\n"
            f"s = wharf.Store('file://{dataset}/')\n"
            "keys = [o['key'] for o in s.list()]\n"
            "assert len(s.get_many(keys)) == len(keys)\n")
    env = dict(os.environ, WHARF_PROFILE="1", WHARF_PROFILE_TRACE=str(trace),
               PYTHONPATH=str(ROOT / "python"))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "wharf profile:" in proc.stderr and "verdict: " in proc.stderr
    assert f"trace: {trace}" in proc.stderr
    names = {e["name"] for e in trace_events(trace)}
    assert "first byte" in names and "listing" in names


def test_cli_fetch_profile(dataset, tmp_path):
    trace = tmp_path / "cli.json"
    env = dict(os.environ, WHARF_PROFILE_TRACE=str(trace))
    plain = run_wharf("fetch", "-r", f"file://{dataset}/", "--json", check=True)
    proc = run_wharf("fetch", "-r", f"file://{dataset}/", "--json", "--profile", env=env,
                     check=True)
    # stdout stays the verb's; the table goes to stderr.
    assert json.loads(proc.stdout)["objects"] == json.loads(plain.stdout)["objects"] == SAMPLES
    assert "wharf profile:" not in plain.stderr
    assert "first byte" in proc.stderr and "verdict: " in proc.stderr
    events = trace_events(trace)
    gets = [e for e in events if e["ph"] == "X" and e["name"] == "first byte"]
    assert len(gets) == SAMPLES
    # Requests overlap: each is drawn on a "request slot" lane of its own while it runs.
    slots = {e["tid"] for e in gets}
    named = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert 1 < len(slots) <= SAMPLES and slots <= named
    by_slot = {}
    for e in sorted(gets, key=lambda e: e["ts"]):
        assert e["ts"] >= by_slot.get(e["tid"], 0) - 0.002  # no overlap on one lane
        by_slot[e["tid"]] = e["ts"] + e["dur"]
    assert stat.S_IMODE(os.stat(trace).st_mode) == 0o600
    # A trace that cannot be written is a usage error said before the run, naming it (it
    # failed a fetch that had succeeded).
    for path, why in ((tmp_path / "missing" / "t.json", "cannot write in"),
                      (tmp_path, "is a directory")):
        bad = run_wharf("fetch", "-r", f"file://{dataset}/", "--profile",
                        env=dict(env, WHARF_PROFILE_TRACE=str(path)))
        assert bad.returncode == 2, bad.stderr
        assert f"the profiler's trace {path} (WHARF_PROFILE_TRACE): {why}" in bad.stderr, \
            bad.stderr
        assert not bad.stdout  # nothing was fetched


def test_the_aws_profile_flag_is_still_there(tmp_path):
    # --profile NAME before the verb and --aws-profile NAME anywhere name the AWS profile.
    env = dict(os.environ, AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    for args in (["--profile", "nosuchprofile", "ls", "s3://bkt/"],
                 ["ls", "--aws-profile", "nosuchprofile", "s3://bkt/"]):
        proc = run_wharf(*args, env=env)
        assert proc.returncode != 0
        assert "nosuchprofile" in proc.stderr, proc.stderr
