"""wharf.torch.CheckpointManager with real torch (CPU) against the real Ceph RGW: retention in
the tier and in the bucket it exports to, async saves that return before the commit and save
what the state was when save() returned, restore after the tier is lost, kill -9 in the middle
of a save (on s3:// through a slow link and on a tier), bit-exact resume of a training run, and
the errors it raises.

Kill delays are random; the seed is printed (WHARF_CRASH_SEED replays a run)."""
import datetime
import json
import math
import os
import pathlib
import pickle
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch

import wharf
from conftest import make_tier, run_processes, run_wharf
from wharf.torch import CheckpointManager

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ckpt_worker import step1_state  # noqa: E402


def step_dir(step):
    return f"step-{step:012d}"


# ---- helpers ----

@pytest.fixture
def tier(tmp_path, s3_env):
    return make_tier(tmp_path / "tier", s3_env)


@pytest.fixture
def rng():
    seed = int(os.environ.get("WHARF_CRASH_SEED", random.randrange(1 << 31)))
    print(f"WHARF_CRASH_SEED={seed}")
    return random.Random(seed)


def bucket_steps(s3_client, bucket, prefix):
    """{step: [file names]} below s3://bucket/prefix/."""
    out = {}
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                     Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            rel = o["Key"][len(prefix) + 1:]
            if "/" in rel:
                d, name = rel.split("/", 1)
                out.setdefault(int(d.split("-")[1]), []).append(name)
    return out


def uploads(s3_client, bucket, prefix=""):
    return s3_client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])


def tier_steps(root):
    return sorted(int(p.name.split("-")[1]) for p in pathlib.Path(root).glob("step-*"))


def entry_of(path):
    return json.loads(os.getxattr(path, "user.wharf.entry"))


def small_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


def stepped_optimizer(model):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(4, 32)).sum().backward()
    opt.step()
    return opt


def assert_same(a, b, where="state"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), (where, set(a), set(b))
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def marked_state(model, step):
    """A state whose `marker` says which step saved it."""
    return {"model": model, "marker": torch.tensor([step], dtype=torch.int64),
            "info": {"step": step}}


# ---- 1. retention, export, where ----

def test_retention_keeps_latest_and_best_in_tier_and_bucket(tier, bucket, aws, s3_client):
    root = tier / "run"
    mgr = CheckpointManager(root, export_to=f"s3://{bucket}/run", keep_last=2, keep_best=1,
                            metric="loss", mode="min")
    model = small_model(0)
    losses = {1: 3.0, 2: 0.5, 3: 2.0, 4: 1.5, 5: 1.0}  # the best is step 2
    saved = {}
    for step, loss in losses.items():
        with torch.no_grad():
            model[0].weight.add_(step)
        saved[step] = {k: v.clone() for k, v in model.state_dict().items()}
        mgr.save(step, marked_state(model, step), metrics={"loss": loss})
    mgr.wait()

    kept = [2, 4, 5]
    assert tier_steps(root) == kept
    in_bucket = bucket_steps(s3_client, bucket, "run")
    assert sorted(in_bucket) == kept
    for step in kept:
        assert (root / step_dir(step) / "manifest.json").is_file()
        assert "manifest.json" in in_bucket[step]
        assert sorted(in_bucket[step]) == sorted(os.listdir(root / step_dir(step)))
    assert uploads(s3_client, bucket) == []
    listed = mgr.list()
    assert [(m["step"], m["where"], m["metrics"]) for m in listed] == \
        [(s, "both", {"loss": losses[s]}) for s in kept]
    # Exported tier files are local no more: their entries name the bucket's copies.
    for step in kept:
        for name in os.listdir(root / step_dir(step)):
            e = entry_of(root / step_dir(step) / name)
            assert e["local"] is False, (step, name)
            assert e["source"] == f"s3://{bucket}/run/{step_dir(step)}/{name}"
    # The root records its settings for the CLI.
    config = json.loads((root / "checkpoints.json").read_text())
    assert config == {"export_to": f"s3://{bucket}/run/", "metric": "loss", "mode": "min"}
    for step in kept:
        state = mgr.restore(step)
        assert state["marker"].tolist() == [step] and state["info"] == {"step": step}
        assert_same(state["model"], saved[step])
    mgr.close()


def test_a_tiers_root_is_a_checkpoint_root_beside_what_else_it_holds(tier, bucket, aws):
    # CheckpointManager(dir) with the directory `wharf tier init` made: its steps sit beside
    # the tier's other files, which retention never touches.
    (tier / "data").mkdir()
    (tier / "data" / "mine.txt").write_text("user data")
    mgr = CheckpointManager(tier, export_to=f"s3://{bucket}/rootrun", keep_last=1)
    model = small_model(1)
    for step in (1, 2):
        mgr.save(step, marked_state(model, step))
    mgr.wait()
    assert tier_steps(tier) == [2]
    assert (tier / "data" / "mine.txt").read_text() == "user data"
    assert mgr.restore("latest")["marker"].tolist() == [2]
    mgr.close()
    listed = [json.loads(line) for line in
              run_wharf("ckpt", "ls", "--json", tier, env=aws, check=True).stdout.splitlines()]
    assert [(j["step"], j["where"]) for j in listed] == [(2, "both")]
    assert run_wharf("tier", "verify", tier, env=aws).returncode == 0


def test_retention_after_saves_and_after_exports_never_deletes_a_step_twice(tier, bucket, aws,
                                                                          s3_client):
    # Each commit (the save thread) and each export (the export thread) applies retention and
    # removes abandoned steps; a step being deleted by one looks abandoned to the other (its
    # manifest goes first). Run at once, both deleted it and one of them failed.
    root = tier / "often"
    mgr = CheckpointManager(root, export_to=f"s3://{bucket}/often", keep_last=1)
    for step in range(40):
        mgr.save(step, {"x": torch.full((4,), float(step))})
    mgr.wait()
    assert tier_steps(root) == [39]
    assert sorted(bucket_steps(s3_client, bucket, "often")) == [39]
    mgr.close()


def test_export_every_leaves_unexported_checkpoints_local(tier, bucket, aws, s3_client):
    root = tier / "run"
    mgr = CheckpointManager(root, export_to=f"s3://{bucket}/run", keep_last=2, keep_best=1,
                            metric="loss", mode="min", export_every=2)
    model = small_model(1)
    losses = {1: 0.1, 2: 3.0, 3: 2.0, 4: 1.5, 5: 1.2}  # the best, step 1, is never exported
    for step, loss in losses.items():
        mgr.save(step, marked_state(model, step), metrics={"loss": loss})
    mgr.wait()
    # The tier: latest 2 and the best; steps 2 and 4 were exported (saves 2 and 4), so the
    # bucket holds those (its own latest 2, step 4 also its best).
    assert tier_steps(root) == [1, 4, 5]
    assert sorted(bucket_steps(s3_client, bucket, "run")) == [2, 4]
    assert [(m["step"], m["where"]) for m in mgr.list()] == \
        [(1, "tier"), (2, "bucket"), (4, "both"), (5, "tier")]
    for step, local in ((1, True), (4, False), (5, True)):
        names = os.listdir(root / step_dir(step))
        assert "manifest.json" in names
        for name in names:
            assert entry_of(root / step_dir(step) / name)["local"] is local, (step, name)
    # Each restores, from where it is (step 2 is copied back into the tier first).
    for step in (1, 2, 4, 5):
        assert mgr.restore(step)["marker"].tolist() == [step]
    assert tier_steps(root) == [1, 2, 4, 5]
    mgr.close()


def test_a_bucket_root_exporting_to_another_prefix_restores_from_either(bucket, aws):
    # Both roots are buckets (`where` says "bucket" for both): a checkpoint not exported yet
    # restores from the root, one only in the export destination is copied back first.
    mgr = CheckpointManager(f"s3://{bucket}/fast", export_to=f"s3://{bucket}/archive",
                            export_every=2, keep_last=2)
    model = small_model(2)
    for step in (1, 2, 3, 4, 5):
        mgr.save(step, marked_state(model, step))
    mgr.wait()
    assert [(m["step"], m["where"]) for m in mgr.list()] == \
        [(2, "bucket"), (4, "both"), (5, "bucket")]
    for step in (5, 2, 4):
        assert mgr.restore(step)["marker"].tolist() == [step]
    mgr.close()


# ---- 2. async saves ----

