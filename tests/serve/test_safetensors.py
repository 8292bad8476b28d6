"""wharf.serve.load_safetensors / iter_safetensors against the safetensors library's own
loader, on files the library wrote: every dtype it writes, empty tensors and scalars, one
file, lists, a sharded index; on the real S3 server, local files, through a tier; malformed
files refused naming the file and the tensor."""
import json
import os
import struct

import pytest
import torch
from safetensors.torch import load_file, save, save_file

import wharf
from wharf.serve import iter_safetensors, load_safetensors
from conftest import make_tier, run_wharf


def all_dtypes_state():
    """A tensor of every dtype safetensors writes from torch, plus empty ones and a scalar."""
    g = torch.Generator().manual_seed(0)
    state = {
        "f64": torch.randn(33, generator=g, dtype=torch.float64),
        "f32": torch.randn(300, 500, generator=g),
        "f16": torch.randn(7, 9, generator=g).half(),
        "bf16": torch.randn(1000, generator=g).bfloat16(),
        "i64": torch.randint(-2**40, 2**40, (17,), generator=g),
        "i32": torch.randint(-2**30, 2**30, (5, 5), generator=g, dtype=torch.int32),
        "i16": torch.randint(-2**14, 2**14, (11,), generator=g, dtype=torch.int16),
        "i8": torch.randint(-128, 127, (13,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (2, 3, 4), generator=g, dtype=torch.uint8),
        "bool": torch.rand(10, generator=g) > 0.5,
        "c64": torch.randn(6, generator=g, dtype=torch.complex64),
        "f8_e4m3": torch.randn(19, generator=g).to(torch.float8_e4m3fn),
        "f8_e5m2": torch.randn(19, generator=g).to(torch.float8_e5m2),
        "u16": torch.randint(0, 2**15, (4,), generator=g, dtype=torch.int32).to(torch.uint16),
        "u32": torch.randint(0, 2**30, (4,), generator=g, dtype=torch.int64).to(torch.uint32),
        "u64": torch.randint(0, 2**62, (4,), generator=g, dtype=torch.int64).to(torch.uint64),
        "empty": torch.empty(0, 4),
        "empty_bf16": torch.empty(3, 0, dtype=torch.bfloat16),
        "scalar": torch.tensor(2.5),
    }
    if hasattr(torch, "float4_e2m1fn_x2"):  # safetensors' F4: two values per element
        state["f4"] = torch.randint(0, 255, (3, 4), generator=g,
                                    dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    return state


def assert_same(got, want):
    assert list(got) == list(want)  # names, in load_file's order
    for name, w in want.items():
        t = got[name]
        assert t.dtype == w.dtype and t.shape == w.shape, name
        assert t.device.type == "cpu"
        # Bytes, not values: float8 has no equality and NaN != NaN.
        assert torch.equal(t.contiguous().view(-1).view(torch.uint8) if t.numel() else t,
                           w.contiguous().view(-1).view(torch.uint8) if w.numel() else w), name
    # Each tensor owns its storage, as load_file's do (safe to save back with safetensors).
    ptrs = [t.untyped_storage().data_ptr() for t in got.values() if t.numel()]
    assert len(set(ptrs)) == len(ptrs)


def put(s3_client, bucket, key, data: bytes):
    s3_client.put_object(Bucket=bucket, Key=key, Body=data)


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file(all_dtypes_state(), str(path), metadata={"format": "pt"})
    return path


def test_every_dtype_matches_load_file_on_a_local_file(model_file):
    want = load_file(str(model_file))
    assert_same(load_safetensors(str(model_file)), want)
    assert_same(load_safetensors(model_file), want)  # a PathLike
    assert_same(load_safetensors(f"file://{model_file}"), want)
    # The first argument by the name, by the older one, and refused when missing.
    assert_same(load_safetensors(uri_or_uris=str(model_file)), want)
    assert_same(load_safetensors(uris=str(model_file)), want)
    streamed = dict(iter_safetensors(uri_or_uris=[str(model_file)]))  # in completion order
    assert sorted(streamed) == sorted(want)
    assert_same({name: streamed[name] for name in want}, want)
    with pytest.raises(TypeError, match="uri_or_uris"):
        load_safetensors()
    with pytest.raises(TypeError, match="both"):
        iter_safetensors(str(model_file), uris=str(model_file))


def test_every_dtype_matches_load_file_from_s3(aws, bucket, s3_client, model_file):
    put(s3_client, bucket, "m/model.safetensors", model_file.read_bytes())
    want = load_file(str(model_file))
    assert_same(load_safetensors(f"s3://{bucket}/m/model.safetensors"), want)
    # Small GETs: every large tensor split, small ones coalesced, the same bytes.
    assert_same(load_safetensors(f"s3://{bucket}/m/model.safetensors", max_in_flight=3), want)


def sharded(tmp_path, shards=4, tensors=40):
    """A Hugging Face sharded checkpoint: shard files and model.safetensors.index.json."""
    g = torch.Generator().manual_seed(1)
    state = {f"layers.{i}.weight": torch.randn(64 + i, 32, generator=g).bfloat16()
             for i in range(tensors)}
    state.update({f"layers.{i}.bias": torch.randn(32, generator=g) for i in range(tensors)})
    names = sorted(state)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n] for n in names[s::shards]}
        save_file(part, str(tmp_path / fname))
        weight_map.update({n: fname for n in part})
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return state, [f"model-{s + 1:05d}-of-{shards:05d}.safetensors" for s in range(shards)]


