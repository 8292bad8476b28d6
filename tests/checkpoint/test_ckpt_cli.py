"""`wharf ckpt ls|export|restore|rm` (build/wharf) against the real Ceph RGW, on checkpoints
written by wharf.torch.CheckpointManager: a tier root that exports to a bucket (where = tier,
bucket or both), the bucket itself, a plain directory with an incomplete step; exports by
--latest / --step / --best, a restore into a fresh tier that a manager then loads, removal,
and the exit codes of usage errors and missing steps."""
import datetime
import json
import os
import pathlib

import pytest
import torch

import wharf
from conftest import make_tier, run_wharf
from wharf.torch import CheckpointManager

LS_KEYS = {"step", "time", "time_unix", "size", "bytes", "files", "world_size", "metrics", "where", "uri"}
LOSSES = {1: 0.9, 2: 0.4, 3: 0.7, 4: 0.6}


def step_dir(step):
    return f"step-{step:012d}"


def state_of(step):
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(128, 64, generator=g), "b": torch.randn(64, generator=g),
            "meta": {"step": step}}


def same(a, b):
    assert set(a) == set(b)
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


@pytest.fixture
def run(tmp_path, bucket, aws):
    """A tier root exporting every 2nd save to s3://bucket/run, keep_last=2, metric loss (min):
    steps 1..4 saved; the tier keeps 3 and 4, the bucket the exports 2 and 4. Returns
    (tier root, bucket root, {step: manifest as the manager lists it})."""
    tier = make_tier(tmp_path / "tier", aws)
    root = tier / "run"
    remote = f"s3://{bucket}/run"
    mgr = CheckpointManager(root, export_to=remote, keep_last=2, metric="loss", mode="min",
                            export_every=2)
    for step, loss in LOSSES.items():
        mgr.save(step, state_of(step), metrics={"loss": loss})
    mgr.close()
    listed = {m["step"]: m for m in mgr.list()}
    assert {s: m["where"] for s, m in listed.items()} == {2: "bucket", 3: "tier", 4: "both"}
    return root, remote, listed


def ls_json(root, env):
    proc = run_wharf("ckpt", "ls", "--json", root, env=env, check=True)
    return [json.loads(line) for line in proc.stdout.decode().splitlines()]


def ckpt(*args, env):
    return run_wharf("ckpt", *args, env=env)


def test_ls_json_and_text_on_a_tier_that_exports_and_on_the_bucket(run, aws):
    root, remote, listed = run
    lines = ls_json(root, aws)
    assert [(j["step"], j["where"]) for j in lines] == [(2, "bucket"), (3, "tier"), (4, "both")]
    for j in lines:
        assert set(j) == LS_KEYS
        m = listed[j["step"]]
        assert j["metrics"] == {"loss": LOSSES[j["step"]]}
        assert j["size"] == j["bytes"] == m["bytes"] > 128 * 64 * 4
        assert j["files"] == len(m["files"])
        assert j["world_size"] == 1
        assert abs(j["time_unix"] - m["time"]) < 1e-3
        utc = datetime.datetime.fromtimestamp(int(j["time_unix"]), datetime.timezone.utc)
        assert j["time"] == utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert lines[0]["uri"] == f"{remote}/{step_dir(2)}/"  # only in the bucket
    assert lines[1]["uri"] == f"file://{root}/{step_dir(3)}/"
    assert lines[2]["uri"] == f"file://{root}/{step_dir(4)}/"  # both: the tier's copy

    text = ckpt("ls", root, env=aws)
    assert text.returncode == 0, text.stderr
    rows = text.stdout.decode().splitlines()
    assert rows[0].split() == ["STEP", "TIME", "MB", "WHERE", "METRICS"]
    cells = [r.split() for r in rows[1:]]
    assert [(c[0], c[4], c[5]) for c in cells] == \
        [("2", "bucket", "loss=0.4"), ("3", "tier", "loss=0.7"), ("4", "both", "loss=0.6")]

    # The bucket root alone: its own checkpoints, all "bucket".
    lines = ls_json(remote, aws)
    assert [(j["step"], j["where"], j["uri"]) for j in lines] == \
        [(s, "bucket", f"{remote}/{step_dir(s)}/") for s in (2, 4)]
    # A root without checkpoints: a line saying so, exit 0.
    empty = ckpt("ls", f"{remote}-none", env=aws)
    assert empty.returncode == 0
    assert empty.stdout.decode().startswith("no complete checkpoint in ")
    assert ls_json(f"{remote}-none", aws) == []