def test_async_save_returns_before_the_commit_and_saves_the_state_of_that_moment(
        bucket, aws, s3_client, slow_link):
    endpoint = slow_link(delay_ms=25)  # every request 50 ms: a save takes many of them
    mgr = CheckpointManager(f"s3://{bucket}/slow", endpoint=endpoint)
    model = small_model(3)
    opt = stepped_optimizer(model)
    at_save1 = {k: v.clone() for k, v in model.state_dict().items()}
    h1 = mgr.save(1, {"model": model, "optim": opt})
    pending = not h1.done()
    committed_early = _exists(s3_client, bucket, f"slow/{step_dir(1)}/manifest.json")
    with torch.no_grad():  # in place, right away: the staged copy is what gets written
        for p in model.parameters():
            p.mul_(-2.0).add_(1.0)
    at_save2 = {k: v.clone() for k, v in model.state_dict().items()}
    # A second save while the first still writes from the staging copy: it waits for those
    # writes before copying into it (else step 1 would hold step 2's values).
    h2 = mgr.save(2, {"model": model, "optim": opt})
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(7.0)
    assert pending and not committed_early
    assert h1.result()["step"] == 1 and h2.result()["step"] == 2
    assert not any(torch.equal(at_save1[k], at_save2[k]) for k in at_save1)
    assert_same(mgr.restore(1)["model"], at_save1)
    assert_same(mgr.restore(2)["model"], at_save2)
    # The optimizer state too (what save() saw; untouched since).
    assert_same(mgr.restore(2)["optim"]["state"], opt.state_dict()["state"])
    mgr.close()


def _exists(s3_client, bucket, key):
    return s3_client.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount", 0) > 0


def test_restore_in_place_into_a_fresh_model_and_optimizer(tier):
    mgr = CheckpointManager(tier / "run")
    model = small_model(4)
    opt = stepped_optimizer(model)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 32)).pow(2).sum().backward()
        opt.step()
    mgr.save(3, {"model": model, "optim": opt, "epoch": 7}).result()

    fresh = small_model(99)
    fresh_opt = stepped_optimizer(fresh)  # DCP loads into existing tensors: state must exist
    assert not torch.equal(fresh[0].weight, model[0].weight)
    state = {"model": fresh, "optim": fresh_opt, "epoch": 0}
    assert mgr.restore(3, state=state) is state
    assert state["epoch"] == 7
    assert_same(fresh.state_dict(), model.state_dict())
    assert_same(fresh_opt.state_dict(), opt.state_dict())
    # An optimizer that has not stepped gets the saved state too (it was skipped in silence:
    # DCP loads into the tensors the caller's state holds, and it held none).
    unstepped = small_model(5)
    unstepped_opt = torch.optim.Adam(unstepped.parameters(), lr=1e-2)
    mgr.restore(3, state={"model": unstepped, "optim": unstepped_opt})
    assert_same(unstepped_opt.state_dict(), opt.state_dict())
    # A model of another shape is refused, not half loaded.
    other = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8),
                                torch.nn.Linear(8, 2))
    before = other[3].weight.clone()
    with pytest.raises(RuntimeError, match="Missing key.*model.3.weight"):
        mgr.restore(3, state={"model": other})
    assert torch.equal(other[3].weight, before)
    mgr.close()


class _Unpicklable:
    """Copies for the async staging, and fails when DCP pickles it into the checkpoint."""

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


@pytest.mark.parametrize("where,async_save", [("tier", True), ("tier", False), ("bucket", True)])
def test_a_failed_save_of_a_committed_step_keeps_the_old_checkpoint(tier, bucket, aws, s3_client,
                                                                    where, async_save):
    # The save of a step that has a checkpoint cleared it first (manifest first), so a save
    # that then failed, or was killed, lost the last good checkpoint. It is now written aside
    # (<root>/.replacing) and put in place once committed (a bucket: copied server-side).
    root = tier / "again" if where == "tier" else f"s3://{bucket}/again"
    mgr = CheckpointManager(root, keep_last=1, async_save=async_save)
    mgr.save(5, {"x": torch.full((3,), 5.0)}).result()
    with pytest.raises(Exception, match="cannot pickle this"):
        mgr.save(5, {"x": torch.full((3,), 55.0), "bad": _Unpicklable()}).result()
    mgr.wait()  # the failure went to its caller (result()): reported once, not again
    assert [m["step"] for m in mgr.list()] == [5]
    assert torch.equal(mgr.restore("latest")["x"], torch.full((3,), 5.0))
    # A save that succeeds replaces it, and leaves nothing aside.
    mgr.save(5, {"x": torch.full((3,), 56.0)}).result()
    assert torch.equal(mgr.restore(5)["x"], torch.full((3,), 56.0))
    if where == "tier":
        assert not any((tier / "again" / ".replacing").iterdir())
    else:
        left = s3_client.list_objects_v2(Bucket=bucket, Prefix="again/.replacing/")
        assert left.get("KeyCount", 0) == 0, left
        assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    mgr.close()


def test_a_replacement_killed_between_its_renames_is_finished_by_the_next_manager(tier):
    mgr = CheckpointManager(tier / "gap")
    mgr.save(3, {"x": torch.full((2,), 3.0)}).result()
    mgr.save(3, {"x": torch.full((2,), 33.0)}).result()
    mgr.close()
    # As if killed between the swap's two renames: the step's directory gone, the committed
    # replacement still aside; and a killed save's leftovers beside it.
    root = tier / "gap"
    aside = root / ".replacing"
    aside.mkdir(exist_ok=True)
    os.rename(root / "step-000000000003", aside / "step-000000000003")
    (aside / "step-000000000009").mkdir()
    (aside / "step-000000000009" / "__0_0.distcp").write_bytes(b"partial")
    again = CheckpointManager(root)
    assert [m["step"] for m in again.list()] == [3]
    assert torch.equal(again.restore(3)["x"], torch.full((2,), 33.0))
    assert not any(aside.iterdir())
    again.close()


def test_a_bucket_replacement_killed_while_copied_in_is_finished_by_the_next_manager(
        bucket, aws, s3_client):
    root = f"s3://{bucket}/gap"
    mgr = CheckpointManager(root)
    mgr.save(3, {"x": torch.full((2,), 3.0)}).result()
    mgr.close()
    # As if killed while the committed replacement was copied in: the step's old manifest
    # gone, the replacement whole under .replacing.
    staged = CheckpointManager(f"{root}/.replacing")
    staged.save(3, {"x": torch.full((2,), 33.0)}).result()
    staged.close()
    s3_client.delete_object(Bucket=bucket, Key="gap/step-000000000003/manifest.json")
    again = CheckpointManager(root)
    assert [m["step"] for m in again.list()] == [3]
    assert torch.equal(again.restore(3)["x"], torch.full((2,), 33.0))
    left = s3_client.list_objects_v2(Bucket=bucket, Prefix="gap/.replacing/step-")
    assert left.get("KeyCount", 0) == 0, left
    again.close()


def test_a_step_saved_again_while_retention_removes_its_older_copy(tier, bucket, aws,
                                                                  monkeypatch):
    # The save decided it replaced the committed step before it waited for that step's
    # export, whose retention then removed the older copy: the swap failed with a raw
    # FileNotFoundError and the new checkpoint (the best) stayed aside, never listed.
    root = tier / "gone"
    mgr = CheckpointManager(root, export_to=f"s3://{bucket}/gone", keep_last=1, keep_best=1,
                            metric="loss")
    mgr.save(10, {"x": torch.tensor([10.0])}, metrics={"loss": 0.5}).result()
    mgr.wait()
    with pytest.warns(RuntimeWarning, match="below the latest"):
        mgr.save(5, {"x": torch.tensor([1.0]), "pad": torch.randn(1 << 20)},
                 metrics={"loss": 0.9}).result()
    mgr.save(5, {"x": torch.tensor([2.0])}, metrics={"loss": 0.1}).result()
    mgr.wait()
    assert sorted(m["step"] for m in mgr.list()) == [5, 10]
    assert mgr.restore("best")["x"].tolist() == [2.0]
    # The older copy removed by anything else between the decision and the swap.
    replaces = mgr._replaces

    def replaces_then_removed(step):
        decided = replaces(step)
        shutil.rmtree(root / step_dir(step))
        return decided

    monkeypatch.setattr(mgr, "_replaces", replaces_then_removed)
    mgr.save(5, {"x": torch.tensor([3.0])}, metrics={"loss": 0.05}).result()
    mgr.wait()
    assert mgr.restore("best")["x"].tolist() == [3.0]
    assert not any((root / ".replacing").iterdir())
    mgr.close()


def _in_bucket(dest, s3_client, bucket, prefix):
    """What checkpoint 5 in `dest` holds ("x"), checking that nothing was left aside."""
    left = s3_client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/.replacing/")
    assert left.get("KeyCount", 0) == 0, left
    bucket_root = CheckpointManager(dest)
    try:
        return bucket_root.restore(5)["x"]
    finally:
        bucket_root.close()