def test_a_sharded_index_a_list_and_the_iterator(aws, bucket, s3_client, tmp_path):
    state, files = sharded(tmp_path)
    for name in files + ["model.safetensors.index.json"]:
        put(s3_client, bucket, f"llm/{name}", (tmp_path / name).read_bytes())
    want = {}
    for name in files:
        want.update(load_file(str(tmp_path / name)))
    got = load_safetensors(f"s3://{bucket}/llm/model.safetensors.index.json")
    assert_same(got, want)
    assert_same(load_safetensors([f"s3://{bucket}/llm/{f}" for f in files]), want)
    assert_same(load_safetensors(str(tmp_path / "model.safetensors.index.json")), want)
    # The iterator: every tensor once, each complete when handed over.
    seen = {}
    for name, t in iter_safetensors(f"s3://{bucket}/llm/model.safetensors.index.json"):
        assert name not in seen
        assert torch.equal(t, want[name]), name
        seen[name] = t
    assert set(seen) == set(want)


def test_leaving_the_iterator_early_stops_the_reads(aws, bucket, s3_client, model_file):
    put(s3_client, bucket, "m/model.safetensors", model_file.read_bytes())
    it = iter_safetensors(f"s3://{bucket}/m/model.safetensors")
    name, t = next(it)
    assert t.numel() >= 0
    it.close()  # cancels and waits; nothing touches the tensors afterwards
    assert_same(load_safetensors(f"s3://{bucket}/m/model.safetensors"),
                load_file(str(model_file)))


def test_through_a_tier_and_from_a_tier_path(aws, bucket, s3_client, tmp_path):
    (tmp_path / "src").mkdir()
    _, files = sharded(tmp_path / "src", shards=2)
    for name in files + ["model.safetensors.index.json"]:
        put(s3_client, bucket, f"llm/{name}", (tmp_path / "src" / name).read_bytes())
    want = {}
    for name in files:
        want.update(load_file(str(tmp_path / "src" / name)))
    tier = make_tier(tmp_path / "tier")
    index = f"s3://{bucket}/llm/model.safetensors.index.json"
    assert_same(load_safetensors(index, cache=str(tier)), want)  # read-through: fills
    s3_client.delete_object(Bucket=bucket, Key=f"llm/{files[0]}")
    # The tier answers what the bucket no longer has (immutable mode).
    assert_same(load_safetensors(index, cache=str(tier)), want)
    # A model imported into a tier is read as plain files inside it.
    put(s3_client, bucket, f"llm/{files[0]}", (tmp_path / "src" / files[0]).read_bytes())
    run_wharf("tier", "import", f"s3://{bucket}/llm/", tier / "models" / "llm", check=True,
              env=dict(os.environ))
    assert_same(load_safetensors(str(tier / "models" / "llm" / "model.safetensors.index.json")),
                want)