def test_export_by_latest_step_and_best(run, bucket, aws, s3_client):
    root, remote, _ = run
    other = f"s3://{bucket}/other"
    out = ckpt("export", root, "--latest", "--json", other, env=aws)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert (summary["step"], summary["dest"]) == (4, f"{other}/{step_dir(4)}/")
    assert summary["source"] == f"file://{root}/{step_dir(4)}/"
    # Step 4 was exported before: its files are in the destination's bucket already, but
    # not at this prefix, so they are copied.
    assert summary["copied"] == summary["files"] > 0
    out = ckpt("export", root, "--step", "3", other, env=aws)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().startswith("exported step 3 ")
    # Step 3 existed only in the tier: its entries now name the bucket's copies.
    for name in os.listdir(root / step_dir(3)):
        entry = json.loads(os.getxattr(root / step_dir(3) / name, "user.wharf.entry"))
        assert entry["local"] is False and entry["source"].startswith(f"{other}/{step_dir(3)}/")
    # --best by --metric: step 2 (0.4), which only the bucket holds.
    out = ckpt("export", root, "--best", "--metric", "loss", "--json", other, env=aws)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["step"] == 2 and summary["source"] == f"{remote}/{step_dir(2)}/"
    assert [j["step"] for j in ls_json(other, aws)] == [2, 3, 4]
    # --best with the metric the root records (checkpoints.json: loss, min), and --mode max.
    best = f"s3://{bucket}/best"
    assert ckpt("export", root, "--best", "-q", best, env=aws).returncode == 0
    assert [j["step"] for j in ls_json(best, aws)] == [2]
    worst = f"s3://{bucket}/worst"
    assert ckpt("export", root, "--best", "--mode", "max", "-q", worst, env=aws).returncode == 0
    assert [j["step"] for j in ls_json(worst, aws)] == [3]
    # Every exported copy is whole and loads.
    for uri, step in ((other, 2), (other, 3), (other, 4), (best, 2), (worst, 3)):
        same(CheckpointManager(uri).restore(step), state_of(step))
    # The manager recorded its metric in the bucket root too: --best there ranks the same.
    out = ckpt("export", remote, "--best", "-q", f"s3://{bucket}/x", env=aws)
    assert out.returncode == 0, out.stderr
    assert [j["step"] for j in ls_json(f"s3://{bucket}/x", aws)] == [2]
    # A root that records none needs --metric.
    s3_client.delete_object(Bucket=bucket, Key="run/checkpoints.json")
    out = ckpt("export", remote, "--best", f"s3://{bucket}/y", env=aws)
    assert out.returncode == 2 and "no metric" in out.stderr  # a usage error
    out = ckpt("export", remote, "--best", "--metric", "loss", "-q", f"s3://{bucket}/y", env=aws)
    assert out.returncode == 0, out.stderr
    assert [j["step"] for j in ls_json(f"s3://{bucket}/y", aws)] == [2]
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_restore_into_a_fresh_tier_then_the_manager_loads_it(run, tmp_path, aws):
    _, remote, _ = run
    tier2 = make_tier(tmp_path / "tier2", aws)
    dest = tier2 / "run"
    out = ckpt("restore", remote, "--latest", dest, env=aws)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().startswith("restored step 4 ")
    assert (dest / step_dir(4) / "manifest.json").is_file()
    assert [(j["step"], j["where"]) for j in ls_json(dest, aws)] == [(4, "tier")]
    mgr = CheckpointManager(dest)
    same(mgr.restore("latest"), state_of(4))
    assert mgr.last_restored["metrics"] == {"loss": LOSSES[4]}
    # A second restore of the same step copies nothing: the files are there.
    again = ckpt("restore", remote, "--step", "4", "--json", dest, env=aws)
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["copied"] == 0 and summary["skipped"] == summary["files"] > 0
    mgr.close()


