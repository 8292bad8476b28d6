"""torch.distributed.checkpoint through wharf (python/wharf/torch/checkpoint.py): StorageWriter /
StorageReader round trips on s3:// (the real Ceph RGW), a local directory, file:// and a tier
path; interop with DCP's own FileSystemWriter / FileSystemReader; two gloo ranks saving DTensor
shards and loading them back, resharded, and into one process; dcp.async_save's staging copy;
errors (no checkpoint, a missing file, wrong credentials) and ETag-pinned loads."""
import json
import os
import pickle
import re
import sys
import uuid
from concurrent.futures import Future

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import wharf
from conftest import ROOT, make_tier, run_processes
from wharf.torch.checkpoint import RAW_DESCRIPTOR, StorageReader, StorageWriter

import dcp_worker  # tests/checkpoint/dcp_worker.py: one rank of the two-rank tests

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

DATA_FILE = re.compile(r"__(\d+)_\d+\.distcp")


@pytest.fixture
def s3(aws, bucket):
    """A fresh bucket; the server's credentials in this process's environment."""
    return bucket


class Where:
    """A checkpoint location: its URI, and how to list its files."""

    def __init__(self, uri, local_dir=None, s3_client=None, bucket=None, prefix=None):
        self.uri, self.local_dir = uri, local_dir
        self._s3, self.bucket, self.prefix = s3_client, bucket, prefix

    def names(self):
        if self.local_dir is not None:
            return sorted(os.listdir(self.local_dir))
        listing = self._s3.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix + "/")
        return sorted(o["Key"][len(self.prefix) + 1:] for o in listing.get("Contents", []))

    def remove(self, name):
        if self.local_dir is not None:
            os.remove(os.path.join(self.local_dir, name))
        else:
            self._s3.delete_object(Bucket=self.bucket, Key=f"{self.prefix}/{name}")


def where(kind, request, tmp_path, name="ckpt"):
    if kind == "s3":
        bucket = request.getfixturevalue("s3")
        return Where(f"s3://{bucket}/{name}", s3_client=request.getfixturevalue("s3_client"),
                     bucket=bucket, prefix=name)
    if kind == "local":
        return Where(str(tmp_path / name), local_dir=str(tmp_path / name))
    if kind == "file":
        return Where(f"file://{tmp_path}/{name}", local_dir=str(tmp_path / name))
    assert kind == "tier"
    tier = make_tier(tmp_path / "tier")
    return Where(str(tier / "ckpts" / name), local_dir=str(tier / "ckpts" / name))


def failures(exc):
    """The exceptions a CheckpointException carries (one per failed rank), else [exc]."""
    if isinstance(exc, CheckpointException):
        return [f[0] if isinstance(f, tuple) else f for f in exc.failures.values()]
    return [exc]


def state():
    g = torch.Generator().manual_seed(0)
    return {
        "f32": torch.randn(256, 129, generator=g),
        "big": torch.randn(2_400_000, generator=g),  # 9.2 MiB: more than one upload part
        "bf16": torch.randn(33, 17, generator=g).to(torch.bfloat16),
        "i64": torch.randint(-2 ** 40, 2 ** 40, (1000,), generator=g),
        "scalar": torch.tensor(3.25),
        "empty": torch.empty(0, 7),
        "transposed": torch.randn(12, 20, generator=g).t(),  # not contiguous
        "nested": {"inner": {"w": torch.randn(5, 5, generator=g)}, "count": 7},
        "list": [torch.arange(6, dtype=torch.int32), torch.ones(2, 3, dtype=torch.float64)],
        "step": 1234,
        "name": "run-\u03b1",
    }