def test_a_failed_export_of_a_step_saved_again_keeps_the_buckets_older_copy(tier, bucket, aws,
                                                                            s3_env, s3_client):
    # The export of a step the bucket already held (the step saved again) removed the
    # bucket's checkpoint of it first (its manifest), so an export that failed left the
    # bucket without it. The older one is now kept aside (<export>/.replacing) until the new
    # one is committed, and put back when the export fails.
    from fault_proxy import FaultProxy
    root, dest = tier / "reexp", f"s3://{bucket}/reexp"
    mgr = CheckpointManager(root, export_to=dest)
    mgr.save(5, {"x": torch.full((3,), 5.0)})
    mgr.close()
    upstream = s3_env["WHARF_S3_ENDPOINT"].split("://", 1)[1]
    with FaultProxy(upstream) as proxy:
        proxy.set_faults([{"match": {"method": "PUT",
                                     "path_regex": r"/reexp/step-\d+/[^/]+\.distcp$"},
                           "action": "status", "status": 403, "code": "AccessDenied",
                           "count": None}])
        mgr = CheckpointManager(root, export_to=dest, endpoint=proxy.url)
        mgr.save(5, {"x": torch.full((3,), 55.0)}).result()
        with pytest.raises(wharf.PermissionDeniedError, match="AccessDenied"):
            mgr.wait()
        mgr.close()
        assert any(e["fault"] for e in proxy.log()), "the export never failed"
    assert torch.equal(_in_bucket(dest, s3_client, bucket, "reexp"), torch.full((3,), 5.0))
    # The next manager exports the step again: the bucket's copy is another checkpoint.
    mgr = CheckpointManager(root, export_to=dest)
    mgr.wait()
    mgr.close()
    assert torch.equal(_in_bucket(dest, s3_client, bucket, "reexp"), torch.full((3,), 55.0))

    # Killed in the middle of such an export: the older copy aside, the step's manifest gone.
    # The next manager puts the older one back, then exports the tier's again.
    mgr = CheckpointManager(root, export_to=dest)
    mgr.save(5, {"x": torch.full((3,), 555.0)}, metrics={}).result()
    mgr.close()
    aside = CheckpointManager(f"{dest}/.replacing")
    aside.save(5, {"x": torch.full((3,), 55.0)}).result()
    aside.close()
    s3_client.delete_object(Bucket=bucket, Key="reexp/step-000000000005/manifest.json")
    mgr = CheckpointManager(root, export_to=dest)
    mgr.wait()
    mgr.close()
    assert torch.equal(_in_bucket(dest, s3_client, bucket, "reexp"), torch.full((3,), 555.0))


def test_restore_in_place_gives_a_dataset_the_state_it_saved(tier, tmp_path):
    # A dataset in `state` is saved as its state_dict. In place it was loaded through DCP
    # into the fresh dataset's own state, whose stream is None where the saved one has the
    # position: "Missing key in checkpoint state_dict: data.stream.". It now gets the state
    # it saved through load_state_dict.
    import io
    import tarfile
    from wharf.torch import IterableDataset
    shards = tmp_path / "shards"
    shards.mkdir()
    for s in range(2):
        with tarfile.open(shards / f"{s}.tar", "w") as t:
            for i in range(10):
                body = f"{s}-{i}".encode()
                info = tarfile.TarInfo(f"s{s}_{i:03d}.txt")
                info.size = len(body)
                t.addfile(info, io.BytesIO(body))
    ds = IterableDataset.from_shards(f"file://{shards}/", seed=3)
    it = iter(ds)
    [next(it) for _ in range(7)]
    mgr = CheckpointManager(tier / "ds")
    mgr.save(1, {"data": ds, "model": small_model(1)}).result()
    rest = [s.key for s in it]
    fresh = IterableDataset.from_shards(f"file://{shards}/", seed=3)
    mgr.restore(1, state={"data": fresh, "model": small_model(2)})
    assert [s.key for s in fresh] == rest
    mgr.close()


# ---- 3. the tier lost ----

def test_restore_after_the_tier_is_lost(tier, bucket, aws):
    root = tier / "run"
    args = dict(export_to=f"s3://{bucket}/run", metric="loss", mode="min")
    mgr = CheckpointManager(root, **args)
    model = small_model(5)
    losses = {1: 2.0, 2: 0.5, 3: 1.0, 4: 1.5}
    for step, loss in losses.items():
        mgr.save(step, marked_state(model, step), metrics={"loss": loss})
        time.sleep(0.01)  # commits apart in time, for restore by time
    mgr.close()
    times = {m["step"]: m["time"] for m in mgr.list()}
    assert sorted(times) == [1, 2, 3, 4] and times[1] < times[2] < times[3] < times[4]

    shutil.rmtree(root)
    mgr = CheckpointManager(root, **args)
    assert [(m["step"], m["where"]) for m in mgr.list()] == [(s, "bucket") for s in losses]
    assert mgr.restore("latest")["marker"].tolist() == [4]
    assert (root / step_dir(4) / "manifest.json").is_file()  # copied into the tier first
    assert mgr.last_restored["step"] == 4
    assert mgr.restore("best")["marker"].tolist() == [2]
    assert (root / step_dir(2) / "manifest.json").is_file()
    assert tier_steps(root) == [2, 4]
    assert [(m["step"], m["where"]) for m in mgr.list()] == \
        [(1, "bucket"), (2, "both"), (3, "bucket"), (4, "both")]
    with pytest.raises(FileNotFoundError, match="step 99"):
        mgr.restore(99)
    # By time: the latest committed at or before it (naive local time or aware UTC).
    between = datetime.datetime.fromtimestamp((times[2] + times[3]) / 2)
    assert mgr.restore(between)["marker"].tolist() == [2]
    aware = datetime.datetime.fromtimestamp((times[3] + times[4]) / 2, tz=datetime.timezone.utc)
    assert mgr.restore(aware)["marker"].tolist() == [3]
    with pytest.raises(FileNotFoundError):
        mgr.restore(datetime.datetime.fromtimestamp(times[1] - 60))
    # A checkpoint's own time, as a datetime (microseconds: it may round below the float).
    for m in mgr.list():
        at = datetime.datetime.fromtimestamp(m["time"], tz=datetime.timezone.utc)
        assert mgr.restore(at)["marker"].tolist() == [m["step"]], m
    # Steps as save() takes them.
    import numpy
    assert mgr.restore(numpy.int64(3))["marker"].tolist() == [3]
    assert mgr.restore(torch.tensor(4))["marker"].tolist() == [4]
    with pytest.raises(TypeError, match="which must be .* not float 2.5"):
        mgr.restore(2.5)
    with pytest.raises(TypeError, match="which must be"):
        mgr.restore(True)
    mgr.close()


def test_a_manager_opened_without_export_to_takes_the_recorded_one(tier, bucket, aws):
    # It took the recorded metric and mode but not export_to: a manager opened to restore
    # saw only the tier and restored an older step than `wharf ckpt restore --latest` did.
    root = tier / "rec"
    mgr = CheckpointManager(root, export_to=f"s3://{bucket}/rec")
    for step in (1, 2):
        mgr.save(step, {"x": torch.tensor([float(step)])})
    mgr.close()
    shutil.rmtree(root / step_dir(2))
    again = CheckpointManager(root)
    assert again.export_root is not None and again.export_root.uri == f"s3://{bucket}/rec/"
    assert [(m["step"], m["where"]) for m in again.list()] == [(1, "both"), (2, "bucket")]
    assert again.restore("latest")["x"].tolist() == [2.0]
    again.close()
    ls = [json.loads(line) for line in
          run_wharf("ckpt", "ls", "--json", root, check=True).stdout.splitlines()]
    assert [(c["step"], c["where"]) for c in ls] == [(1, "both"), (2, "both")]  # restored
    # export_to="" opens it without the destination.
    alone = CheckpointManager(root, export_to="")
    assert alone.export_root is None
    alone.close()


# ---- 4. kill -9 in the middle of a save ----

