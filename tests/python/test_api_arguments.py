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
        with pytest.raises(TypeError, match="cannot be"):
            attempt(f)
    if mode == "wb":
        f.write(b"still usable")
    f.close()
    if mode == "wb":
        assert bytes(store.get("y")) == b"still usable"
