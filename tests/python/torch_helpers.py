"""Helpers of the wharf.torch tests: the `target` fixture, datasets to write, a TFRecord
writer, the rank process of the distributed test (imported by spawned processes, so it lives
outside the test modules). Not a conftest.py: tests elsewhere import tests/conftest.py as
`conftest`, which a second conftest module would shadow."""
import json
import os
import socket
import struct
import time

import pytest

import wharf

PAYLOAD = b"wharf-sample:"


@pytest.fixture(params=["file", "s3"])
def target(request, tmp_path, monkeypatch):
    """(base URI ending in '/', wharf.Store on it): a local folder, or a fresh bucket on the
    real S3 server (its credentials exported to the environment for the test, so datasets
    and spawned processes reach it). Without the server the s3 variant fails (tests/conftest.py)."""
    if request.param == "file":
        uri = f"file://{tmp_path}/data/"
    else:
        s3_env = request.getfixturevalue("s3_env")
        for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(k, s3_env[k])  # for this test only
        uri = f"s3://{request.getfixturevalue('bucket')}/data/"
    return uri, wharf.Store(uri)


def write_objects(store, prefix: str, n: int) -> list:
    """n small objects prefix000.bin... whose bytes name them; returns their keys."""
    keys = [f"{prefix}{i:03d}.bin" for i in range(n)]
    for k in keys:
        store.put(k, PAYLOAD + k.encode())
    return keys


def sample_keys(batch) -> list:
    """collate_fn: the keys of a batch of Samples, checking each sample's bytes."""
    out = []
    for s in batch:
        assert bytes(s.data).endswith(s.key.encode()), (s.key, bytes(s.data))
        out.append(s.key)
    return out


def record_keys(batch) -> list:
    """collate_fn: the keys of a batch of record Samples."""
    return [s.key for s in batch]


def as_list(batch):
    """collate_fn: the Samples themselves (they travel from workers pickled)."""
    return batch


def keys_and_engine_batches(batch):
    """collate_fn for map-style datasets: (keys, this process's engine batch count, pid)."""
    import torch.utils.data
    info = torch.utils.data.get_worker_info()
    stats = info.dataset.stats() if info is not None else None
    return sample_keys(batch), (stats["batches"] if stats else None), os.getpid()


# -- TFRecord --

def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_file(records) -> tuple:
    """(file bytes, offset of each record's frame)."""
    out, offsets = bytearray(), []
    for r in records:
        offsets.append(len(out))
        length = struct.pack("<Q", len(r))
        out += length + struct.pack("<I", _masked(crc32c(length)))
        out += r + struct.pack("<I", _masked(crc32c(r)))
    return bytes(out), offsets


# -- processes --

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(fn, args, nprocs: int, timeout: float = 180, stacks_dir: str = None):
    """torch.multiprocessing.spawn with a deadline: a hung rank fails the test, never the run.
    On failure, the native stacks a failed rank's DataLoader workers left in `stacks_dir`
    (dump_children_stacks) come first in the message, short enough for a CI summary."""
    import torch.multiprocessing as tmp
    ctx = tmp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise AssertionError(f"ranks did not finish within {timeout} s")
    except Exception as e:
        stacks = _stuck_stacks(stacks_dir)
        if not stacks:
            raise
        last = "\n".join(str(e).strip().splitlines()[-3:])
        raise AssertionError(f"{last}\n{stacks}") from None


def _stuck_stacks(folder) -> str:
    """Each stuck worker's dump in `folder`, one short line per native frame ("func
    file:line"), the interpreter's own frames left out."""
    import re
    if not folder or not os.path.isdir(folder):
        return ""
    frame = re.compile(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(\S+) .*?(?: at (\S+)| from (\S+))?$")
    out = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), errors="replace") as f:
            lines = f.read().splitlines()
        out.append(f"stuck DataLoader worker {name}:")
        for line in lines:
            if line.startswith("Thread "):
                out.append("  " + line.split("(most")[0][:100])
            m = frame.match(line)
            if m and not re.match(r"_?Py|cfunction_|method_vectorcall|slot_tp|"
                                  r"builtin_|call_function|object_vectorcall", m.group(1)):
                where = os.path.basename(m.group(2) or m.group(3) or "")
                out.append(f"    {m.group(1)} {where}")
    return "\n".join(out)


def dump_stacks_if_stuck(worker_id: int, after_s: float = 45) -> None:
    """worker_init_fn: a worker still alive after `after_s` seconds (these loaders' workers
    finish within seconds) writes every thread's Python stack to stderr."""
    import faulthandler
    import sys
    faulthandler.dump_traceback_later(after_s, exit=False, file=sys.stderr)


