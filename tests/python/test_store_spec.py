"""Store options and specs from Python: keyword arguments (endpoint=, region=, anonymous=,
profile=) and URI query options reach the store; pickles carry the spec (never a secret) and
reopen it, so a spawned worker needs no environment of its own for the options."""
import json
import multiprocessing as mp
import pickle

import pytest

import wharf


@pytest.fixture
def s3_keys_only(s3_env, monkeypatch):
    """The RGW's keys in this process's environment, but no endpoint: only a store option can
    point a store at the RGW."""
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, s3_env[k])
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "WHARF_NO_SIGN_REQUEST"):
        monkeypatch.delenv(k, raising=False)
    # No instance-metadata probing if a test ever reaches the credential chain's end.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return s3_env


def test_endpoint_kwarg_wrong_fails_clearly_right_one_works(s3_keys_only, bucket):
    wrong = wharf.Store(f"s3://{bucket}/", endpoint="http://127.0.0.1:1")
    with pytest.raises(wharf.WharfError) as e:
        wrong.list()
    assert "127.0.0.1:1" in str(e.value) and f"s3://{bucket}/" in str(e.value)

    right = wharf.Store(f"s3://{bucket}/d/", endpoint=s3_keys_only["WHARF_S3_ENDPOINT"],
                        region="us-east-1")
    right.put("x", b"through the endpoint option")
    assert bytes(right.get("x")) == b"through the endpoint option"
    spec = json.loads(right.spec)
    assert spec["v"] == 1 and spec["scheme"] == "s3" and spec["bucket"] == bucket
    assert spec["options"] == {"endpoint": s3_keys_only["WHARF_S3_ENDPOINT"],
                               "region": "us-east-1"}


def test_query_options_on_a_prefix_uri_and_question_marks_in_keys(s3_keys_only, bucket,
                                                                   s3_client):
    endpoint = s3_keys_only["WHARF_S3_ENDPOINT"]
    store = wharf.Store(f"s3://{bucket}/q/?endpoint={endpoint}&region=us-east-1")
    assert store.uri.startswith(f"s3://{bucket}/q/?")
    store.put("a?b", b"question")
    assert s3_client.get_object(Bucket=bucket, Key="q/a?b")["Body"].read() == b"question"
    assert [o["key"] for o in store.list()] == ["a?b"]
    # Not ending in '/': the '?' belongs to the key (the endpoint comes from the keyword).
    obj = wharf.Store(f"s3://{bucket}/q/a?b", endpoint=endpoint)
    assert bytes(obj.get("")) == b"question"
    # A keyword argument beats the query.
    kw = wharf.Store(f"s3://{bucket}/q/?region=eu-west-1", endpoint=endpoint, region="us-east-1")
    assert json.loads(kw.spec)["options"]["region"] == "us-east-1"


def test_file_paths_with_question_marks(tmp_path):
    store = wharf.Store(f"file://{tmp_path}/dir?x/")
    store.put("k?v", b"1")
    assert (tmp_path / "dir?x" / "k?v").read_bytes() == b"1"
    assert bytes(wharf.Store(str(tmp_path / "dir?x" / "k?v")).get("")) == b"1"
    with pytest.raises(ValueError, match="file:// takes no store options"):
        wharf.Store(f"file://{tmp_path}/", region="eu-west-1")


def test_unknown_or_mistyped_options(tmp_path):
    with pytest.raises(ValueError) as e:
        wharf.Store("s3://some-bucket/", endpiont="http://127.0.0.1:9000")
    assert "'endpiont'" in str(e.value)
    assert "endpoint, region, anonymous, profile, addressing_style, api" in str(e.value)
    with pytest.raises(ValueError, match="unknown store option 'bogus'"):
        wharf.Store("s3://some-bucket/?bogus=1")
    with pytest.raises(TypeError, match="anonymous"):
        wharf.Store("s3://some-bucket/", anonymous="yes")
    with pytest.raises(ValueError, match="endpoint"):
        wharf.Store("s3://some-bucket/", endpoint="127.0.0.1:9000")
    with pytest.raises(ValueError, match="'api' is for gs://"):
        wharf.Store("s3://some-bucket/", api="xml", anonymous=True)


