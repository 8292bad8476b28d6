"""One runtime per process from Python: wharf.configure(), wharf.metrics(), and the one memory
budget that every get_many, stream and dataset takes its buffers from (docs/design/runtime.md).

Each test runs its body in a fresh interpreter: the runtime is per process, and a budget
configured here must neither leak into other tests nor inherit theirs."""
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import pytest

import wharf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20


def run_python(script: str, tmp_path, env_extra=None, args=()) -> dict:
    """Runs `script` in a new interpreter with this checkout's package; returns the JSON it
    prints last."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    env = dict(os.environ)
    env.pop("WHARF_MEMORY_BUDGET", None)
    env.pop("WHARF_INFLIGHT", None)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, str(path), *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def s3_base(s3_env, bucket, monkeypatch):
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, s3_env[k])  # for this test only
    return f"s3://{bucket}/"


def _blob(seed: int, size: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def test_two_datasets_and_a_get_many_never_exceed_the_one_budget(s3_base, tmp_path):
    """The issue's test: a 48 MiB budget; an object dataset and a tar-shard dataset iterated
    concurrently on two threads while a third thread runs get_many, over 176 MiB in all (3.7x
    the budget). The budget's peak never passes its limit (no block here is larger than the
    budget, so the one-oversized-block allowance never applies), and every byte arrives."""
    store = wharf.Store(s3_base)
    expected = {}
    for i in range(24):  # raw/: 24 x 2 MiB objects
        data = _blob(i, 2 * MiB)
        store.put(f"raw/{i:03d}.bin", data)
        expected[f"raw/{i:03d}.bin"] = hashlib.sha256(data).hexdigest()
    for s in range(2):  # tar/: 2 shards of 24 x 1 MiB members
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for j in range(24):
                data = _blob(1000 + 100 * s + j, MiB)
                info = tarfile.TarInfo(f"s{s}-{j:03d}.bin")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                expected[f"tar:s{s}-{j:03d}"] = hashlib.sha256(data).hexdigest()
        store.put(f"tar/shard-{s}.tar", out.getvalue())
    for i in range(16):  # many/: 16 x 5 MiB objects
        data = _blob(2000 + i, 5 * MiB)
        store.put(f"many/{i:03d}.bin", data)
        expected[f"many/{i:03d}.bin"] = hashlib.sha256(data).hexdigest()
    (tmp_path / "expected.json").write_text(json.dumps(expected))

    result = run_python("""
        import gc, hashlib, json, sys, threading
        import wharf
        import wharf.torch as wt

        base, expected_path = sys.argv[1], sys.argv[2]
        wharf.configure(memory_budget="48M")
        wharf._wharf._reset_peak()
        got, errors = {}, []

        def raw():
            ds = wt.IterableDataset.from_prefix(base + "raw/", seed=1, prefetch=8)
            for s in ds:
                got["raw/" + s.key] = hashlib.sha256(memoryview(s.data)).hexdigest()

        def shards():
            ds = wt.RecordDataset(base, "tar/", format="tar", seed=2)
            for s in ds:
                got["tar:" + s.key] = hashlib.sha256(memoryview(s["bin"])).hexdigest()

        def many():
            store = wharf.Store(base)
            keys = [f"many/{i:03d}.bin" for i in range(16)]
            for k, b in zip(keys, store.get_many(keys)):
                got[k] = hashlib.sha256(memoryview(b)).hexdigest()

        def guarded(fn):
            try:
                fn()
            except BaseException as e:  # reported to the test
                errors.append(f"{fn.__name__}: {e!r}")

        threads = [threading.Thread(target=guarded, args=(f,)) for f in (raw, shards, many)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        gc.collect()
        m = wharf.metrics()
        expected = json.load(open(expected_path))
        print(json.dumps({
            "errors": errors,
            "missing": sorted(set(expected) - set(got)),
            "wrong": sorted(k for k in expected if k in got and got[k] != expected[k]),
            "gauges": {k: v for k, v in m["gauges"].items() if "memory_budget" in k},
            "fetched": m["counters"]['wharf_fetch_bytes_total{scheme="s3"}'],
        }))
    """, tmp_path, args=(s3_base, tmp_path / "expected.json"))
    assert result["errors"] == []
    assert result["missing"] == [] and result["wrong"] == []
    g = result["gauges"]
    assert g["wharf_memory_budget_limit_bytes"] == 48 * MiB
    assert g["wharf_memory_budget_peak_bytes"] <= g["wharf_memory_budget_limit_bytes"]
    # The budget did carry the load: far more than one object's worth was held at once.
    assert g["wharf_memory_budget_peak_bytes"] >= 16 * MiB
    assert g["wharf_memory_budget_held_bytes"] == 0  # everything was released
    assert result["fetched"] >= (24 * 2 + 16 * 5) * MiB  # the object bytes went through it


def test_configure_changes_the_limit_and_reads_the_environment(tmp_path):
    result = run_python("""
        import json, os
        import wharf

        out = {"default": wharf.metrics()["gauges"]["wharf_memory_budget_limit_bytes"]}
        wharf.configure(memory_budget="256M", inflight=5)
        opts = wharf._wharf._runtime_options()
        out["configured"] = [wharf.metrics()["gauges"]["wharf_memory_budget_limit_bytes"],
                             opts["inflight"]]
        out["env"] = [os.environ["WHARF_MEMORY_BUDGET"], os.environ["WHARF_INFLIGHT"]]
        wharf.configure(memory_budget=3 << 20)   # int bytes; inflight unchanged
        out["int"] = [wharf._wharf._runtime_options()["memory_budget"],
                      wharf._wharf._runtime_options()["inflight"]]
        errors = []
        for bad in ("12X", "-1", "1e3", 0, True, [1]):
            try:
                wharf.configure(memory_budget=bad)
                errors.append(None)
            except (ValueError, TypeError) as e:
                errors.append(type(e).__name__ + ": " + str(e))
        out["errors"] = errors
        out["sizes"] = [wharf.parse_size(s) for s in ("1K", "2M", "3G", "1T", "4096", "8mib")]
        print(json.dumps(out))
    """, tmp_path)
    assert result["default"] == 1 << 30
    assert result["configured"] == [256 * MiB, 5]
    assert result["env"] == [str(256 * MiB), "5"]  # inherited by processes started later
    assert result["int"] == [3 * MiB, 5]
    errors = result["errors"]
    assert all(e is not None for e in errors), errors
    assert "invalid size '12X'" in errors[0] and "K, M, G or T" in errors[0]
    assert errors[1].startswith("ValueError") and errors[2].startswith("ValueError")
    assert "positive" in errors[3]
    assert errors[4].startswith("TypeError") and errors[5].startswith("TypeError")
    assert result["sizes"] == [1 << 10, 2 << 20, 3 << 30, 1 << 40, 4096, 8 << 20]

    from_env = run_python("""
        import json, wharf
        print(json.dumps(wharf._wharf._runtime_options()))
    """, tmp_path, env_extra={"WHARF_MEMORY_BUDGET": "64M", "WHARF_INFLIGHT": "7"})
    assert from_env == {"memory_budget": 64 * MiB, "inflight": 7}


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_dataloader_workers_inherit_and_split_the_budget(tmp_path, start):
    """Each of 2 DataLoader workers gets half the node's configured budget; a worker that
    configures its own budget (worker_init_fn) keeps it; the main process keeps the node's."""
    store = wharf.Store(f"file://{tmp_path}/data/")
    for i in range(8):
        store.put(f"{i}.bin", bytes([i]) * 100)
    result = run_python("""
        import json, os, sys
        import torch.utils.data
        import wharf
        import wharf.torch as wt

        def budget_of_worker(sample):
            return os.getpid(), wharf._wharf._runtime_options()["memory_budget"]

        def own_budget(worker_id):
            wharf.configure(memory_budget="80M")

        def run(**kwargs):
            ds = wt.IterableDataset.from_prefix(sys.argv[1], transform=budget_of_worker)
            loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                                 multiprocessing_context=sys.argv[2], **kwargs)
            return sorted(set((pid, b) for pid, b in loader))

        if __name__ == "__main__":
            wharf.configure(memory_budget="96M")
            split = run()
            own = run(worker_init_fn=own_budget)
            print(json.dumps({"split": split, "own": own,
                              "main": wharf._wharf._runtime_options()["memory_budget"]}))
    """, tmp_path, args=(f"file://{tmp_path}/data/", start))
    assert len(result["split"]) == 2  # two workers
    assert [b for _, b in result["split"]] == [48 * MiB, 48 * MiB]
    assert [b for _, b in result["own"]] == [80 * MiB, 80 * MiB]
    assert result["main"] == 96 * MiB