def zeros_like(value):
    """A destination of the same structure: zeros of the same shapes, placeholders elsewhere."""
    if isinstance(value, torch.Tensor):
        if not value.is_contiguous() and value.dim() == 2:  # a non-contiguous destination too
            return torch.zeros(value.shape[1], value.shape[0], dtype=value.dtype).t()
        return torch.zeros(value.shape, dtype=value.dtype)
    if isinstance(value, dict):
        return {k: zeros_like(v) for k, v in value.items()}
    if isinstance(value, list):
        return [zeros_like(v) for v in value]
    return type(value)()


def assert_same(expected, got, path="state"):
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), path
        assert got.dtype == expected.dtype and got.shape == expected.shape, path
        assert torch.equal(got, expected), path
    elif isinstance(expected, dict):
        assert got.keys() == expected.keys(), path
        for k in expected:
            assert_same(expected[k], got[k], f"{path}.{k}")
    elif isinstance(expected, list):
        assert len(got) == len(expected), path
        for i, (e, g) in enumerate(zip(expected, got)):
            assert_same(e, g, f"{path}[{i}]")
    else:
        assert got == expected, path


def clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clone(v) for v in value]
    return value


# ---- 1. round trips -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["s3", "local", "file", "tier"])
def test_round_trip_of_every_kind_of_value(kind, request, tmp_path):
    at = where(kind, request, tmp_path)
    sd = state()
    expected = clone(sd)
    dcp.save(sd, storage_writer=StorageWriter(at.uri))
    dst = zeros_like(sd)
    assert not dst["transposed"].is_contiguous()
    dcp.load(dst, storage_reader=StorageReader(at.uri))
    assert_same(expected, dst)

    names = at.names()
    assert names.count(".metadata") == 1
    data = [n for n in names if n != ".metadata"]
    assert data and all(DATA_FILE.fullmatch(n) and n.startswith("__0_") for n in data), names
    if kind == "tier":
        for n in names:
            entry = json.loads(os.getxattr(os.path.join(at.local_dir, n), "user.wharf.entry"))
            assert entry["local"] is True, (n, entry)
            assert entry["size"] == os.path.getsize(os.path.join(at.local_dir, n))


@pytest.mark.parametrize("kind", ["s3", "file"])
def test_accelerator_state_larger_than_a_wave_is_written_in_waves(kind, request, tmp_path):
    # Tensors on an accelerator go through pinned host buffers of 256 MiB, more than that in
    # waves of files (two in flight). Here CPU tensors take that path (_stage_all) with small
    # waves: every kind of value, a tensor larger than a wave, lazy conjugates, non-contiguous
    # views and empty tensors come back as saved, from more files than files_per_rank.
    # tests/gpu runs it with CUDA tensors.
    at = where(kind, request, tmp_path)
    sd = state()
    g = torch.Generator().manual_seed(3)
    sd["many"] = {f"t{i}": torch.randn(2000 * (i + 1), generator=g) for i in range(12)}
    sd["conj"] = torch.randn(300, generator=g, dtype=torch.complex64).conj()
    expected = clone(sd)
    expected["conj"] = sd["conj"].resolve_conj()
    writer = StorageWriter(at.uri, files_per_rank=2)
    writer._stage_all, writer._wave_bytes = True, 100_000
    dcp.save(sd, storage_writer=writer)
    data = [n for n in at.names() if n != ".metadata"]
    assert len(data) > 2 and all(DATA_FILE.fullmatch(n) for n in data), data
    # Loads into accelerator tensors go through pinned buffers in waves too (up to four in
    # flight), the plain reader and the staged one alike; a non-contiguous destination among
    # them.
    for wave in (None, 4096, 100_000):
        reader = StorageReader(at.uri)
        if wave:
            reader._stage_all, reader._wave_bytes = True, wave
        dst = zeros_like(sd)
        dcp.load(dst, storage_reader=reader)
        dst["conj"] = dst["conj"].resolve_conj()
        assert_same(expected, dst)
    # A part of the state, staged.
    reader = StorageReader(at.uri)
    reader._stage_all, reader._wave_bytes = True, 4096
    part = {"many": {f"t{i}": torch.zeros(2000 * (i + 1)) for i in range(12)}}
    dcp.load(part, storage_reader=reader)
    for i in range(12):
        assert torch.equal(part["many"][f"t{i}"], expected["many"][f"t{i}"]), i