def header_file(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("case,raw,says", [
    ("length beyond the file", struct.pack("<Q", 10**6) + b"{}", "beyond the end of the file"),
    ("overlap", header_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                             "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
                            bytes(12)), "tensor 'b': its bytes overlap tensor 'a'"),
    ("out of range", header_file({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
                                 bytes(8)), "tensor 'w': data_offsets [0, 16) go past"),
    ("unknown dtype", header_file({"w": {"dtype": "Q4_K", "shape": [4],
                                         "data_offsets": [0, 4]}}, bytes(4)),
     "tensor 'w': unknown dtype 'Q4_K'"),
    ("shape and size disagree", header_file({"w": {"dtype": "F16", "shape": [3, 3],
                                                   "data_offsets": [0, 16]}}, bytes(16)),
     "tensor 'w': shape and dtype give 18 bytes"),
    ("not json", struct.pack("<Q", 5) + b"{abc}", "not valid JSON"),
    ("a name twice", (lambda text: struct.pack("<Q", len(text)) + text + bytes(8))(
        b'{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
        b'"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}'),
     "tensor 'a': the header names it twice"),
    ("a field twice", (lambda text: struct.pack("<Q", len(text)) + text + bytes(8))(
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],'
        b'"shape":[2],"data_offsets":[0,8]}}'),
     "tensor 'a': its entry gives 'shape' twice"),
    ("empty", b"", "empty"),
])
def test_malformed_files_are_refused_naming_file_and_tensor(aws, bucket, s3_client, case, raw,
                                                            says):
    put(s3_client, bucket, "bad/model.safetensors", raw)
    uri = f"s3://{bucket}/bad/model.safetensors"
    with pytest.raises(wharf.DataLossError) as e:
        load_safetensors(uri)
    assert uri in str(e.value) and says in str(e.value), str(e.value)
    # One class for every malformed file: a wharf error and a ValueError (bad input data).
    assert isinstance(e.value, wharf.WharfError) and isinstance(e.value, ValueError)
    with pytest.raises(wharf.DataLossError):
        iter_safetensors(uri)  # refused at the call, before any tensor data is read


def test_missing_files_and_bad_indexes(aws, bucket, s3_client):
    with pytest.raises(wharf.NotFoundError) as e:
        load_safetensors(f"s3://{bucket}/nope.safetensors")
    assert "nope.safetensors" in str(e.value)
    put(s3_client, bucket, "m/model.safetensors.index.json",
        json.dumps({"weight_map": {"w": "../../etc/passwd"}}).encode())
    with pytest.raises(wharf.WharfError, match="not a relative path inside"):
        load_safetensors(f"s3://{bucket}/m/model.safetensors.index.json")
    put(s3_client, bucket, "m/model.safetensors.index.json",
        json.dumps({"weight_map": {"w": "model-1.safetensors"}}).encode())
    with pytest.raises(wharf.NotFoundError, match="the index .*/m/model.safetensors.index.json "
                                                  "names a shard that does not exist: .*"
                                                  "model-1.safetensors"):
        load_safetensors(f"s3://{bucket}/m/model.safetensors.index.json")
    with pytest.raises(ValueError):
        load_safetensors([])


def test_shapes_and_devices_torch_cannot_hold_are_refused_by_name(tmp_path):
    # An empty tensor whose shape torch cannot stride, and a device this process lacks,
    # came back as torch's own errors, naming neither the file nor the tensor.
    path = tmp_path / "huge.safetensors"
    path.write_bytes(header_file({"ok": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                  "a": {"dtype": "F32", "shape": [0, 2**40, 2**40],
                                        "data_offsets": [4, 4]}}, bytes(4)))
    for load in (load_safetensors, lambda p: dict(iter_safetensors(p))):
        with pytest.raises(ValueError, match=f"{path}: tensor 'a': torch cannot make a tensor "
                                             r"of shape \[0, 1099511627776, 1099511627776\]"):
            load(str(path))
    if not torch.cuda.is_available():
        good = tmp_path / "good.safetensors"
        save_file({"w": torch.ones(2)}, str(good))
        for load in (load_safetensors, iter_safetensors):
            with pytest.raises(ValueError, match="cannot place tensors on device 'cuda'"):
                load(str(good), device="cuda")