def test_rm_removes_a_checkpoint_from_the_listing(run, bucket, aws, s3_client):
    root, remote, _ = run
    out = ckpt("rm", root, "--step", "3", env=aws)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode() == f"removed file://{root}/{step_dir(3)}/\n"
    assert not (root / step_dir(3)).exists()
    assert [j["step"] for j in ls_json(root, aws)] == [2, 4]
    # On the bucket: every object of the step goes.
    assert ckpt("rm", remote, "--step", "2", "-q", env=aws).returncode == 0
    keys = s3_client.list_objects_v2(Bucket=bucket, Prefix=f"run/{step_dir(2)}/")
    assert keys.get("KeyCount", 0) == 0
    assert [(j["step"], j["where"]) for j in ls_json(root, aws)] == [(4, "both")]
    # A missing step: exit 1, one line naming it.
    missing = ckpt("rm", root, "--step", "3", env=aws)
    assert missing.returncode == 1
    assert missing.stderr.count("\n") == 1 and "step 3" in missing.stderr
    # A step only the bucket holds: the message says where it is and how to remove it there.
    ckpt("rm", root, "--step", "4", "-q", env=aws).check_returncode()
    only_there = ckpt("rm", root, "--step", "4", env=aws)
    assert only_there.returncode == 1 and only_there.stderr.count("\n") == 1
    assert f"wharf ckpt rm {remote}/ --step 4 removes it there" in only_there.stderr, \
        only_there.stderr


def test_usage_errors_exit_2_and_a_missing_step_exits_1(run, bucket, aws):
    root, _, _ = run
    dest = f"s3://{bucket}/x"
    for selectors in (["--step", "3", "--latest"], ["--latest", "--best"],
                      ["--step", "3", "--best"]):
        out = ckpt("export", root, *selectors, dest, env=aws)
        assert out.returncode == 2, (selectors, out.stderr)
        assert "excludes" in out.stderr
    assert ckpt("restore", root, "--latest", "--best", dest, env=aws).returncode == 2
    assert ckpt("rm", root, env=aws).returncode == 2  # --step is required
    for verb, args in (("rm", [root, "--step", "-1"]), ("export", [root, "--step", "-1", dest]),
                       ("rm", [root, "--step", "abc"]),
                       ("restore", [root, "--step", "1000000000000", dest]),
                       ("export", [root, "--step", "99999999999999999999999", dest])):
        out = ckpt(verb, *args, env=aws)
        assert out.returncode == 2 and "--step" in out.stderr, out.stderr
        assert "a step is a whole number 0 <= N < 10^12" in out.stderr, out.stderr
    assert ckpt("export", root, "--latest", env=aws).returncode == 2  # no destination
    assert ckpt("ls", env=aws).returncode == 2
    assert ckpt("export", root, "--best", "--mode", "median", dest, env=aws).returncode == 2
    for extra in (["--mode", "max"], ["--metric", "loss"]):  # they rank --best only
        out = ckpt("export", root, "--latest", *extra, dest, env=aws)
        assert out.returncode == 2 and "requires --best" in out.stderr, out.stderr
    for verb in ("export", "restore"):  # no selector at all
        out = ckpt(verb, root, dest, env=aws)
        assert out.returncode == 2, out.stderr
        assert "give one of --step N, --latest, --best" in out.stderr
    for verb, args in (("export", [root, "--step", "99", dest]),
                       ("restore", [root, "--step", "99", dest])):
        out = ckpt(verb, *args, env=aws)
        assert out.returncode == 1, out.stderr
        assert out.stderr.count("\n") == 1 and "step 99" in out.stderr, out.stderr
    assert ls_json(dest, aws) == []
    # Into a file: one line (each file's copy failed on its own, one line each).
    a_file = pathlib.Path(root).parent / "a-file"
    a_file.write_bytes(b"x")
    out = ckpt("restore", root, "--latest", a_file, env=aws)
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "is a file, not a directory" in out.stderr
    # A file given as the root: an error for every verb, never "no complete checkpoint".
    for verb, args in (("ls", [a_file]), ("export", [a_file, "--latest", dest]),
                       ("rm", [a_file, "--step", "1"])):
        out = ckpt(verb, *args, env=aws)
        assert out.returncode == 1 and out.stderr.count("\n") == 1, (verb, out.stderr)
        assert f"{a_file} is a file, not a directory of checkpoints" in out.stderr, out.stderr
        assert out.stdout == b"", out.stdout
    out = ckpt("ls", a_file / "run", env=aws)
    assert out.returncode == 1 and out.stdout == b"", out.stderr
    assert f"{a_file}/run is below a file, not a directory of checkpoints" in out.stderr
    # Into the root itself, below one of its checkpoints: refused (later copies of the root
    # carried the copy along).
    inside = f"{root}/step-000000000003/copy"
    out = ckpt("export", root, "--latest", inside, env=aws)
    assert out.returncode == 2 and "the checkpoints' own root" in out.stderr, out.stderr