# ---- 2. interop with DCP's FileSystemWriter / FileSystemReader --------------------------------

def test_a_filesystemwriter_checkpoint_uploaded_to_the_bucket_loads(s3, s3_client, tmp_path):
    sd = state()
    expected = clone(sd)
    local = tmp_path / "fsw"
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(local)))
    metadata = pickle.loads((local / ".metadata").read_bytes())
    assert all(RAW_DESCRIPTOR not in (getattr(i, "transform_descriptors", None) or ())
               for i in metadata.storage_data.values())  # DCP's own encoding (torch.save)
    for name in os.listdir(local):
        s3_client.upload_file(str(local / name), s3, f"from-fsw/{name}")
    dst = zeros_like(sd)
    dcp.load(dst, storage_reader=StorageReader(f"s3://{s3}/from-fsw"))
    assert_same(expected, dst)


def test_filesystemreader_refuses_a_wharf_checkpoint_by_name(tmp_path):
    sd = state()
    dcp.save(sd, storage_writer=StorageWriter(str(tmp_path / "w")))
    dst = zeros_like(sd)
    with pytest.raises(CheckpointException) as info:
        dcp.load(dst, storage_reader=dcp.FileSystemReader(str(tmp_path / "w")))
    assert any("wharf.raw" in str(e) for e in failures(info.value)), failures(info.value)
    # nothing was misread into the destination
    assert torch.count_nonzero(dst["f32"]) == 0 and torch.count_nonzero(dst["big"]) == 0


def test_damaged_metadata_is_named_as_such(tmp_path):
    sd = state()
    dcp.save(sd, storage_writer=StorageWriter(str(tmp_path / "w")))
    meta = tmp_path / "w" / ".metadata"
    meta.write_bytes(meta.read_bytes()[:100])
    with pytest.raises((Exception, CheckpointException)) as info:  # the latter: BaseException
        dcp.load(zeros_like(sd), storage_reader=StorageReader(str(tmp_path / "w")))
    # torch gathers the reader's errors into its own; ours names the file and the cause
    text = str(info.value)
    if isinstance(info.value, CheckpointException):
        text += " ".join(str(e) for e in failures(info.value))
    assert re.search(r"/w/\.metadata: the checkpoint's metadata is damaged \(Unpickling",
                     text), text


# ---- 3. two ranks: DTensor shards, resharding, one process -----------------------------------