def test_an_index_that_does_not_match_its_shards_is_refused(aws, bucket, s3_client, tmp_path):
    # A shard from another version of the model: the index promises a tensor its file lacks,
    # or puts one in the wrong file. Loading it anyway would hand back a model short of a
    # tensor, or check nothing the index says.
    state, files = sharded(tmp_path, shards=2, tensors=2)
    for name in files:
        put(s3_client, bucket, f"ix/{name}", (tmp_path / name).read_bytes())
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    uri = f"s3://{bucket}/ix/model.safetensors.index.json"
    put(s3_client, bucket, "ix/model.safetensors.index.json", json.dumps(index).encode())
    got = load_safetensors(uri)
    assert sorted(got) == sorted(state) and all(torch.equal(got[n], state[n]) for n in state)
    ghost = dict(index, weight_map=dict(index["weight_map"], ghost=files[1]))
    put(s3_client, bucket, "ix/model.safetensors.index.json", json.dumps(ghost).encode())
    with pytest.raises(wharf.WharfError, match=r"weight_map puts tensor 'ghost' in .*"
                                               f"{files[1]}, which does not hold it"):
        load_safetensors(uri)
    name = next(n for n, f in index["weight_map"].items() if f == files[0])
    moved = dict(index, weight_map=dict(index["weight_map"], **{name: files[1]}))
    put(s3_client, bucket, "ix/model.safetensors.index.json", json.dumps(moved).encode())
    with pytest.raises(wharf.WharfError, match=f"tensor '{name}' in .*{files[1]}, but it is in"):
        dict(iter_safetensors(uri))


def test_a_file_replaced_during_a_load_fails_instead_of_mixing_versions(aws, bucket, s3_client):
    big = {"w": torch.randn(1 << 20)}
    put(s3_client, bucket, "m/model.safetensors", save(big))
    it = iter_safetensors(f"s3://{bucket}/m/model.safetensors")  # header read, ETag kept
    put(s3_client, bucket, "m/model.safetensors", save({"w": torch.randn(1 << 20)}))
    with pytest.raises(wharf.WharfError, match="model.safetensors"):
        list(it)