def _start_worker(root, env, *extra):
    proc = subprocess.Popen([sys.executable, str(HERE / "ckpt_worker.py"), str(root), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for expected in ("SAVED 1", "SAVING 2"):
        line = proc.stdout.readline().strip()
        if line != expected:
            proc.kill()
            raise AssertionError(f"worker said {line!r}, not {expected!r}: "
                                 f"{proc.communicate()[1]}")
    return proc


def _kill(proc, delay):
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert "SAVED 2" not in out, "the save finished before the kill"


def _poll(condition, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def _ls_steps(root, env):
    proc = run_wharf("ckpt", "ls", "--json", root, env=env, check=True)
    return [json.loads(line)["step"] for line in proc.stdout.decode().splitlines()]


def test_kill_during_a_save_to_a_bucket(bucket, s3_env, aws, s3_client, slow_link, rng):
    # 48 MiB at 200 Mbit/s: about 2 s of multipart uploads to be killed in.
    endpoint = slow_link(delay_ms=2, bandwidth_mbps=200)
    root = f"s3://{bucket}/run"
    proc = _start_worker(root, s3_env, "--endpoint", endpoint, "--mib", "48")
    prefix = f"run/{step_dir(2)}/"
    _poll(lambda: uploads(s3_client, bucket, prefix), "the step-2 multipart uploads")
    _kill(proc, rng.uniform(0, 0.5))
    left = uploads(s3_client, bucket, prefix)
    assert left, "nothing of the killed save left: it was not killed in the middle"
    assert not _exists(s3_client, bucket, prefix + "manifest.json")

    assert _ls_steps(root, s3_env) == [1]
    mgr = CheckpointManager(root)
    assert [m["step"] for m in mgr.list()] == [1]
    assert_same(mgr.restore("latest"), step1_state())
    # The next save removes what the killed one left: its files and its uploads.
    mgr.save(3, {"x": torch.arange(10)}).result()
    assert uploads(s3_client, bucket) == []
    assert sorted(bucket_steps(s3_client, bucket, "run")) == [1, 3]
    assert _ls_steps(root, s3_env) == [1, 3]
    mgr.close()


def test_kill_during_a_save_to_a_tier(tier, s3_env, rng):
    root = tier / "run"
    proc = _start_worker(root, s3_env, "--mib", "128")  # about 0.5 s to write
    temp = list((tier / ".wharf" / "tmp").glob(f"*-{proc.pid}-*"))
    temp = [p for p in temp if p.is_dir()]
    assert len(temp) == 1, temp  # the worker's own temporary directory
    step2 = root / step_dir(2)
    _poll(step2.exists, "step 2's directory")
    _kill(proc, rng.uniform(0, 0.1))
    assert not (step2 / "manifest.json").exists()

    # The tier's gc collects what the dead writer had in its temporary directory.
    gc = json.loads(run_wharf("tier", "gc", "--json", tier, env=s3_env, check=True).stdout)
    assert gc["owners"] >= 1
    assert not temp[0].exists()

    assert _ls_steps(root, s3_env) == [1]
    mgr = CheckpointManager(root)
    assert [m["step"] for m in mgr.list()] == [1]
    assert_same(mgr.restore("latest"), step1_state())
    mgr.save(3, {"x": torch.arange(10)}).result()
    assert not step2.exists()
    assert tier_steps(root) == [1, 3]
    assert _ls_steps(root, s3_env) == [1, 3]
    mgr.close()


def test_kill_during_a_save_again_of_a_step_keeps_its_checkpoint(tier, s3_env, rng):
    # The second save is of step 1 again: it is written under .replacing, so the kill leaves
    # step 1 as it was (it was cleared first, and lost).
    root = tier / "again"
    proc = _start_worker(root, s3_env, "--mib", "128", "--again")
    _poll((root / ".replacing" / step_dir(1)).exists, "the replacement's directory")
    _kill(proc, rng.uniform(0, 0.1))
    assert _ls_steps(root, s3_env) == [1]
    mgr = CheckpointManager(root)
    assert_same(mgr.restore("latest"), step1_state())
    assert not any((root / ".replacing").iterdir())  # the killed save's files are gone
    mgr.close()


# ---- 5. bit-exact resume ----

def _train(mode, data, ckpt, out, env, *extra):
    return subprocess.Popen([sys.executable, str(HERE / "train_resume.py"), "--mode", mode,
                             "--data", data, "--ckpt", ckpt, "--out", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish(proc):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return out


def test_resume_after_kill_is_bit_exact(tmp_path, bucket, s3_env, aws, s3_client):
    g = torch.Generator().manual_seed(7)
    for i in range(200):  # 16 float32 features and a label, as raw bytes
        x = torch.randn(16, generator=g)
        label = torch.tensor([float(i % 4)])
        s3_client.put_object(Bucket=bucket, Key=f"data/{i:04d}.bin",
                             Body=torch.cat([x, label]).numpy().tobytes())
    data = f"s3://{bucket}/data/"

    a = _train("full", data, f"s3://{bucket}/ckpt-a", tmp_path / "a.pt", s3_env)
    _finish(a)

    ckpt = f"s3://{bucket}/ckpt-b"
    b = _train("killed", data, ckpt, tmp_path / "b.pt", s3_env)
    line = b.stdout.readline().strip()
    assert line == "STEP 8 DONE", (line, b.stderr.read() if b.poll() is not None else "")
    b.send_signal(signal.SIGKILL)
    b.communicate(timeout=30)
    assert b.returncode == -signal.SIGKILL
    assert _ls_steps(ckpt, s3_env) == [6]

    c = _train("resume", data, ckpt, tmp_path / "c.pt", s3_env)
    assert "RESUMED 6" in _finish(c)
    # The same resume without putting the RNG states back: dropout and random.random() then
    # draw other numbers, so the weights differ (the comparison above can fail).
    d = _train("resume", data, ckpt, tmp_path / "d.pt", s3_env, "--no-rng")
    _finish(d)

    ra, rc, rd = (torch.load(tmp_path / f"{n}.pt") for n in "acd")
    assert sorted(ra["keys"]) == list(range(1, 13)) and sorted(rc["keys"]) == list(range(7, 13))
    for step in range(7, 13):
        assert rc["keys"][step] == ra["keys"][step], step
        assert len(set(ra["keys"][step])) == 8
    assert not set(ra["keys"][7]) & set(ra["keys"][6])
    for k in ra["model"]:
        assert torch.equal(ra["model"][k], rc["model"][k]), k
    assert_same(ra["optim"]["state"], rc["optim"]["state"])
    assert ra["random"] == rc["random"]
    assert rd["keys"] == rc["keys"]
    assert not all(torch.equal(ra["model"][k], rd["model"][k]) for k in ra["model"])


# ---- 6. errors ----

def test_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="metric"):
        CheckpointManager(tmp_path / "a", keep_best=1)
    with pytest.raises(ValueError, match="mode"):
        CheckpointManager(tmp_path / "a", metric="loss", mode="lowest")
    for keep_last in (-1, 0):  # 0 would delete each checkpoint as it commits
        with pytest.raises(ValueError, match="keep_last must be at least 1"):
            CheckpointManager(tmp_path / "a", keep_last=keep_last)
    mgr = CheckpointManager(tmp_path / "a")
    with pytest.raises(TypeError, match="dict"):
        mgr.save(1, [torch.zeros(3)])
    with pytest.raises(ValueError, match="_wharf"):
        mgr.save(1, {"_wharf": 1})
    with pytest.raises(FileNotFoundError):
        mgr.restore("latest")  # nothing saved yet
    with pytest.raises(ValueError):
        mgr.restore("newest")  # a bad argument is reported as such, checkpoints or not
    with pytest.raises(TypeError, match="checkpoint 1: metric 'acc' must be a number, not 'high'"):
        mgr.save(1, {"x": torch.ones(2)}, metrics={"acc": "high"})
    for bad in ({"acc": "0.5"}, {"acc": True}):  # float() would take them
        with pytest.raises(TypeError, match="metric 'acc' must be a number"):
            mgr.save(1, {"x": torch.ones(2)}, metrics=bad)
    with pytest.raises(TypeError, match="metrics must be a dict"):
        mgr.save(1, {"x": torch.ones(2)}, metrics=[("acc", 1.0)])
    mgr.save(1, {"x": torch.ones(2)}).result()
    with pytest.raises(ValueError, match="metric"):
        mgr.restore("best")  # the manager has no metric
    with pytest.raises(ValueError):
        mgr.restore("newest")
    with pytest.raises(TypeError):
        mgr.restore(1, state=[torch.ones(2)])
    assert mgr.restore(1)["x"].tolist() == [1.0, 1.0]
    mgr.close()


def test_a_step_is_an_integer_in_the_layouts_range(tmp_path):
    mgr = CheckpointManager(tmp_path / "steps")
    # int() would save 50.7 as step 50 and True as step 1.
    for bad in (50.7, 5.0, "5", None, True, torch.tensor(True)):
        with pytest.raises(TypeError, match="step must be an int"):
            mgr.save(bad, {"x": torch.ones(2)})
    for bad in (-1, 10 ** 12, 2 ** 63):
        with pytest.raises(ValueError, match=f"step {bad} is out of range"):
            mgr.save(bad, {"x": torch.ones(2)})
    import numpy
    mgr.save(numpy.int64(3), {"x": torch.ones(2)}).result(timeout=60)
    mgr.save(torch.tensor(10 ** 12 - 1), {"x": torch.ones(2)}).result(timeout=60)
    assert [m["step"] for m in mgr.list()] == [3, 10 ** 12 - 1]
    assert (tmp_path / "steps" / "step-999999999999" / "manifest.json").is_file()
    mgr.close()


class _FirstStepUriFails:
    """A root whose first step_uri() fails: a save that fails before its write starts."""

    def __init__(self, root):
        self._root, self._failed = root, False

    def step_uri(self, step):
        if not self._failed:
            self._failed = True
            raise OSError("injected before the write")
        return self._root.step_uri(step)

    def __getattr__(self, name):
        return getattr(self._root, name)


def test_an_async_save_that_fails_before_writing_frees_the_staging_copy(tmp_path):
    mgr = CheckpointManager(tmp_path / "free")
    mgr.root = _FirstStepUriFails(mgr.root)
    with pytest.raises(OSError, match="injected"):
        mgr.save(1, {"x": torch.ones(2)}).result(timeout=60)
    # The next save stages into the copy the failed one held: it must not wait forever.
    handles = []
    saver = threading.Thread(target=lambda: handles.append(mgr.save(2, {"x": torch.ones(2)})),
                             daemon=True)
    saver.start()
    saver.join(timeout=60)
    assert handles, "the save after a failed one never returned (the staged copy is held)"
    assert handles[0].result(timeout=60)["step"] == 2
    assert [m["step"] for m in mgr.list()] == [2]
    mgr.close()  # result() raised the failure: close() does not raise it again


def test_each_failure_is_raised_once_by_the_handle_or_by_wait(tmp_path):
    # A synchronous save raises itself; an async one through its handle's result(); one whose
    # handle nobody asked raises at wait(). None is raised twice (close() after handling one
    # of them raised it again, as did a with-block's end).
    sync = CheckpointManager(tmp_path / "sync", async_save=False)
    with pytest.raises((AttributeError, pickle.PicklingError), match="pickle"):
        sync.save(1, {"f": lambda: 0})
    sync.wait()
    sync.close()
    mgr = CheckpointManager(tmp_path / "async")
    handled = mgr.save(1, {"f": lambda: 0})
    assert isinstance(handled.exception(timeout=60), (AttributeError, pickle.PicklingError))
    mgr.save(2, {"g": lambda: 0})  # nobody looks at this one
    with pytest.raises((AttributeError, pickle.PicklingError), match="pickle"):
        mgr.wait()
    mgr.wait()  # reported once
    mgr.save(3, {"x": torch.ones(2)}).result(timeout=60)
    mgr.close()
    assert [m["step"] for m in CheckpointManager(tmp_path / "async").list()] == [3]


def test_a_with_blocks_own_exception_is_not_replaced_by_a_failed_save(tmp_path):
    with pytest.warns(RuntimeWarning, match="closed after an exception.*pickle"):
        with pytest.raises(KeyError, match="the block's"):
            with CheckpointManager(tmp_path / "w") as mgr:
                mgr.save(1, {"f": lambda: 0})
                raise KeyError("the block's")
    # Without one, the save's failure is the with-block's.
    with pytest.raises((AttributeError, pickle.PicklingError), match="pickle"):
        with CheckpointManager(tmp_path / "w2") as mgr:
            mgr.save(1, {"f": lambda: 0})


def test_restore_leaves_the_failures_of_other_saves_and_exports_to_wait(tier, bucket, aws):
    # The export destination's bucket does not exist: every export fails.
    mgr = CheckpointManager(tier / "fails", export_to=f"s3://{bucket}-missing/fails")
    assert mgr.save(1, {"w": torch.ones(2)}).result(timeout=60)["step"] == 1
    failed = mgr.save(2, {"w": torch.zeros(2), "f": lambda: 0})  # not picklable
    with pytest.raises((AttributeError, pickle.PicklingError), match="pickle"):
        failed.result(timeout=60)
    # The tier's checkpoint restores at once, the unreadable bucket with a warning.
    with pytest.warns(RuntimeWarning, match="left out"):
        assert mgr.restore("latest")["w"].tolist() == [1.0, 1.0]
    assert mgr.last_restored["step"] == 1
    # wait() still reports them: the first, step 1's export.
    with pytest.raises(wharf.NotFoundError, match="copying checkpoint"):
        mgr.wait()
    mgr.close()


def test_wrong_credentials_fail_the_save_and_keep_the_previous_checkpoint(bucket, aws,
                                                                          monkeypatch):
    root = f"s3://{bucket}/run"
    good = CheckpointManager(root)
    good.save(1, {"x": torch.ones(4)}).result()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.warns(UserWarning, match="could not record the checkpoint settings"):
        bad = CheckpointManager(root)
    handle = bad.save(2, {"x": torch.zeros(4)})
    with pytest.raises(wharf.PermissionDeniedError, match="SignatureDoesNotMatch"):
        handle.result()
    bad.close()  # result() handed the failure over: not raised again
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", aws["AWS_SECRET_ACCESS_KEY"])
    again = CheckpointManager(root)
    assert [m["step"] for m in again.list()] == [1]
    assert again.restore("latest")["x"].tolist() == [1.0] * 4
    good.close()
    again.close()


def test_async_saves_of_a_state_that_changes_shape_dtype_or_structure(tmp_path):
    # The staging copy is reused only for a state of the same layout: otherwise copying into
    # it would broadcast a new shape into the old one, or convert a new dtype to the old one.
    mgr = CheckpointManager(tmp_path / "ckpt")
    model = small_model(1)
    opt = torch.optim.Adam(model.parameters())
    states = [
        {"x": torch.zeros(4), "n": 3},
        {"x": torch.tensor([7.0]), "n": torch.ones(2)},                   # shape; value -> tensor
        {"x": torch.tensor([[1.0, 2.0, 3.0]]), "n": torch.ones(2)},       # rank
        {"x": torch.tensor([1, 2, 3]), "n": torch.ones(2)},               # dtype
        {"x": torch.tensor([1.5], dtype=torch.bfloat16), "l": [torch.zeros(1), torch.ones(1)]},
        {"x": torch.tensor([1.5], dtype=torch.bfloat16), "l": [torch.zeros(1)]},  # length
        {"model": model, "optim": opt},                                    # empty Adam state
    ]
    for step, state in enumerate(states):
        mgr.save(step, state)
    model(torch.randn(3, 32)).sum().backward()
    opt.step()
    mgr.save(len(states), {"model": model, "optim": opt})  # the optimizer state now exists
    mgr.wait()
    for step, state in enumerate(states[:-1]):
        got = mgr.restore(step)
        for key, want in state.items():
            if isinstance(want, torch.Tensor):
                assert got[key].dtype == want.dtype and torch.equal(got[key], want), (step, key)
            elif isinstance(want, list):
                assert len(got[key]) == len(want) and all(map(torch.equal, got[key], want))
            else:
                assert got[key] == want
    assert_same(mgr.restore(len(states))["optim"]["state"], opt.state_dict()["state"])
    mgr.close()


def test_a_step_saved_again_while_its_export_runs(tier, bucket, aws):
    mgr = CheckpointManager(tier / "again", export_to=f"s3://{bucket}/again")
    mgr.save(7, {"x": torch.ones(2)})
    mgr.save(7, {"x": torch.ones(2) * 2})
    mgr.wait()  # no error: the second save waited for the first one's export
    assert [(m["step"], m["where"]) for m in mgr.list()] == [(7, "both")]
    assert mgr.restore(7)["x"].tolist() == [2.0, 2.0]
    shutil.rmtree(tier / "again")
    mgr.close()
    mgr = CheckpointManager(tier / "again", export_to=f"s3://{bucket}/again")
    assert mgr.restore(7)["x"].tolist() == [2.0, 2.0]  # the bucket's copy is the second save
    mgr.close()


# ---- 7. restore in place on more ranks than saved ----

def _run_ranks(mode, root, world_size, tmp_path, env):
    """Runs manager_worker.py on `world_size` gloo ranks; returns each rank's results."""
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1] / "python"), str(HERE),
                                         env.get("PYTHONPATH", "")])
    tag = f"{mode}{world_size}"
    rdzv = tmp_path / f"rdzv-{tag}"
    ran = run_processes([[sys.executable, str(HERE / "manager_worker.py"), mode, str(root),
                          str(rdzv), str(r), str(world_size), str(tmp_path / f"{tag}-{r}.json")]
                         for r in range(world_size)], env)
    failed = [f"{mode} rank {r} exited {code}:\n{log[-3000:]}"
              for r, (code, log) in enumerate(ran) if code != 0]
    assert not failed, "\n".join(failed)
    return [json.loads((tmp_path / f"{tag}-{r}.json").read_text()) for r in range(world_size)]