@pytest.mark.parametrize("kind", ["s3", "tier"])
def test_two_ranks_save_dtensor_shards_and_load_them_resharded(kind, request, tmp_path, s3_env):
    at = where(kind, request, tmp_path)
    env = dict(s3_env)
    env["AWS_REGION"] = "us-east-1"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "python"), os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    rdzv = tmp_path / f"rdzv-{uuid.uuid4().hex}"
    worker = os.path.join(os.path.dirname(__file__), "dcp_worker.py")
    ran = run_processes([[sys.executable, worker, at.uri, str(rdzv), str(r), "2",
                          str(tmp_path / f"out{r}.json")] for r in range(2)], env)
    for r, (code, log) in enumerate(ran):
        assert code == 0, f"rank {r} exited {code}:\n{log[-4000:]}"

    half = dcp_worker.WEIGHT_SHAPE[1] // 2
    for r in range(2):
        found = json.loads((tmp_path / f"out{r}.json").read_text())
        assert found["rank"] == r
        # (a) back into Shard(0) DTensors
        assert found["shard0"]["weight_local_shape"] == [32, 48]
        assert found["shard0"]["odd_local_shape"] == [[3, 3], [2, 3]][r]
        # (b) into Shard(1) DTensors: each local shard takes a box that is not contiguous in
        # either saved chunk
        assert found["shard1"]["weight_local_shape"] == [64, half]
        assert found["shard1"]["odd_local_shape"] == [[5, 2], [5, 1]][r]
        for how in ("shard0", "shard1"):
            for check in ("weight_local_equal", "weight_full_equal", "odd_local_equal",
                          "replicated_equal", "bytes_equal"):
                assert found[how][check] is True, (r, how, check)

    names = at.names()
    assert names.count(".metadata") == 1, names
    ranks = {int(DATA_FILE.fullmatch(n).group(1)) for n in names if n != ".metadata"}
    assert ranks == {0, 1}, names
    if kind == "tier":
        for n in names:
            assert json.loads(os.getxattr(os.path.join(at.local_dir, n),
                                          "user.wharf.entry"))["local"] is True

    # (c) one process, no process group: full plain tensors
    weight, odd, replicated = dcp_worker.full_tensors()
    dst = {"model": {"weight": torch.zeros(weight.shape), "odd": torch.zeros(odd.shape,
                                                                             dtype=odd.dtype)},
           "replicated": torch.zeros_like(replicated), "rank0": b"", "rank1": b""}
    dcp.load(dst, storage_reader=StorageReader(at.uri))
    assert torch.equal(dst["model"]["weight"], weight)
    assert dst["model"]["odd"].dtype == torch.bfloat16 and torch.equal(dst["model"]["odd"], odd)
    assert torch.equal(dst["replicated"], replicated)
    assert dst["rank0"] == dcp_worker.rank_bytes(0) and dst["rank1"] == dcp_worker.rank_bytes(1)


# ---- 4. async_save ----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["s3", "tier"])
def test_async_save_writes_the_state_at_the_time_of_the_call(kind, request, tmp_path):
    at = where(kind, request, tmp_path)
    sd = state()
    expected = clone(sd)
    future = dcp.async_save(sd, storage_writer=StorageWriter(at.uri))
    assert isinstance(future, Future)
    # training goes on: the source tensors change before the upload is done
    sd["f32"].add_(1)
    sd["big"].mul_(-2)
    sd["bf16"].zero_()
    sd["i64"].add_(7)
    sd["scalar"].fill_(-1)
    sd["transposed"].fill_(5)
    sd["nested"]["inner"]["w"].neg_()
    sd["list"][0].add_(100)
    future.result(timeout=120)
    assert not torch.equal(sd["f32"], expected["f32"])
    dst = zeros_like(expected)
    dcp.load(dst, storage_reader=StorageReader(at.uri))
    assert_same(expected, dst)


# ---- 5. errors --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["s3", "local"])
def test_loading_where_there_is_no_checkpoint_names_the_uri(kind, request, tmp_path):
    at = where(kind, request, tmp_path, name="never-saved")
    with pytest.raises(FileNotFoundError) as info:
        StorageReader(at.uri).read_metadata()
    assert at.uri in str(info.value) and ".metadata" in str(info.value)
    # dcp.load wraps every rank's error in a CheckpointException; it still names the URI
    with pytest.raises(CheckpointException) as info:
        dcp.load({"x": torch.zeros(3)}, storage_reader=StorageReader(at.uri))
    assert f"{at.uri}/.metadata" in str(info.value)


def test_loading_from_a_bucket_that_does_not_exist_says_so(aws):
    missing = f"wharf-missing-{uuid.uuid4().hex[:12]}"
    with pytest.raises(wharf.NotFoundError) as info:
        StorageReader(f"s3://{missing}/x").read_metadata()
    message = str(info.value)
    assert f"s3://{missing}/x/.metadata" in message and "NoSuchBucket" in message
    assert "no such checkpoint" not in message