def test_gs_uris_load_through_the_xml_api(s3_env, bucket, s3_client, model_file, monkeypatch):
    """gs:// (GCS's XML API settings on the same client) pointed at the real S3 server, as
    tests/s3/test_s3_cli.py does; the GCS JSON API and its emulator are issue 16's."""
    put(s3_client, bucket, "m/model.safetensors", model_file.read_bytes())
    monkeypatch.setenv("WHARF_GS_ENDPOINT", s3_env["WHARF_S3_ENDPOINT"])
    monkeypatch.setenv("WHARF_GS_ACCESS_KEY_ID", s3_env["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv("WHARF_GS_SECRET_ACCESS_KEY", s3_env["AWS_SECRET_ACCESS_KEY"])
    assert_same(load_safetensors(f"gs://{bucket}/m/model.safetensors"),
                load_file(str(model_file)))


def test_a_bytes_path_and_bad_max_in_flight(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.arange(6.0)}, str(path))
    # A bytes path is one path (it was iterated as ints: "TypeError ... not int").
    assert torch.equal(load_safetensors(os.fsencode(path))["w"], torch.arange(6.0))
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(ValueError, match="max_in_flight must be an int >= 0"):
            load_safetensors(path, max_in_flight=bad)


@pytest.mark.parametrize("window,buffers", [(4096, 1), (100_003, 2), (1 << 20, 4), (64 << 20, 4)])
def test_the_staged_path_of_device_loads_gives_the_same_bytes(aws, bucket, s3_client, tmp_path,
                                                              model_file, window, buffers):
    # What a load onto a CUDA device runs (tensors made on the device, filled window by window
    # through a few pinned buffers), here with CPU tensors: pieces of tensors cut across
    # windows, tensors larger than a window, empty ones, ones inside the header probe, and
    # several windows in flight give load_file's bytes. tests/gpu runs it on a GPU.
    from wharf.serve._safetensors import _open, _stream_staged
    state, files = sharded(tmp_path, shards=3, tensors=12)
    for name in files + ["model.safetensors.index.json"]:
        put(s3_client, bucket, f"staged/{name}", (tmp_path / name).read_bytes())
    put(s3_client, bucket, "staged/all.safetensors", model_file.read_bytes())
    cases = [(f"s3://{bucket}/staged/all.safetensors", load_file(str(model_file))),
             (str(model_file), load_file(str(model_file)))]
    want = {}
    for name in files:
        want.update(load_file(str(tmp_path / name)))
    cases.append((f"s3://{bucket}/staged/model.safetensors.index.json", want))
    for uri, expected in cases:
        got = dict(_stream_staged(_open(uri, 0, {}), torch.device("cpu"), window, buffers))
        assert_same({n: got[n] for n in expected}, expected)
    # A file of no tensors, and one of empty tensors only.
    for i, state in enumerate(({}, {"e": torch.empty(0), "f": torch.empty(2, 0)})):
        save_file(state, str(tmp_path / f"e{i}.safetensors"))
        got = dict(_stream_staged(_open(str(tmp_path / f"e{i}.safetensors"), 0, {}),
                                  torch.device("cpu"), window, buffers))
        expected = load_file(str(tmp_path / f"e{i}.safetensors"))
        # Empty tensors share an offset: load_file orders such ties at random (a hash map).
        assert sorted(got) == sorted(expected)
        assert_same({n: got[n] for n in expected}, expected)
    # Leaving early cancels the windows in flight and waits for them.
    it = _stream_staged(_open(cases[0][0], 0, {}), torch.device("cpu"), 4096, 2)
    next(it)
    it.close()


def test_the_staged_path_refuses_shapes_torch_cannot_hold(tmp_path):
    from wharf.serve._safetensors import _open, _stream_staged
    path = tmp_path / "huge.safetensors"
    path.write_bytes(header_file({"ok": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                  "a": {"dtype": "F32", "shape": [0, 2**40, 2**40],
                                        "data_offsets": [4, 4]}}, bytes(4)))
    with pytest.raises(ValueError, match=f"{path}: tensor 'a': torch cannot make a tensor "):
        dict(_stream_staged(_open(str(path), 0, {}), torch.device("cpu")))


def test_one_file_spelled_two_ways_arguments_and_devices(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    tensors = {f"t{i}": torch.full((2,), float(i)) for i in range(3)}
    save_file(tensors, path)
    monkeypatch.chdir(tmp_path)
    # A relative path, the absolute one and its file:// URI are one file: read once.
    got = load_safetensors(["m.safetensors", str(path), f"file://{path}"])
    assert list(got) == list(tensors) and all(torch.equal(got[k], tensors[k]) for k in got)
    # An index whose name ends in upper case is still an index.
    (tmp_path / "index.JSON").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "m.safetensors" for k in tensors}}))
    assert list(load_safetensors(str(tmp_path / "index.JSON"))) == list(tensors)
    with pytest.raises(TypeError, match="uri_or_uris is a URI or path"):
        load_safetensors(5)
    with pytest.raises(ValueError, match="device 'meta'"):
        load_safetensors(str(path), device="meta")


def test_a_header_of_many_tensors_loads_as_load_file_does(tmp_path):
    # 40,000 entries in one header (a merged MoE or quantized checkpoint): the parse is linear
    # (it was quadratic: minutes), and every tensor is there.
    path = tmp_path / "many.safetensors"
    tensors = {f"layer.{i}.scale": torch.tensor([float(i)]) for i in range(40000)}
    save_file(tensors, path)
    got = load_safetensors(str(path))
    want = load_file(path)
    assert list(got) == list(want)
    assert all(torch.equal(got[k], want[k]) for k in ("layer.0.scale", "layer.39999.scale"))