def dump_children_stacks(stacks_dir: str) -> None:
    """Writes the native stacks of this process's live children (its DataLoader workers,
    wherever they wait: also before worker_init_fn ran) to stacks_dir/<pid>.txt, where gdb is
    installed; run_ranks reports them."""
    import shutil
    import subprocess
    if not shutil.which("gdb"):
        return
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = f.read().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
        if ppid != me:
            continue
        os.makedirs(stacks_dir, exist_ok=True)
        with open(os.path.join(stacks_dir, f"{pid}.txt"), "w") as out:
            subprocess.run(["gdb", "-p", pid, "-batch", "-ex", "thread apply all bt"],
                           stdout=out, stderr=subprocess.STDOUT, timeout=120, check=False)


def rank_main(rank: int, world_size: int, port: int, uri: str, out_dir: str, resume_steps: int,
              shards_uri: str, rows_uri: str = None):
    """The rank; when it fails (a DataLoader timeout), its workers' native stacks are kept."""
    try:
        _rank_main(rank, world_size, port, uri, out_dir, resume_steps, shards_uri, rows_uri)
    except Exception:
        dump_children_stacks(os.path.join(out_dir, "stacks"))
        raise


def _rank_main(rank: int, world_size: int, port: int, uri: str, out_dir: str, resume_steps: int,
               shards_uri: str, rows_uri: str = None):
    """One rank of the distributed test: DataLoaders with 2 workers over an IterableDataset,
    then a StatefulDataLoader with 2 workers over tar shards (stopped and resumed), then CSV
    row files (rows_uri) in a spawned worker. Gathers every rank's keys with
    all_gather_object; rank 0 writes them to out_dir."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from wharf.torch import IterableDataset

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    batch = 4

    def loader(ds, context="fork"):
        # A spawned process's default start method is spawn: fork is asked for explicitly.
        return DataLoader(ds, batch_size=batch, num_workers=2, collate_fn=sample_keys,
                          multiprocessing_context=context, timeout=60,
                          worker_init_fn=dump_stacks_if_stuck)

    def gather(obj):
        out = [None] * world_size
        dist.all_gather_object(out, obj)
        return out

    results = {}
    ds = IterableDataset.from_prefix(uri, seed=7, batch_size_hint=batch)
    results["len"] = gather(len(ds))
    for run, epoch in (("epoch0", 0), ("epoch0_again", 0), ("epoch1", 1)):
        ds.set_epoch(epoch)
        results[run] = gather([k for b in loader(ds) for k in b])

    # Resume: consume resume_steps batches of epoch 2, checkpoint, continue in a new dataset.
    ds = IterableDataset.from_prefix(uri, seed=7, batch_size_hint=batch)
    ds.set_epoch(2)
    it = iter(loader(ds))
    consumed = [k for _ in range(resume_steps) for k in next(it)]
    del it
    state = ds.state_dict(steps=resume_steps)
    resumed = IterableDataset.from_prefix(uri, seed=7, batch_size_hint=batch)
    resumed.load_state_dict(state)
    # Spawned workers have no process group: the rank comes from the pickled dataset.
    rest = [k for b in loader(resumed, "spawn") for k in b]
    results["consumed"] = gather(consumed)
    results["state"] = gather(state)
    results["rest"] = gather(rest)

    # Record shards: each rank's share through 2 workers, whole, then stopped after
    # resume_steps batches and continued from the loader's state in new processes.
    from torchdata.stateful_dataloader import StatefulDataLoader

    def shards_loader(state=None):
        ds = IterableDataset.from_shards(shards_uri, format="tar", seed=11, shuffle_buffer=5)
        out = StatefulDataLoader(ds, batch_size=batch, num_workers=2, timeout=60,
                                 collate_fn=record_keys, worker_init_fn=dump_stacks_if_stuck)
        if state is not None:
            out.load_state_dict(state)
        return out

    full = [k for b in shards_loader() for k in b]
    first = shards_loader()
    it = iter(first)
    before = [k for _ in range(resume_steps) for k in next(it)]
    state = first.state_dict()
    del it, first
    after = [k for b in shards_loader(state) for k in b]
    results["records_full"] = gather(full)
    results["records_resumed"] = gather(before + after)

    if rows_uri is not None:
        # Row files in a spawned worker, which has no process group: the rank is the one the
        # dataset recorded when it was pickled (the worker read every rank's rows before).
        rows = IterableDataset.from_files(rows_uri, format="csv", seed=3)
        spawned = DataLoader(rows, batch_size=None, num_workers=1, timeout=60,
                             multiprocessing_context="spawn", worker_init_fn=dump_stacks_if_stuck)
        results["rows_spawn"] = gather([i for b in spawned for i in b.column("id").to_pylist()])

    if rank == 0:
        with open(os.path.join(out_dir, "results.json"), "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()
