"""Index files (docs/design/dataset.md, "Index"): an index built once from a manifest or a
listing into a compact file, mapped and shared by every process of the node, pickled as its
path. On file:// and on the real S3 server (the `target` fixture)."""
import json
import multiprocessing as mp
import os
import pickle
import shutil

import pytest
from torch.utils.data import DataLoader

import torch_helpers as h
from torch_helpers import target  # noqa: F401 - the fixture
import wharf
from wharf.torch import IterableDataset, MapDataset

N = 57


@pytest.fixture
def manifest(target, tmp_path):
    """(manifest URI, keys relative to it, index cache dir): N objects and a JSON-lines
    manifest naming them with their sizes."""
    base, store = target
    keys = h.write_objects(store, "ds/", N)
    lines = [json.dumps({"key": k[len("ds/"):], "size": len(h.PAYLOAD) + len(k)}) for k in keys]
    store.put("ds/train.jsonl", ("\n".join(lines) + "\n").encode())
    return base + "ds/train.jsonl", [k[len("ds/"):] for k in keys], str(tmp_path / "idx")


def _maps(path: str) -> bool:
    with open("/proc/self/maps") as f:
        return any(line.rstrip("\n").endswith(" " + path) for line in f)


def test_manifest_index_file_is_built_once_and_mapped(manifest):
    uri, keys, cache = manifest
    index = wharf.SampleIndex.from_manifest(uri, index_cache=cache)
    assert index.path is not None and index.path.startswith(cache + "/")
    assert index.memory_bytes == 0 and _maps(index.path)
    assert len(index) == N and index.keys() == keys
    assert index.size(3) == len(h.PAYLOAD) + len("ds/") + len(keys[3])
    inode = os.stat(index.path).st_ino
    again = wharf.SampleIndex.from_manifest(uri, index_cache=cache)
    assert again.path == index.path and os.stat(again.path).st_ino == inode
    # The fingerprint (what resume states record) is the same however the index is held.
    in_memory = wharf.SampleIndex.from_manifest(uri, index_cache=False)
    assert in_memory.path is None and in_memory.memory_bytes > 0
    by_keys = wharf.SampleIndex.from_keys(uri.rsplit("/", 1)[0] + "/", keys)
    assert index.fingerprint == in_memory.fingerprint == by_keys.fingerprint
    key, buf = wharf.SampleReader(index).get(5)
    assert (key, bytes(buf)) == (keys[5], h.PAYLOAD + b"ds/" + keys[5].encode())


def test_listing_index_file_is_shared_by_identical_listings(target, tmp_path):
    base, store = target
    h.write_objects(store, "p/", N)
    cache = str(tmp_path / "idx")
    a = wharf.SampleIndex.from_prefix(base + "p/", index_cache=cache)
    b = wharf.SampleIndex.from_prefix(base + "p/", index_cache=cache)
    assert a.path and a.path == b.path and a.keys() == [f"{i:03d}.bin" for i in range(N)]
    store.put("p/new.bin", b"x")  # another listing: another file, never a stale one
    c = wharf.SampleIndex.from_prefix(base + "p/", index_cache=cache)
    assert c.path != a.path and len(c) == N + 1 and len(a) == N


def test_default_cache_dir_and_in_memory_option(manifest, monkeypatch, tmp_path):
    uri, _, _ = manifest
    monkeypatch.setenv("WHARF_INDEX_CACHE", str(tmp_path / "env-cache"))
    index = wharf.SampleIndex.from_manifest(uri)
    assert index.path.startswith(str(tmp_path / "env-cache") + "/")
    assert wharf.SampleIndex.from_manifest(uri, index_cache=False).path is None
    ds = IterableDataset.from_manifest(uri, index_cache=tmp_path / "pathlike")
    assert ds.index.path.startswith(str(tmp_path / "pathlike") + "/")
    with pytest.raises(TypeError, match="index_cache"):
        wharf.SampleIndex.from_manifest(uri, index_cache=3)