def test_only_complete_checkpoints_are_listed(tmp_path, bucket, aws, s3_client):
    # A plain directory and a bucket, each with a step whose manifest was never written.
    plain = tmp_path / "plain"
    remote = f"s3://{bucket}/ckpts"
    for root in (plain, remote):
        mgr = CheckpointManager(root, async_save=False)
        for step in (1, 2):
            mgr.save(step, state_of(step))
        mgr.close()
    incomplete = plain / step_dir(5)
    incomplete.mkdir()
    for name in os.listdir(plain / step_dir(2)):
        if name != "manifest.json":
            (incomplete / name).write_bytes((plain / step_dir(2) / name).read_bytes())
    for name in ("__0_0.distcp", ".metadata"):
        s3_client.put_object(Bucket=bucket, Key=f"ckpts/{step_dir(7)}/{name}", Body=b"partial")
    for root in (plain, remote):
        assert [j["step"] for j in ls_json(root, aws)] == [1, 2]
        rows = ckpt("ls", root, env=aws).stdout.decode().splitlines()[1:]
        assert [r.split()[0] for r in rows] == ["1", "2"]
        # --latest is the latest complete one.
        dest = f"s3://{bucket}/from-{pathlib.Path(str(root)).name}"
        out = ckpt("export", root, "--latest", "--json", dest, env=aws)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["step"] == 2
        # An incomplete step is not restorable, but rm removes it.
        out = ckpt("export", root, "--step", "5" if root == plain else "7", dest, env=aws)
        assert out.returncode == 1
    assert ckpt("rm", plain, "--step", "5", "-q", env=aws).returncode == 0
    assert not incomplete.exists()
    assert ckpt("rm", remote, "--step", "7", "-q", env=aws).returncode == 0
    assert s3_client.list_objects_v2(Bucket=bucket,
                                     Prefix=f"ckpts/{step_dir(7)}/").get("KeyCount", 0) == 0


def test_a_damaged_manifest_leaves_the_other_checkpoints_usable(tmp_path, bucket, aws, s3_client):
    remote = f"s3://{bucket}/dmg"
    mgr = CheckpointManager(remote, async_save=False)
    for step in (1, 2):
        mgr.save(step, state_of(step))
    mgr.close()
    s3_client.put_object(Bucket=bucket, Key=f"dmg/{step_dir(3)}/manifest.json", Body=b"{not json")
    s3_client.put_object(Bucket=bucket, Key=f"dmg/{step_dir(4)}/manifest.json",
                         Body=b'{"step": 4, "files": []}')
    s3_client.put_object(Bucket=bucket, Key=f"dmg/{step_dir(5)}/manifest.json",
                         Body=b'{"format": 5, "version": 1}')
    out = ckpt("ls", "--json", remote, env=aws)
    assert out.returncode == 0, out.stderr
    assert [json.loads(line)["step"] for line in out.stdout.decode().splitlines()] == [1, 2]
    assert all(f"step {s} is left out" in out.stderr for s in (3, 4, 5)), out.stderr
    out = ckpt("export", remote, "--latest", f"s3://{bucket}/dmg-copy", env=aws)
    assert out.returncode == 0, out.stderr
    with pytest.warns(RuntimeWarning, match="step 3 is left out"):
        mgr = CheckpointManager(remote)
        assert [m["step"] for m in mgr.list()] == [1, 2]
    same(mgr.restore("latest"), state_of(2))
    mgr.close()
    # rm removes a damaged step too.
    assert ckpt("rm", remote, "--step", "3", "-q", env=aws).returncode == 0
    assert "step 3" not in ckpt("ls", remote, env=aws).stderr


