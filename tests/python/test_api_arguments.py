"""Arguments a user gets wrong, or passes in another accepted shape: each is refused with an
error naming it, or taken as meant; never a silent misreading."""
import copy
import pickle

import pytest

import wharf
from wharf.torch import CheckpointManager, IterableDataset, MapDataset


def test_suffixes_given_as_one_string_is_one_suffix(tmp_path):
    store = wharf.Store(f"file://{tmp_path}/")
    store.put("d/a.bin", b"a")
    store.put("d/b.txt", b"b")
    store.put("d/n", b"n")  # ends in "n": list(".bin") would have matched it
    for cls in (MapDataset, IterableDataset):
        ds = cls.from_prefix(f"file://{tmp_path}/d/", suffixes=".bin")
        assert len(ds) == 1, cls
    with pytest.raises(ValueError, match=r"no objects ending in \.jpg found"):
        MapDataset.from_prefix(f"file://{tmp_path}/d/", suffixes=".jpg")


def test_checkpoint_manager_refuses_none_rather_than_saving_into_none(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match="dir_or_uri"):
        CheckpointManager(None)
    assert not (tmp_path / "None").exists()
    m = CheckpointManager(tmp_path / "run")  # a pathlib.Path is a path
    m.close()


def test_list_buckets_names_a_uri_that_is_not_a_scheme():
    with pytest.raises(ValueError, match=r"expected a scheme such as 's3'.*got 's3://b/'"):
        wharf.list_buckets("s3://b/")


@pytest.mark.parametrize("mode", ["rb", "wb"])
def test_an_open_file_refuses_copy_and_pickle(tmp_path, mode):
    store = wharf.Store(f"file://{tmp_path}/")
    store.put("x", b"x" * 100)
    f = wharf.open(f"file://{tmp_path}/{'x' if mode == 'rb' else 'y'}", mode)
    for attempt in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="cannot be copied or pickled"):
            attempt(f)
    if mode == "wb":
        f.write(b"still usable")
    f.close()
    if mode == "wb":
        assert bytes(store.get("y")) == b"still usable"


def test_subpackages_load_on_first_use_without_importing_torch_before():
    import subprocess
    import sys
    code = ("import sys, wharf\n"
            "assert 'torch' not in sys.modules\n"
            "assert callable(wharf.torch.save) and 'torch' in sys.modules\n"
            "assert wharf.serve.PredictionCache\n"
            "try:\n    wharf.no_such_name\nexcept AttributeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "no attribute 'no_such_name'" in out.stdout


def test_get_many_refuses_one_str_and_bad_entry_fields(tmp_path):
    store = wharf.Store(f"file://{tmp_path}/")
    store.put("abc", b"x")
    with pytest.raises(TypeError, match="not one str"):
        store.get_many("abc")
    for entry, err, what in [({"key": "abc", "size": -1}, ValueError, "size"),
                             ({"key": "abc", "size": "5"}, ValueError, "size"),
                             ({"key": "abc", "size": 2 ** 64}, ValueError, "size"),
                             ({"key": "abc", "etag": 5}, TypeError, "etag")]:
        with pytest.raises(err, match=what):
            store.get_many([entry])
    with pytest.raises(ValueError, match="inflight"):
        store.get_many(["abc"], inflight=-1)
    assert [bytes(b) for b in store.get_many(["abc", {"key": "abc", "size": 1}])] == [b"x", b"x"]


def test_a_transform_that_is_not_callable_is_refused_at_once(tmp_path):
    store = wharf.Store(f"file://{tmp_path}/")
    store.put("d/a.bin", b"a")
    with pytest.raises(TypeError, match="transform must be a callable"):
        MapDataset.from_prefix(f"file://{tmp_path}/d/", [".bin"])  # suffixes in transform's place
    with pytest.raises(TypeError, match="transform must be a callable"):
        IterableDataset.from_prefix(f"file://{tmp_path}/d/", transform=5)


def test_configure_checks_every_argument_before_applying_any(monkeypatch):
    import os
    monkeypatch.delenv("WHARF_LOG", raising=False)
    for kwargs, err, what in [(dict(log_level="error", inflight="8"), TypeError, "inflight"),
                              (dict(log_level="error", inflight=2 ** 40), ValueError, "inflight"),
                              (dict(log_level="error", memory_budget=-1), ValueError,
                               "memory_budget"),
                              (dict(inflight=8, log_level="loud"), ValueError, "log_level")]:
        with pytest.raises(err, match=what):
            wharf.configure(**kwargs)
        assert "WHARF_LOG" not in os.environ  # nothing was applied


def test_load_state_dict_refuses_what_is_not_a_state(tmp_path):
    import json
    store = wharf.Store(f"file://{tmp_path}/")
    store.put("d/a.bin", b"a")
    store.put("t/0.jsonl", b'{"id": 1}\n')
    datasets = [IterableDataset.from_prefix(f"file://{tmp_path}/d/"),
                IterableDataset.from_files(f"file://{tmp_path}/t/")]
    for ds in datasets:
        for bad in (None, json.dumps(ds.state_dict()), [("epoch", 0)]):
            with pytest.raises(TypeError, match="state must be a dict"):
                ds.load_state_dict(bad)
        ds.load_state_dict(ds.state_dict())  # a real one still loads


def test_a_pathlib_path_is_taken_where_a_uri_is(tmp_path):
    # A path object names a folder (pathlib drops the '/' a str URI needs to be one).
    store = wharf.Store(tmp_path)
    store.put("d/a.bin", b"a")
    store.put("d/b.bin", b"b")
    assert (tmp_path / "d" / "a.bin").read_bytes() == b"a"
    assert bytes(wharf.Store(tmp_path / "d").get("b.bin")) == b"b"
    assert len(wharf.SampleIndex.from_prefix(tmp_path / "d")) == 2
    assert len(wharf.SampleIndex.from_keys(tmp_path / "d", ["a.bin"])) == 1
    (tmp_path / "m.txt").write_text("d/a.bin\nd/b.bin\n")
    assert len(wharf.SampleIndex.from_manifest(tmp_path / "m.txt")) == 2
    for cls in (MapDataset, IterableDataset):
        assert len(cls.from_prefix(tmp_path / "d", suffixes=".bin")) == 2, cls
    with pytest.raises(TypeError, match=r"str \| os.PathLike"):
        wharf.Store(5)
