"""wharf.torch.save / wharf.torch.load: torch.save's bytes, streamed through wharf.open."""
import io

import pytest

torch = pytest.importorskip("torch")

import wharf  # noqa: E402
import wharf.torch  # noqa: E402


def _training_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 64)).sum().backward()
        opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 3,
            "big": torch.randn(3 << 20)}  # 12 MiB: more than one part


def _assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def test_round_trip_of_model_and_optimizer_state(root):
    state = _training_state()
    wharf.torch.save(state, root + "ckpt/model.pt")
    loaded = wharf.torch.load(root + "ckpt/model.pt", map_location="cpu")
    _assert_same(state, loaded)
    assert loaded["big"].device.type == "cpu"
    # loads into a fresh model and optimizer
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    model.load_state_dict(loaded["model"])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt.load_state_dict(loaded["optimizer"])


def test_bytes_are_those_of_torch_save_and_load_both_ways(root):
    state = _training_state()
    reference = io.BytesIO()
    torch.save(state, reference)
    wharf.torch.save(state, root + "a.pt")
    store = wharf.Store(root)
    assert bytes(store.get("a.pt")) == reference.getvalue()
    # wharf's object loads with plain torch.load of its bytes
    _assert_same(state, torch.load(io.BytesIO(bytes(store.get("a.pt"))), weights_only=True))
    # and torch.save's bytes, uploaded as they are, load with wharf.torch.load
    store.put("b.pt", reference.getvalue())
    _assert_same(state, wharf.torch.load(root + "b.pt", weights_only=True))


def test_weights_only_and_map_location_are_torch_loads(root):
    class Custom:
        pass

    wharf.torch.save({"x": torch.ones(3), "obj": Custom.__name__}, root + "c.pt")
    out = wharf.torch.load(root + "c.pt", map_location=lambda s, loc: s, weights_only=True)
    assert torch.equal(out["x"], torch.ones(3))
    wharf.torch.save({"f": _training_state}, root + "d.pt")
    with pytest.raises(Exception, match="[Ww]eights only"):
        wharf.torch.load(root + "d.pt", weights_only=True)
    assert wharf.torch.load(root + "d.pt", weights_only=False)["f"] is _training_state


def test_torch_save_and_load_arguments_pass_through(root):
    import pickle
    state = {"w": torch.arange(6.0), "name": "caf\u00e9"}
    # The legacy (non-zip) format and a pickle module of one's own, byte for byte torch's.
    legacy = io.BytesIO()
    torch.save(state, legacy, pickle_module=pickle, _use_new_zipfile_serialization=False)
    wharf.torch.save(state, root + "legacy.pt", pickle_module=pickle,
                     _use_new_zipfile_serialization=False)
    assert bytes(wharf.Store(root).get("legacy.pt")) == legacy.getvalue()
    # The unpickler's arguments (encoding= for Python 2 pickles) and pickle_module.
    out = wharf.torch.load(root + "legacy.pt", pickle_module=pickle, weights_only=False,
                           encoding="latin1")
    _assert_same(state, out)
    with pytest.raises(TypeError, match="mmap"):
        wharf.torch.load(root + "legacy.pt", mmap=True)
    with pytest.raises(ValueError, match="unknown store option 'colour'"):
        wharf.torch.load(root + "legacy.pt", colour="blue")


def test_a_save_that_raises_leaves_nothing(root):
    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot pickle this")

    with pytest.raises(RuntimeError, match="cannot pickle"):
        wharf.torch.save({"big": torch.randn(3 << 20), "bad": Unpicklable()}, root + "e.pt")
    assert wharf.Store(root).list() == []
    with pytest.raises(FileNotFoundError):
        wharf.torch.load(root + "e.pt")


def test_loading_a_directory_says_it_is_one(tmp_path):
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(FileNotFoundError, match=r"ckpt: no such object \(a directory, not a file\)"):
        wharf.torch.load(str(tmp_path / "ckpt"))


def test_a_store_error_during_a_large_save_is_the_error_raised(s3_env, monkeypatch):
    # torch's zip writer turns a failed write into "unexpected pos": the store's error (the
    # bucket, the credentials) is what the caller gets, above one part as below it.
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, s3_env[k])
    big = {"w": torch.randn(3 << 20)}  # 12 MiB: parts go up while torch writes
    uri = "s3://wharf-no-such-bucket-3f9c/ck.pt"
    for state in (big, {"w": torch.ones(4)}):
        with pytest.raises(FileNotFoundError, match="wharf-no-such-bucket-3f9c"):
            wharf.torch.save(state, uri)