# (2, 3) passes as well (checked by hand) but takes ~25 s of process starts on 2 cores.
@pytest.mark.parametrize("saved_on,restored_on", [(1, 2)])
def test_restore_in_place_on_more_ranks_keeps_the_rng_of_ranks_without_a_saved_one(
        saved_on, restored_on, tmp_path, s3_env):
    root = tmp_path / "ckpt"
    saved = _run_ranks("save", root, saved_on, tmp_path, s3_env)
    restored = _run_ranks("restore", root, restored_on, tmp_path, s3_env)
    for r, got in enumerate(restored):
        assert got["model_equal"], r
        if r < saved_on:  # its saved RNG states are back: it draws what the saver drew next
            assert got["draws"] == saved[r]["draws"], r
            assert got["draws"] != got["own_draws"], r
        else:  # no saved state: it keeps its own
            assert got["draws"] == got["own_draws"], r


def test_a_save_one_rank_cannot_prepare_fails_on_every_rank_and_the_next_ones_commit(tmp_path,
                                                                                     s3_env):
    # Async: each rank copies its state before the save's collectives; a copy failing on one
    # rank alone once left the others a save behind it for good.
    got = _run_ranks("onefails", tmp_path / "ckpt", 2, tmp_path, s3_env)
    assert got[1]["saves"]["1"].startswith("NotImplementedError"), got[1]
    assert "rank 1 failed to prepare its state" in got[0]["saves"]["1"], got[0]
    for r in (0, 1):
        assert got[r]["saves"]["2"] == got[r]["saves"]["3"] == "ok", got[r]
    assert got[0]["steps"] == [2, 3], got[0]
    # Nothing of the failed save is left behind.
    steps = sorted(n for n in os.listdir(tmp_path / "ckpt") if n.startswith("step-"))
    assert steps == [step_dir(2), step_dir(3)], steps