def test_anonymous_sends_unsigned_requests(s3_keys_only, bucket, s3_client):
    endpoint = s3_keys_only["WHARF_S3_ENDPOINT"]
    s3_client.put_object(Bucket=bucket, Key="pub/x", Body=b"public")
    # Keys are in the environment, but anonymous=True must not use them: a private bucket
    # refuses the unsigned request, and the error says why.
    private = wharf.Store(f"s3://{bucket}/pub/", endpoint=endpoint, anonymous=True)
    with pytest.raises(wharf.PermissionDeniedError) as e:
        private.list()
    assert "unsigned" in str(e.value)
    # A public-read bucket (and object) answers the same unsigned store.
    s3_client.put_bucket_acl(Bucket=bucket, ACL="public-read")
    s3_client.put_object_acl(Bucket=bucket, Key="pub/x", ACL="public-read")
    assert [o["key"] for o in private.list()] == ["x"]
    assert bytes(private.get("x")) == b"public"


def _child_reads(store, key, q):
    try:
        q.put(bytes(store.get(key)))
    except Exception as e:  # reported to the parent, which asserts
        q.put(repr(e))


def test_pickle_carries_the_spec_and_no_secret(s3_keys_only, bucket):
    endpoint = s3_keys_only["WHARF_S3_ENDPOINT"]
    store = wharf.Store(f"s3://{bucket}/p/", endpoint=endpoint)
    store.put("k", b"pickled")
    index = wharf.SampleIndex.from_prefix(f"s3://{bucket}/p/", endpoint=endpoint)
    for obj in (store, index):
        blob = pickle.dumps(obj)
        assert s3_keys_only["AWS_SECRET_ACCESS_KEY"].encode() not in blob
        assert s3_keys_only["AWS_ACCESS_KEY_ID"].encode() not in blob
        back = pickle.loads(blob)
        assert back.spec == obj.spec and back.uri == obj.uri
        assert json.loads(back.spec)["options"]["endpoint"] == endpoint
    assert pickle.loads(pickle.dumps(index)).keys() == ["k"]
    # A spawned process has no endpoint in its environment (removed above): it reads through
    # the spec it unpickled, with the keys of its own environment.
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child_reads, args=(store, "k", q))
    p.start()
    result = q.get(timeout=120)
    p.join(30)
    assert result == b"pickled"


def test_index_factories_take_store_options(s3_keys_only, bucket, s3_client):
    endpoint = s3_keys_only["WHARF_S3_ENDPOINT"]
    s3_client.put_object(Bucket=bucket, Key="m/a", Body=b"A")
    s3_client.put_object(Bucket=bucket, Key="m/list.txt", Body=b"a\n")
    by_keys = wharf.SampleIndex.from_keys(f"s3://{bucket}/m/", ["a"], endpoint=endpoint)
    manifest = wharf.SampleIndex.from_manifest(f"s3://{bucket}/m/list.txt", endpoint=endpoint)
    assert manifest.keys() == ["a"] and manifest.uri == f"s3://{bucket}/m/"
    for index in (by_keys, manifest):
        assert json.loads(index.spec)["options"] == {"endpoint": endpoint}
        key, buf = wharf.SampleReader(index).get(0)
        assert (key, bytes(buf)) == ("a", b"A")


def test_torch_datasets_pass_store_options(s3_keys_only, bucket, s3_client):
    import wharf.torch as torch_mod
    endpoint = s3_keys_only["WHARF_S3_ENDPOINT"]
    s3_client.put_object(Bucket=bucket, Key="t/a.bin", Body=b"A")
    ds = torch_mod.MapDataset.from_prefix(f"s3://{bucket}/t/", endpoint=endpoint)
    assert bytes(ds[0].data) == b"A"
    it = torch_mod.IterableDataset.from_keys(f"s3://{bucket}/t/", ["a.bin"], endpoint=endpoint,
                                             shuffle=False)
    assert json.loads(it.index.spec)["options"]["endpoint"] == endpoint
    back = pickle.loads(pickle.dumps(ds))
    assert bytes(back[0].data) == b"A"