@pytest.mark.parametrize("kind", ["s3", "local"])
def test_a_save_that_dies_over_a_checkpoint_leaves_none_not_a_mix(kind, request, tmp_path):
    # Overwriting (DCP's default): the old .metadata goes before any file is written, so a
    # save that dies after writing some files leaves no checkpoint, never the old metadata
    # over a mix of old and new files.
    at = where(kind, request, tmp_path)
    dcp.save({"a": torch.ones(100)}, storage_writer=StorageWriter(at.uri, files_per_rank=1))

    class DiesAfterWriting(StorageWriter):
        def write_data(self, plan, planner):
            done = super().write_data(plan, planner)
            done.wait()  # the files are written
            raise RuntimeError("killed")

    with pytest.raises(CheckpointException, match="killed"):
        dcp.save({"a": torch.full((100,), 3.0)},
                 storage_writer=DiesAfterWriting(at.uri, files_per_rank=1))
    assert ".metadata" not in at.names()
    with pytest.raises(CheckpointException, match="no such checkpoint"):
        dcp.load({"a": torch.zeros(100)}, storage_reader=StorageReader(at.uri))
    dcp.save({"a": torch.full((100,), 5.0)}, storage_writer=StorageWriter(at.uri))
    out = {"a": torch.zeros(100)}
    dcp.load(out, storage_reader=StorageReader(at.uri))
    assert torch.equal(out["a"], torch.full((100,), 5.0))


@pytest.mark.parametrize("kind", ["s3", "local", "tier"])
def test_the_next_save_removes_what_killed_saves_left(kind, request, tmp_path):
    # A save killed with -9 leaves temporary files of its writers (a folder) or multipart
    # uploads of its files (a bucket); nothing removed them, so each kill cost the space of
    # what it had written. The next save to the folder removes them; a live writer's
    # temporary file (locked) and uploads of keys in subfolders stay.
    import fcntl
    at = where(kind, request, tmp_path)
    dcp.save({"a": torch.ones(100)}, storage_writer=StorageWriter(at.uri))
    if at.local_dir is not None:
        dead = os.path.join(at.local_dir, ".wharf-tmp-ldeadwriter")
        live = os.path.join(at.local_dir, ".wharf-tmp-llivewriter")
        for path in (dead, live):
            with open(path, "wb") as f:
                f.write(b"partial")
        holder = open(live, "rb")
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        dcp.save({"a": torch.full((100,), 2.0)}, storage_writer=StorageWriter(at.uri))
        assert not os.path.exists(dead) and os.path.exists(live)
        holder.close()
    else:
        client = request.getfixturevalue("s3_client")
        for key in ("__0_0.distcp", "__0_7.distcp", "sub/__0_0.distcp"):
            client.create_multipart_upload(Bucket=at.bucket, Key=f"{at.prefix}/{key}")
        dcp.save({"a": torch.full((100,), 2.0)}, storage_writer=StorageWriter(at.uri))
        left = client.list_multipart_uploads(Bucket=at.bucket).get("Uploads", [])
        assert [u["Key"] for u in left] == [f"{at.prefix}/sub/__0_0.distcp"]
    out = {"a": torch.zeros(100)}
    dcp.load(out, storage_reader=StorageReader(at.uri))
    assert torch.equal(out["a"], torch.full((100,), 2.0))


@pytest.mark.parametrize("kind", ["s3", "local"])
def test_a_missing_data_file_is_an_error_naming_it(kind, request, tmp_path):
    at = where(kind, request, tmp_path)
    sd = {"a": torch.randn(100, 10), "b": torch.arange(50)}
    dcp.save(sd, storage_writer=StorageWriter(at.uri, files_per_rank=1))
    assert at.names() == [".metadata", "__0_0.distcp"]
    at.remove("__0_0.distcp")
    with pytest.raises(CheckpointException) as info:
        dcp.load(zeros_like(sd), storage_reader=StorageReader(at.uri))
    [error] = failures(info.value)
    assert isinstance(error, FileNotFoundError), repr(error)
    assert "__0_0.distcp" in str(error)