# ---- 8. a tier copy partly evicted ----

def test_a_partly_evicted_tier_copy_is_imported_again_from_the_bucket(tier, bucket, aws,
                                                                      s3_env):
    root = tier / "ev"
    mgr = CheckpointManager(root, export_to=f"s3://{bucket}/ev")
    g = torch.Generator().manual_seed(3)
    state = {f"t{i}": torch.randn(10 << 18, generator=g) for i in range(4)}  # 4 x 10 MiB
    mgr.save(1, state)
    mgr.wait()
    assert [(m["step"], m["where"]) for m in mgr.list()] == [(1, "both")]
    step = root / step_dir(1)
    before = sorted(os.listdir(step))
    run_wharf("tier", "evict", root, "--to", "20M", "-q", env=s3_env, check=True)
    after = sorted(os.listdir(step))
    assert "manifest.json" in after and len(after) < len(before), (before, after)
    mgr.close()

    # Not complete on the tier any more: listed where it is whole (the CLI too).
    proc = run_wharf("ckpt", "ls", "--json", root, env=s3_env, check=True)
    listed = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [(c["step"], c["where"]) for c in listed] == [(1, "bucket")], listed
    mgr = CheckpointManager(root, export_to=f"s3://{bucket}/ev")
    assert [(m["step"], m["where"]) for m in mgr.list()] == [(1, "bucket")]
    assert_same(mgr.restore("latest"), state)
    assert sorted(os.listdir(step)) == before  # imported again
    assert [(m["step"], m["where"]) for m in mgr.list()] == [(1, "both")]
    # In place too, after another eviction.
    run_wharf("tier", "evict", root, "--to", "20M", "-q", env=s3_env, check=True)
    fresh = {k: torch.zeros_like(v) for k, v in state.items()}
    assert_same(mgr.restore(1, state=fresh), state)
    mgr.close()


# ---- 9. kill -9 in the middle of an export ----

def _kill_during_export(proc, lines, s3_client, bucket, prefix):
    """Waits for the worker to print `lines` (its saves done), then for the export's multipart
    uploads below `prefix`, and kills it with -9 there."""
    for expected in lines:
        line = proc.stdout.readline().strip()
        if line != expected:
            proc.kill()
            raise AssertionError(f"worker said {line!r}: {proc.communicate()[1]}")
    _poll(lambda: uploads(s3_client, bucket, prefix), f"the export's uploads below {prefix}")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_an_export_killed_midway_is_cleaned_up_by_the_next_export(tier, bucket, s3_env, aws,
                                                                  s3_client, slow_link):
    # 48 MiB at 200 Mbit/s: about 2 s of multipart uploads to the bucket to be killed in.
    endpoint = slow_link(delay_ms=2, bandwidth_mbps=200)
    root, dest = tier / "kexp", f"s3://{bucket}/kexp"
    proc = _start_worker(root, s3_env, "--endpoint", endpoint, "--mib", "48", "--export-to", dest)
    prefix = f"kexp/{step_dir(2)}/"
    _kill_during_export(proc, ["SAVED 2"], s3_client, bucket, prefix)
    assert uploads(s3_client, bucket, prefix), "the export was not killed in the middle"
    assert not _exists(s3_client, bucket, prefix + "manifest.json")
    assert sorted(bucket_steps(s3_client, bucket, "kexp")) == [1, 2]  # what it left
    # Step 2 removed from the tier too: the next manager has no export of it to resume
    # (test_an_export_killed_midway_is_resumed_by_the_next_manager), so what the killed one
    # left is abandoned.
    run_wharf("ckpt", "rm", root, "--step", 2, env=s3_env, check=True)

    mgr = CheckpointManager(root, export_to=dest)
    assert [(m["step"], m["where"]) for m in mgr.list()] == [(1, "both")]
    mgr.save(3, {"x": torch.arange(10)})
    mgr.wait()
    # The export of step 3 removed what the killed export of step 2 left in the bucket.
    assert uploads(s3_client, bucket) == []
    assert sorted(bucket_steps(s3_client, bucket, "kexp")) == [1, 3]
    assert [(m["step"], m["where"]) for m in mgr.list()] == [(1, "both"), (3, "both")]
    mgr.close()