def test_the_tier_restores_when_its_export_destination_is_unreachable(tmp_path, aws):
    tier = make_tier(tmp_path / "tier", aws)
    root = tier / "run"
    mgr = CheckpointManager(root, export_to="s3://wharf-no-such-bucket-for-tests/run",
                            async_save=False)
    mgr.save(1, state_of(1))
    with pytest.raises(wharf.WharfError):
        mgr.wait()  # the export failed
    with pytest.warns(RuntimeWarning, match="left out"):
        same(mgr.restore("latest"), state_of(1))
    mgr.close()
    out = ckpt("ls", "--json", root, env=aws)
    assert out.returncode == 0 and "left out" in out.stderr, out.stderr
    assert [json.loads(line)["where"] for line in out.stdout.decode().splitlines()] == ["tier"]


def test_a_newer_manifest_at_the_export_destination_stops_the_listing(tmp_path, bucket, aws,
                                                                        s3_client):
    # Skipping it could make an older checkpoint "latest": the listing fails, naming it.
    tier = make_tier(tmp_path / "tier", aws)
    mgr = CheckpointManager(tier / "run", export_to=f"s3://{bucket}/run", async_save=False)
    mgr.save(1, state_of(1))
    mgr.close()
    newer = json.dumps({"format": "wharf-checkpoint", "version": 999, "step": 2}).encode()
    s3_client.put_object(Bucket=bucket, Key=f"run/{step_dir(2)}/manifest.json", Body=newer)
    out = ckpt("ls", tier / "run", env=aws)
    assert out.returncode == 1 and "newer than this wharf" in out.stderr, out.stderr
    with pytest.raises(wharf.WharfError, match="newer than this wharf"):
        CheckpointManager(tier / "run", export_to=f"s3://{bucket}/run").list()


def test_a_copy_leaves_only_the_checkpoints_files_in_the_step_directory(tmp_path):
    # Export from a tier and restore into a plain directory, each into a step directory that
    # holds another checkpoint's files (a crashed save, an older run): after the copy the
    # directory holds exactly the manifest's files, so nothing foreign is exported onwards.
    tier = make_tier(tmp_path / "tier")
    mgr = CheckpointManager(tier / "run", keep_last=2)
    mgr.save(7, state_of(7)).result()
    mgr.close()
    wanted = sorted(p.name for p in (tier / "run" / step_dir(7)).iterdir())
    for verb, src, dest in (("export", tier / "run", tmp_path / "bucket"),
                            ("restore", tmp_path / "bucket", tmp_path / "again")):
        stray = dest / step_dir(7)
        (stray / "sub").mkdir(parents=True)
        (stray / "__9_0.distcp").write_bytes(b"another run's shard")
        (stray / "sub" / "x").write_bytes(b"x")
        out = ckpt(verb, src, "--step", "7", "--json", dest, env=None)
        assert out.returncode == 0, out.stderr
        assert sorted(p.name for p in stray.iterdir()) == wanted, verb
        mgr = CheckpointManager(dest)
        same(mgr.restore(7), state_of(7))
        mgr.close()


def test_an_export_carries_the_ranking_metric_and_a_damaged_source_is_named(run, bucket, aws,
                                                                           s3_client):
    root, _, listed = run
    dest = f"s3://{bucket}/carried"
    # --best at the destination ranks as the source does, without --metric.
    ckpt("export", root, "--step", 3, dest, env=aws).check_returncode()
    ckpt("export", root, "--step", 4, dest, env=aws).check_returncode()
    best = min((3, 4), key=lambda s: LOSSES[s])
    out = run_wharf("ckpt", "restore", dest, "--best", pathlib.Path(root).parent / "back",
                    "--json", env=aws, check=True)
    assert json.loads(out.stdout)["step"] == best
    # A source missing a file is named as the damaged one, and nothing is copied.
    s3_client.delete_object(Bucket=bucket, Key="carried/step-000000000004/__0_0.distcp")
    out = ckpt("restore", dest, "--step", 4, pathlib.Path(root).parent / "again", env=aws)
    assert out.returncode == 1, out.stderr
    assert f"checkpoint {dest}/step-000000000004/ is damaged: __0_0.distcp is missing" in \
        out.stderr, out.stderr
    assert "nothing copied" in out.stderr
    assert not (pathlib.Path(root).parent / "again" / "step-000000000004").exists()