def test_wrong_credentials_are_a_permission_error_and_leave_no_metadata(s3, s3_client,
                                                                         monkeypatch):
    uri = f"s3://{s3}/denied"
    good = StorageWriter(f"s3://{s3}/readable")
    dcp.save({"x": torch.ones(4)}, storage_writer=good)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-key-0000000000000000000000")
    with pytest.raises(CheckpointException) as info:
        dcp.save(state(), storage_writer=StorageWriter(uri))
    errors = failures(info.value)
    assert errors and all(isinstance(e, wharf.PermissionDeniedError) for e in errors), errors
    assert isinstance(errors[0], PermissionError)
    assert uri in str(errors[0])
    # a read is refused as well, not reported as a missing checkpoint
    with pytest.raises(wharf.PermissionDeniedError):
        StorageReader(f"s3://{s3}/readable").read_metadata()
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=s3).get("Contents", [])]
    assert "denied/.metadata" not in keys and not [k for k in keys if k.startswith("denied/")]
    assert "readable/.metadata" in keys  # the listing sees what is there
    assert not s3_client.list_multipart_uploads(Bucket=s3).get("Uploads")


# ---- 6. ETag-pinned loads -----------------------------------------------------------------------

def test_a_pinned_load_of_an_overwritten_file_fails_instead_of_mixing(s3, s3_client):
    uri = f"s3://{s3}/pinned"
    sd = {"a": torch.randn(300, 40), "b": torch.arange(1000)}
    dcp.save(sd, storage_writer=StorageWriter(uri, files_per_rank=1))
    head = s3_client.head_object(Bucket=s3, Key="pinned/__0_0.distcp")
    etag, size = head["ETag"], head["ContentLength"]  # boto3's form: quoted
    assert etag.startswith('"')
    for pin in (etag, etag.strip('"')):  # both forms pin to the current version
        dst = zeros_like(sd)
        dcp.load(dst, storage_reader=StorageReader(uri, etags={"__0_0.distcp": pin}))
        assert_same(sd, dst)

    other = os.urandom(size)  # different bytes, the same size: the offsets still fit
    s3_client.put_object(Bucket=s3, Key="pinned/__0_0.distcp", Body=other)
    dst = zeros_like(sd)
    with pytest.raises(CheckpointException) as info:
        dcp.load(dst, storage_reader=StorageReader(uri, etags={"__0_0.distcp": etag}))
    [error] = failures(info.value)
    assert isinstance(error, wharf.WharfError), repr(error)
    assert "__0_0.distcp" in str(error) and "PreconditionFailed" in str(error)
    # unpinned, the same load reads the new bytes: the pin is what refused them
    dcp.load(dst, storage_reader=StorageReader(uri))
    assert not torch.equal(dst["a"], sd["a"])


def test_lazy_conjugate_and_negative_views_are_saved_as_their_values(tmp_path):
    g = torch.Generator().manual_seed(3)
    sd = {"conj": torch.randn(16, dtype=torch.complex64, generator=g).conj(),
          "neg": torch._neg_view(torch.randn(16, generator=g))}
    assert sd["conj"].is_conj() and sd["neg"].is_neg()
    dcp.save(sd, storage_writer=StorageWriter(str(tmp_path / "views")))
    dst = {"conj": torch.zeros(16, dtype=torch.complex64),
           "neg": torch.zeros(16)}
    dcp.load(dst, storage_reader=StorageReader(str(tmp_path / "views")))
    assert torch.equal(dst["conj"], sd["conj"].resolve_conj())
    assert torch.equal(dst["neg"], sd["neg"].resolve_neg())
    # and into a conjugate view as the destination
    dst = {"conj": torch.zeros(16, dtype=torch.complex64).conj(), "neg": torch.zeros(16)}
    dcp.load(dst, storage_reader=StorageReader(str(tmp_path / "views")))
    assert torch.equal(dst["conj"].resolve_conj(), sd["conj"].resolve_conj())