_EXPORT_WORKER = """
import sys, time, torch
from wharf.torch import CheckpointManager
root, dest, endpoint, keep_last, keep_best = sys.argv[1:6]
mgr = CheckpointManager(root, export_to=dest, keep_last=int(keep_last),
                        keep_best=int(keep_best) or None, metric="loss", endpoint=endpoint)
mgr.save(1, {"marker": torch.tensor([1])}, metrics={"loss": 5.0})
mgr.wait()
print("SAVED 1", flush=True)
half = (48 << 20) // 2 // 4  # 48 MiB in two files: multipart uploads to be killed in
big = {"marker": torch.tensor([5]), "a": torch.full((half,), 2.0), "b": torch.full((half,), 3.0)}
mgr.save(5, big, metrics={"loss": 0.1}).result()
print("SAVED 5", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("keep_last,keep_best", [(1, 1), (2, 0)])
def test_an_export_killed_midway_is_resumed_by_the_next_manager(keep_last, keep_best, tier,
                                                                bucket, s3_env, aws, s3_client,
                                                                slow_link):
    endpoint = slow_link(delay_ms=2, bandwidth_mbps=200)  # 48 MiB: about 2 s of uploads
    root, dest = tier / "k3", f"s3://{bucket}/k3"
    env = dict(s3_env, PYTHONPATH=os.pathsep.join([str(HERE.parents[1] / "python"),
                                                   s3_env.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", _EXPORT_WORKER, str(root), dest, endpoint,
                             str(keep_last), str(keep_best)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    prefix = f"k3/{step_dir(5)}/"
    _kill_during_export(proc, ["SAVED 1", "SAVED 5"], s3_client, bucket, prefix)
    assert not _exists(s3_client, bucket, prefix + "manifest.json")
    assert 5 in tier_steps(root) and _ls_steps(dest, s3_env) == [1]

    # The next manager exports step 5 again (its manifest says the policy selected it), and
    # keeps it on the tier until then: the saves below run while that export does.
    mgr = CheckpointManager(root, export_to=dest, keep_last=keep_last,
                            keep_best=keep_best or None, metric="loss", endpoint=endpoint)
    for step in (6, 7):
        mgr.save(step, {"marker": torch.tensor([step])}, metrics={"loss": 3.0}).result()
    assert 5 in tier_steps(root) or 5 in _ls_steps(dest, s3_env)
    mgr.wait()
    kept = [5, 7] if keep_best else [6, 7]  # the best (loss 0.1) and the latest, or the latest 2
    assert tier_steps(root) == kept
    assert _ls_steps(dest, s3_env) == kept
    assert uploads(s3_client, bucket) == []
    assert [(m["step"], m["where"]) for m in mgr.list()] == [(s, "both") for s in kept]
    if keep_best:
        assert mgr.restore("best")["marker"].tolist() == [5]
    mgr.close()


def test_a_restart_while_the_bucket_is_out_of_reach_keeps_the_unexported_checkpoints(
        tmp_path, bucket, aws, s3_client):
    # The export bucket is down across a restart (here: not created yet). A manager that could
    # not list it resumed no exports, so retention (keep_last=1) deleted step 3, which was
    # selected for export and never exported: the durable copy was lost for good.
    root, dest_bucket = tmp_path / "r", bucket + "-late"
    dest = f"s3://{dest_bucket}/run"

    def run(steps):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mgr = CheckpointManager(root, export_to=dest, keep_last=1, export_every=3)
            for step in steps:
                mgr.save(step, {"t": torch.full((4,), float(step))}).result()
            with pytest.raises(wharf.WharfError):
                mgr.close()  # the exports failed
        return [str(w.message) for w in caught]

    run([1, 2, 3])
    assert tier_steps(root) == [3]  # the latest, and awaiting its export
    said = run([4])
    assert any("kept here until their exports complete" in m for m in said), said
    assert tier_steps(root) == [3, 4]
    s3_client.create_bucket(Bucket=dest_bucket)
    try:
        mgr = CheckpointManager(root, export_to=dest, keep_last=1, export_every=3)
        mgr.wait()
        assert _ls_steps(dest, aws) == [3]
        assert tier_steps(root) == [4]  # exported now, and no longer the latest
        assert mgr.restore(3)["t"].tolist() == [3.0] * 4
        mgr.close()
    finally:
        for o in s3_client.list_objects_v2(Bucket=dest_bucket).get("Contents", []):
            s3_client.delete_object(Bucket=dest_bucket, Key=o["Key"])
        s3_client.delete_bucket(Bucket=dest_bucket)


def test_a_damaged_copy_in_a_plain_folder_is_restored_from_the_bucket(tmp_path, bucket, aws):
    # A local folder's copy cut short (the bucket's intact): restore raised DataLossError
    # instead of reading the exported copy, as a tier's partly evicted copy is read.
    root, dest = tmp_path / "plain", f"s3://{bucket}/plain"
    mgr = CheckpointManager(root, export_to=dest, keep_last=3)
    for step in (1, 2):
        mgr.save(step, {"t": torch.full((1000,), float(step))}).result()
    mgr.wait()
    data = sorted(p for p in (root / step_dir(2)).iterdir() if p.name.endswith(".distcp"))
    with open(data[0], "r+b") as f:
        f.truncate(10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert mgr.restore(2)["t"].tolist() == [2.0] * 1000
    said = [str(w.message) for w in caught]
    assert any("step 2 is left out" in m and "is used instead" in m for m in said), said
    assert data[0].stat().st_size > 10  # the local copy was made whole again
    assert mgr.restore(2)["t"].tolist() == [2.0] * 1000
    mgr.close()


# ---- 10. metrics that are not finite ----

def test_nan_and_infinite_metrics_are_recorded_and_never_ranked(tmp_path, s3_env):
    root = tmp_path / "nan"
    mgr = CheckpointManager(root, keep_last=1, keep_best=1, metric="loss", mode="max",
                            async_save=False)
    mgr.save(1, {"x": torch.ones(1)}, metrics={"loss": 2.0})
    with pytest.warns(RuntimeWarning, match=r"loss=inf.*not finite"):
        mgr.save(2, {"x": torch.ones(1) * 2}, metrics={"loss": float("inf"), "acc": 0.5})
    with pytest.warns(RuntimeWarning, match=r"loss=nan.*never ranked"):
        h = mgr.save(3, {"x": torch.ones(1) * 3},
                     metrics={"loss": float("nan"), "gnorm": float("-inf")})
    assert h.result()["metrics"]["gnorm"] == float("-inf")
    listed = {m["step"]: m["metrics"] for m in mgr.list()}
    # Step 2 went (neither the latest nor, with +inf not ranked, the best); step 1 stays best.
    assert sorted(listed) == [1, 3]
    assert listed[1] == {"loss": 2.0}
    assert sorted(listed[3]) == ["gnorm", "loss"] and math.isnan(listed[3]["loss"])
    assert listed[3]["gnorm"] == float("-inf")
    assert mgr.restore("best")["x"].tolist() == [1.0]
    assert _ls_steps(root, s3_env) == [1, 3]
    # The CLI shows them too: as text in the table, apart from the numbers in --json.
    lines = run_wharf("ckpt", "ls", "--json", root, env=s3_env, check=True).stdout.splitlines()
    by_step = {j["step"]: j for j in map(json.loads, lines)}
    assert by_step[3]["metrics"] == {}
    assert by_step[3]["nonfinite_metrics"] == {"gnorm": "-inf", "loss": "nan"}
    assert by_step[1]["metrics"] == {"loss": 2.0} and "nonfinite_metrics" not in by_step[1]
    table = run_wharf("ckpt", "ls", root, env=s3_env, check=True).stdout.decode()
    assert "gnorm=-inf loss=nan" in table and "loss=2" in table
    mgr.close()


def test_best_when_no_value_of_the_metric_is_finite(tmp_path):
    mgr = CheckpointManager(tmp_path / "nf", metric="loss", async_save=False)
    with pytest.warns(RuntimeWarning, match="not finite"):
        mgr.save(1, {"x": torch.ones(1)}, metrics={"loss": float("nan")})
    with pytest.warns(RuntimeWarning, match="not finite"):
        mgr.save(2, {"x": torch.ones(1)}, metrics={"loss": float("inf")})
    with pytest.raises(wharf.NotFoundError,
                       match="record the metric 'loss', but no value of it is finite"):
        mgr.restore("best")
    mgr.close()
    mgr = CheckpointManager(tmp_path / "nf", metric="acc")
    with pytest.raises(wharf.NotFoundError, match="no checkpoint records the metric 'acc'"):
        mgr.restore("best")
    mgr.close()


# ---- 11. training resumed from an older checkpoint ----

def test_a_save_below_the_latest_step_warns_once_and_deletes_nothing(tmp_path, s3_env):
    root = tmp_path / "lower"
    args = dict(keep_last=2, keep_best=1, metric="loss")
    mgr = CheckpointManager(root, **args)
    for step, loss in ((10, 0.1), (20, 1.0), (30, 2.0), (40, 3.0)):
        mgr.save(step, {"marker": torch.tensor([step])}, metrics={"loss": loss})
    mgr.wait()
    assert mgr.restore("best")["marker"].tolist() == [10]
    with pytest.warns(RuntimeWarning,
                      match=r"checkpoint 15 is below the latest one \(40\).*wharf ckpt rm"):
        mgr.save(15, {"marker": torch.tensor([15])}, metrics={"loss": 0.2}).result()
    # Retention counts steps: 15 is neither among the latest 2 nor the best. The higher steps
    # are the user's to remove.
    assert [m["step"] for m in mgr.list()] == [10, 30, 40]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mgr.save(16, {"marker": torch.tensor([16])}, metrics={"loss": 0.3}).result()
    assert not [w for w in caught if "below the latest" in str(w.message)]  # once a manager
    mgr.close()
    # A manager started later finds the latest step where it looks.
    mgr = CheckpointManager(root, **args)
    with pytest.warns(RuntimeWarning, match=r"checkpoint 17 is below the latest one \(40\)"):
        mgr.save(17, {"marker": torch.tensor([17])}, metrics={"loss": 0.3}).result()
    # Once the abandoned run's checkpoints are removed, the resumed run's are kept.
    for step in (30, 40):
        run_wharf("ckpt", "rm", root, "--step", step, env=s3_env, check=True)
    mgr.save(18, {"marker": torch.tensor([18])}, metrics={"loss": 0.3}).result()
    assert [m["step"] for m in mgr.list()] == [10, 18]
    assert mgr.restore("latest")["marker"].tolist() == [18]
    mgr.close()


def test_a_manager_with_an_export_finds_the_latest_step_in_either_root(tmp_path):
    # The latest step (40) is only at the export destination: the tier's copy was removed.
    root, dest = tmp_path / "tier-run", tmp_path / "bucket-run"
    mgr = CheckpointManager(root, export_to=dest.as_uri(), export_every=1, keep_last=5)
    for step in (10, 20, 40):
        mgr.save(step, {"marker": torch.tensor([step])}).result()
    mgr.wait()
    mgr.close()
    run_wharf("ckpt", "rm", root, "--step", 40, check=True)
    mgr = CheckpointManager(root, export_to=dest.as_uri(), export_every=1, keep_last=5)
    assert [(m["step"], m["where"]) for m in mgr.list()] == [(10, "both"), (20, "both"),
                                                            (40, "bucket")]
    with pytest.warns(RuntimeWarning, match=r"checkpoint 30 is below the latest one \(40\)"):
        mgr.save(30, {"marker": torch.tensor([30])}).result()
    mgr.close()


def test_a_manager_opened_without_settings_keeps_and_uses_the_recorded_ones(tmp_path, s3_env):
    root, remote = tmp_path / "rec", tmp_path / "remote"
    mgr = CheckpointManager(root, export_to=str(remote), metric="acc", mode="max")
    for step, acc in ((10, 0.5), (20, 0.9), (30, 0.3)):
        mgr.save(step, {"marker": torch.tensor([step])}, metrics={"acc": acc})
    mgr.close()
    # Opened only to restore: ranks by the recorded metric and mode, erases nothing.
    reader = CheckpointManager(root)
    assert (reader.metric, reader.mode) == ("acc", "max")
    assert reader.restore("best")["marker"].tolist() == [20]
    reader.close()
    recorded = json.loads((root / "checkpoints.json").read_text())
    assert recorded == {"export_to": f"file://{remote}/", "metric": "acc", "mode": "max"}
    listed = run_wharf("ckpt", "ls", "--json", root, env=s3_env, check=True).stdout.decode()
    assert {json.loads(line)["where"] for line in listed.splitlines()} == {"both"}
    # The export destination records the metric too: --best there picks the same step.
    out = run_wharf("ckpt", "restore", remote, "--best", tmp_path / "back", "--json",
                    env=s3_env, check=True)
    assert json.loads(out.stdout)["step"] == 20


def test_a_failed_save_is_not_the_latest_step_and_file_objects_go_to_torch(tmp_path):
    mgr = CheckpointManager(tmp_path / "f")
    mgr.save(10, {"marker": torch.tensor([10])}).result()
    with pytest.raises(AttributeError, match="pickle"):
        mgr.save(20, {"f": lambda x: x}).result()  # not picklable: never committed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mgr.save(15, {"marker": torch.tensor([15])}).result()  # above every committed step
    assert not [w for w in caught if "below the latest" in str(w.message)]
    with pytest.warns(RuntimeWarning, match=r"checkpoint 5 is below the latest one \(15\)"):
        mgr.save(5, {"marker": torch.tensor([5])}).result()
    mgr.close()  # the failed save's error went to result(): not raised again
    # wharf.torch.save / load given a file object behave as torch.save / torch.load.
    import io
    buf = io.BytesIO()
    wharf.torch.save({"a": torch.arange(3)}, buf)
    assert buf.getvalue()
    buf.seek(0)
    assert wharf.torch.load(buf)["a"].tolist() == [0, 1, 2]
    assert not list(pathlib.Path.cwd().glob("<_io.BytesIO*"))
    with pytest.raises(TypeError, match="mmap"):
        wharf.torch.load(str(tmp_path / "x.pt"), mmap=True)
    with pytest.raises(TypeError, match="expected a URI or a path, not BytesIO"):
        wharf.open(io.BytesIO(), "wb")  # str() of it named a local file
    wharf.torch.save({"b": 1}, tmp_path / "p.pt")  # a pathlib.Path is a path
    assert wharf.torch.load(tmp_path / "p.pt") == {"b": 1}


WRITER = """
import sys, time, torch
from wharf.torch import CheckpointManager
mgr = CheckpointManager(sys.argv[1], async_save=False)
mgr.save(1, {"w": torch.ones(4)})
print("saved", flush=True)
time.sleep(600)
"""


def test_one_run_saves_into_a_root_at_a_time(node_dirs):
    """A second manager's first save into a root another run is saving into raises, naming
    the holder (its checkpoints would be removed as abandoned by the first's retention), on
    one node and from another node of a shared file system; the lock goes when the holder
    closes or is killed with -9. Listing and restoring need no lock."""
    here, there = node_dirs
    holder = subprocess.Popen([sys.executable, "-c", WRITER, str(here / "run")],
                              stdout=subprocess.PIPE, env=dict(os.environ))
    try:
        assert holder.stdout.readline() == b"saved\n"
        other = CheckpointManager(there / "run", async_save=False)
        assert [m["step"] for m in other.list()] == [1]  # reading is fine
        with pytest.raises(RuntimeError, match=rf"another CheckpointManager is saving into it "
                                               rf"\(pid {holder.pid} on "):
            other.save(2, {"w": torch.zeros(4)})
        assert [m["step"] for m in other.list()] == [1]  # nothing written, nothing removed
        holder.kill()
        holder.wait()
        other.save(2, {"w": torch.zeros(4)})  # the kernel dropped the dead holder's lock
        assert [m["step"] for m in other.list()] == [1, 2]
        # In one process: the lock is the saving manager's until close().
        third = CheckpointManager(here / "run", async_save=False)
        with pytest.raises(RuntimeError, match=f"pid {os.getpid()} on "):
            third.save(3, {"w": torch.zeros(4)})
        other.close()
        third.save(3, {"w": torch.zeros(4)})
        third.close()
        assert [m["step"] for m in CheckpointManager(here / "run").list()] == [1, 2, 3]
    finally:
        holder.kill()
        holder.wait()


# ---- 12. managers that only read, and a closed manager ----

class _Positions:
    """A stateful object (not a module) whose state has int keys, as a sampler's may."""

    def __init__(self):
        self.pos = {}

    def state_dict(self):
        return {"pos": dict(self.pos)}

    def load_state_dict(self, sd):
        self.pos = dict(sd["pos"])


def test_a_reading_manager_leaves_a_saving_runs_work_alone(tmp_path):
    root = tmp_path / "run"
    writer = CheckpointManager(root, async_save=False)
    writer.save(1, {"w": torch.ones(4)})
    # The writer's replacement of step 1 in progress (what a save of a committed step writes
    # first): a manager opened meanwhile to list or restore must not clean it up.
    staged = root / ".replacing" / step_dir(1)
    staged.mkdir(parents=True)
    (staged / "__0_0.distcp").write_bytes(b"in progress")
    reader = CheckpointManager(root)
    assert [m["step"] for m in reader.list()] == [1]
    assert (staged / "__0_0.distcp").read_bytes() == b"in progress"
    assert torch.equal(reader.restore(1)["w"], torch.ones(4))
    writer.close()
    # Once no run saves there, the next manager removes what is left (no manifest: a save
    # killed before its commit).
    CheckpointManager(root).close()
    assert not staged.exists()


def test_a_closed_manager_refuses_saves_and_frees_its_lock(tmp_path):
    root = tmp_path / "run"
    mgr = CheckpointManager(root)  # async
    mgr.save(1, {"w": torch.ones(4)}).result()
    mgr.close()
    for _ in range(2):
        with pytest.raises(RuntimeError, match="is closed"):
            mgr.save(2, {"w": torch.zeros(4)})
    other = CheckpointManager(root, async_save=False)
    other.save(2, {"w": torch.zeros(4)})  # the closed one holds no lock
    other.close()
    assert [m["step"] for m in other.list()] == [1, 2]


def test_restore_in_place_gives_stateful_objects_their_int_keys(tmp_path):
    mgr = CheckpointManager(tmp_path / "run", async_save=False)
    saved = _Positions()
    saved.pos = {0: 11, 1: 22}
    mgr.save(1, {"positions": saved, "w": torch.ones(2)})
    fresh = _Positions()
    mgr.restore(1, state={"positions": fresh, "w": torch.zeros(2)})
    assert fresh.pos == {0: 11, 1: 22}
    assert mgr.restore(1)["positions"] == {"pos": {0: 11, 1: 22}}
    mgr.close()


def test_a_lower_step_saved_while_a_higher_one_saves_is_warned_about(tmp_path):
    mgr = CheckpointManager(tmp_path / "run", keep_last=1)  # async: step 10 still saving
    high = mgr.save(10, {"w": torch.ones(1 << 20)})
    with pytest.warns(RuntimeWarning, match=r"checkpoint 5 is below the latest one \(10\)"):
        low = mgr.save(5, {"w": torch.zeros(4)})
    high.result()
    low.result()
    mgr.close()