def test_pickle_carries_the_path_not_the_keys(manifest):
    uri, keys, cache = manifest
    index = wharf.SampleIndex.from_manifest(uri, index_cache=cache)
    blob = pickle.dumps(index)
    assert index.path.encode() in blob and keys[7].encode() not in blob
    back = pickle.loads(blob)
    assert back.path == index.path and back.keys() == keys and back.uri == index.uri
    # The datasets hold nothing per sample: they pickle as small as their index.
    for ds in (IterableDataset.from_manifest(uri, index_cache=cache),
               MapDataset.from_manifest(uri, index_cache=cache)):
        assert len(pickle.dumps(ds)) < 4096
    # An index held in memory pickles as its bytes.
    memory = wharf.SampleIndex.from_manifest(uri, index_cache=False)
    back = pickle.loads(pickle.dumps(memory))
    assert back.path is None and back.keys() == keys and back.fingerprint == memory.fingerprint


def test_a_changed_or_damaged_file_is_refused_when_unpickled(manifest, tmp_path):
    uri, keys, cache = manifest
    index = wharf.SampleIndex.from_manifest(uri, index_cache=cache)
    blob = pickle.dumps(index)
    other = wharf.SampleIndex.from_prefix(index.uri, index_cache=str(tmp_path / "o"))
    # Replaced by another index (rename: the mapping above keeps the old file).
    shutil.copy(other.path, index.path + ".new")
    os.replace(index.path + ".new", index.path)
    with pytest.raises(wharf.WharfError, match="changed since it was pickled"):
        pickle.loads(blob)
    with open(index.path + ".new", "wb") as f:
        f.write(b"not an index")
    os.replace(index.path + ".new", index.path)
    with pytest.raises(ValueError, match="not a wharf index file"):
        pickle.loads(blob)
    # The cache rebuilds a damaged file rather than use it.
    rebuilt = wharf.SampleIndex.from_manifest(uri, index_cache=cache)
    assert rebuilt.keys() == keys and rebuilt.fingerprint == index.fingerprint


def _open_and_report(uri, cache, barrier, q):
    index = wharf.SampleIndex.from_manifest(uri, index_cache=cache)
    st = os.stat(index.path)
    barrier.wait()  # both processes hold the mapping now
    q.put((index.path, st.st_ino, _maps(index.path), index.fingerprint, index.memory_bytes,
           [index.key(i) for i in (0, N - 1)]))
    barrier.wait()


def test_two_processes_share_one_file(manifest):
    uri, keys, cache = manifest
    ctx = mp.get_context("spawn")
    barrier, q = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_open_and_report, args=(uri, cache, barrier, q))
             for _ in range(3)]  # three at once: one builds, the others wait for it
    for p in procs:
        p.start()
    got = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert len({(path, inode) for path, inode, *_ in got}) == 1
    for _, _, mapped, fingerprint, heap, first_last in got:
        assert mapped and heap == 0 and first_last == [keys[0], keys[-1]]
    assert len({g[3] for g in got}) == 1


def test_dataloader_workers_map_the_file(manifest):
    uri, keys, cache = manifest
    ds = IterableDataset.from_manifest(uri, index_cache=cache, seed=3, batch_size_hint=4)
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn",
                        collate_fn=h.sample_keys)
    got = [k for batch in loader for k in batch]
    assert sorted(got) == sorted(keys)
    m = MapDataset.from_manifest(uri, index_cache=cache)
    loader = DataLoader(m, batch_size=8, num_workers=2, multiprocessing_context="spawn",
                        collate_fn=h.sample_keys)
    assert [k for batch in loader for k in batch] == keys


def test_resume_states_work_across_index_kinds(manifest):
    uri, keys, cache = manifest
    full = [s.key for s in IterableDataset.from_manifest(uri, index_cache=cache, seed=5)]
    ds = IterableDataset.from_manifest(uri, index_cache=cache, seed=5)
    it = iter(ds)
    head = [next(it).key for _ in range(20)]
    state = ds.state_dict()
    # Resumed over the same samples held in memory: the fingerprint matches, the rest follows.
    resumed = IterableDataset.from_manifest(uri, index_cache=False, seed=5)
    resumed.load_state_dict(state)
    assert head + [s.key for s in resumed] == full
    # A state of another manifest version is refused.
    base, _ = uri.rsplit("/", 1)
    store = wharf.Store(base + "/")
    store.put("train.jsonl", ("\n".join(keys[1:]) + "\n").encode())
    other = IterableDataset.from_manifest(uri, index_cache=cache, seed=5)
    assert other.index.path != ds.index.path and len(other.index) == N - 1
    with pytest.raises(wharf.WharfError):
        other.load_state_dict(state)