def test_a_restore_out_of_the_tier_keeps_its_checkpoint_unevictable(run, tmp_path, aws):
    # Step 3 is only in the tier: a restore into a scratch folder is a copy, not an export,
    # so the tier's files stay `local` and eviction keeps them after the copy is gone.
    root, _, _ = run
    out = ckpt("restore", root, "--step", "3", "-q", tmp_path / "scratch", env=aws)
    assert out.returncode == 0, out.stderr
    for name in os.listdir(root / step_dir(3)):
        entry = json.loads(os.getxattr(root / step_dir(3) / name, "user.wharf.entry"))
        assert entry["local"] is True, name
    out = run_wharf("tier", "evict", root, "--to", "0", env=aws, check=True)
    assert [j["step"] for j in ls_json(root, aws) if j["where"] in ("tier", "both")] == [3]
    same(CheckpointManager(root).restore(3), state_of(3))


def test_best_by_a_metric_the_root_does_not_record_ranks_by_its_own_mode(tmp_path, aws):
    root = tmp_path / "m"
    mgr = CheckpointManager(root, metric="acc", mode="max", async_save=False)
    for step, (acc, loss) in {1: (0.5, 0.9), 2: (0.9, 0.5), 3: (0.7, 0.1)}.items():
        mgr.save(step, state_of(step), metrics={"acc": acc, "loss": loss})
    mgr.close()
    picked = {}
    for args in ((), ("--metric", "acc"), ("--metric", "loss"), ("--metric", "loss", "--mode",
                                                                   "max")):
        out = ckpt("restore", root, "--best", *args, "--json", tmp_path / f"r{len(picked)}",
                   env=aws)
        assert out.returncode == 0, out.stderr
        picked[args] = json.loads(out.stdout)["step"]
    assert list(picked.values()) == [2, 2, 3, 1]  # acc: max (recorded); loss: min, or --mode


def test_a_damaged_copy_in_a_plain_folder_is_listed_from_the_bucket_or_left_out(tmp_path, bucket,
                                                                              aws):
    # A plain folder (no tier) that exports every save: a file of its step 2 cut short and one
    # of step 3 (never exported) deleted. `ls` must not call the local copy of 2 complete
    # ("both"): it lists the bucket's, with a warning, and a restore reads that one; step 3,
    # complete nowhere, is left out.
    root = tmp_path / "plain"
    remote = f"s3://{bucket}/plain"
    mgr = CheckpointManager(root, export_to=remote, export_every=2, async_save=False)
    for step in (1, 2, 3):
        mgr.save(step, state_of(step))
    mgr.close()
    assert [(j["step"], j["where"]) for j in ls_json(root, aws)] == \
        [(1, "tier"), (2, "both"), (3, "tier")]
    cut = root / step_dir(2) / "__0_0.distcp"
    cut.write_bytes(cut.read_bytes()[:100])
    os.remove(root / step_dir(3) / "__0_0.distcp")
    proc = run_wharf("ckpt", "ls", "--json", root, env=aws, check=True)
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [(j["step"], j["where"]) for j in lines] == [(1, "tier"), (2, "bucket")]
    assert lines[1]["uri"] == f"{remote}/{step_dir(2)}/"
    err = proc.stderr
    assert f"step 2: the copy in file://{root}/ is damaged" in err, err
    assert "step 3 is left out" in err and "__0_0.distcp" in err, err
    out = ckpt("restore", root, "--step", "2", "-q", tmp_path / "back", env=aws)
    assert out.returncode == 0, out.stderr
    same(CheckpointManager(tmp_path / "back").restore(2), state_of(2))
