"""wharf.lightning.CheckpointIO: Lightning checkpoints on the real S3 server (RGW) and on local
paths, with both lightning.pytorch and pytorch_lightning Trainers."""
import importlib
import io
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import wharf
import wharf.torch

PYTHON_DIR = str(pathlib.Path(__file__).resolve().parents[2] / "python")
FLAVOURS = ["lightning.pytorch", "pytorch_lightning"]
pytestmark = [pytest.mark.filterwarnings(f"ignore:{m}") for m in (
    ".*does not have many workers", ".*smaller than the logging interval",
    ".*callbacks used to create the checkpoint", r".*isinstance\(treespec, LeafSpec\)")]


@pytest.fixture(scope="module")
def wl():
    # Both flavours are in requirements.txt: a missing one fails here, never skips.
    importlib.import_module("lightning")
    importlib.import_module("pytorch_lightning")
    return importlib.import_module("wharf.lightning")


@pytest.fixture(params=FLAVOURS)
def pl(request, wl):
    return importlib.import_module(request.param)


@pytest.fixture
def s3(aws, bucket):
    """The base URI of a fresh bucket; the server's credentials in the environment."""
    return f"s3://{bucket}/"


def _keys(s3_client, bucket):
    return sorted(o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket).get("Contents", []))


def _download(s3_client, bucket, key):
    return s3_client.get_object(Bucket=bucket, Key=key)["Body"].read()


def _module(pl, seed):
    """A tiny LightningModule of the flavour `pl` (a Linear layer on random data)."""
    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(seed)
            self.layer = torch.nn.Linear(4, 2)
            self.seen = []  # (global_step, weights) at the start of training

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def on_train_start(self):
            self.seen.append((self.trainer.global_step,
                              {k: v.clone() for k, v in self.state_dict().items()}))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            g = torch.Generator().manual_seed(1)
            data = torch.utils.data.TensorDataset(torch.randn(32, 4, generator=g),
                                                  torch.randn(32, 2, generator=g))
            return torch.utils.data.DataLoader(data, batch_size=8)

    return Tiny()


def _trainer(pl, plugin, root, max_steps, **kwargs):
    return pl.Trainer(plugins=[plugin], default_root_dir=str(root), max_steps=max_steps,
                      accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, **kwargs)


def _same_tensors(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_one_class_is_a_checkpoint_io_of_both_flavours(wl):
    import lightning.fabric.plugins.io
    import lightning.pytorch.plugins
    import lightning_fabric.plugins.io
    import pytorch_lightning.plugins

    plugin = wl.CheckpointIO()
    for base in (lightning.pytorch.plugins.CheckpointIO, pytorch_lightning.plugins.CheckpointIO,
                 lightning.fabric.plugins.io.CheckpointIO,
                 lightning_fabric.plugins.io.CheckpointIO):
        assert isinstance(plugin, base)
    # the two flavours' classes are distinct: one base alone would not do
    assert lightning.pytorch.plugins.CheckpointIO is not pytorch_lightning.plugins.CheckpointIO


def test_save_to_s3_and_resume_from_it(pl, wl, s3, s3_client, bucket, tmp_path, monkeypatch):
    saves = []
    real_save = wharf.torch.save
    monkeypatch.setattr(wharf.torch, "save",
                        lambda obj, uri, **kw: (saves.append(uri), real_save(obj, uri, **kw)))
    plugin = wl.CheckpointIO()

    # Train 4 steps (an epoch); ModelCheckpoint keeps its books on a local dirpath, but writes
    # and removes through the plugin (save_top_k=1: one file left).
    model = _module(pl, seed=0)
    ckpt_dir = tmp_path / "local-ckpt"
    callback = pl.callbacks.ModelCheckpoint(dirpath=str(ckpt_dir), every_n_train_steps=1,
                                            save_top_k=1, monitor="step", mode="max")
    trainer = _trainer(pl, plugin, tmp_path, 4, callbacks=[callback])
    trainer.fit(model)
    assert trainer.strategy.checkpoint_io is plugin
    assert trainer.global_step == 4
    local = sorted(p.name for p in ckpt_dir.iterdir())
    assert local == ["epoch=0-step=4.ckpt"], local
    assert [os.path.basename(u) for u in saves] == [f"epoch=0-step={i}.ckpt" for i in range(1, 5)]
    on_disk = torch.load(ckpt_dir / local[0], weights_only=False)
    _same_tensors(on_disk["state_dict"], model.state_dict())

    # Save to the bucket; the object is torch.save's checkpoint of the model.
    uri = s3 + "run/last.ckpt"
    trainer.save_checkpoint(uri)
    assert saves[-1] == uri
    assert _keys(s3_client, bucket) == ["run/last.ckpt"]
    ckpt = torch.load(io.BytesIO(_download(s3_client, bucket, "run/last.ckpt")),
                      weights_only=False)
    assert ckpt["global_step"] == 4
    _same_tensors(ckpt["state_dict"], model.state_dict())
    # the plugin reads it back
    _same_tensors(plugin.load_checkpoint(uri)["state_dict"], model.state_dict())

    # Resume a fresh model (other initial weights) from the bucket: training continues at step
    # 4 from the saved weights.
    model2 = _module(pl, seed=1)
    assert not torch.equal(model2.layer.weight, model.layer.weight)
    trainer2 = _trainer(pl, wl.CheckpointIO(), tmp_path / "2", 6, enable_checkpointing=False)
    trainer2.fit(model2, ckpt_path=uri)
    (step, weights), = model2.seen
    assert step == 4
    _same_tensors(weights, ckpt["state_dict"])
    assert trainer2.global_step == 6
    assert not torch.equal(model2.layer.weight, model.layer.weight)  # it trained on


def test_resume_from_a_missing_checkpoint_fails(pl, wl, s3, tmp_path):
    trainer = _trainer(pl, wl.CheckpointIO(), tmp_path, 1, enable_checkpointing=False)
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        trainer.fit(_module(pl, seed=0), ckpt_path=s3 + "missing.ckpt")


def test_remove_checkpoint_on_s3(wl, s3, s3_client, bucket):
    plugin = wl.CheckpointIO()
    state = {"w": torch.arange(4.0)}
    for name in ("a.ckpt", "a.ckpt.bak", "dir/x.ckpt", "dir/sub/y.ckpt", "dirty.ckpt"):
        plugin.save_checkpoint(state, s3 + name)
    assert torch.equal(plugin.load_checkpoint(s3 + "a.ckpt")["w"], state["w"])

    plugin.remove_checkpoint(s3 + "a.ckpt")
    assert _keys(s3_client, bucket) == ["a.ckpt.bak", "dir/sub/y.ckpt", "dir/x.ckpt",
                                        "dirty.ckpt"]
    with pytest.raises(FileNotFoundError):
        plugin.load_checkpoint(s3 + "a.ckpt")
    plugin.remove_checkpoint(s3 + "a.ckpt")  # already gone: not an error

    plugin.remove_checkpoint(s3 + "dir")  # a "directory": everything below it
    assert _keys(s3_client, bucket) == ["a.ckpt.bak", "dirty.ckpt"]
    plugin.save_checkpoint(state, s3 + "dir2/z.ckpt")
    plugin.remove_checkpoint(s3 + "dir2/")
    assert _keys(s3_client, bucket) == ["a.ckpt.bak", "dirty.ckpt"]


def test_local_paths_and_file_uris(wl, tmp_path):
    plugin = wl.CheckpointIO()
    state = {"w": torch.arange(3.0)}
    plugin.save_checkpoint(state, tmp_path / "p" / "a.ckpt")  # a pathlib.Path, parents made
    plugin.save_checkpoint(state, f"file://{tmp_path}/p/b.ckpt")
    plugin.save_checkpoint(state, str(tmp_path / "d" / "sub" / "c.ckpt"))
    assert torch.equal(torch.load(tmp_path / "p" / "a.ckpt")["w"], state["w"])
    assert torch.equal(plugin.load_checkpoint(str(tmp_path / "p" / "b.ckpt"))["w"], state["w"])

    plugin.remove_checkpoint(f"file://{tmp_path}/p/a.ckpt")
    assert sorted(os.listdir(tmp_path / "p")) == ["b.ckpt"]
    plugin.remove_checkpoint(tmp_path / "p" / "b.ckpt")
    assert os.listdir(tmp_path / "p") == []  # the folder stays, as with TorchCheckpointIO
    plugin.remove_checkpoint(tmp_path / "d")  # a folder: removed with what it holds
    assert sorted(os.listdir(tmp_path)) == ["p"]
    plugin.remove_checkpoint(tmp_path / "nothing-here")
    with pytest.raises(FileNotFoundError):
        plugin.load_checkpoint(tmp_path / "p" / "b.ckpt")


class _Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_a_save_that_raises_leaves_nothing(pl, wl, s3, s3_client, bucket, tmp_path):
    # Through the Trainer: the module puts an unpicklable object into its checkpoint, after
    # 12 MiB of tensors (more than one 8 MiB part: the multipart upload has begun).
    model = _module(pl, seed=0)
    model.on_save_checkpoint = lambda checkpoint: checkpoint.update(
        big=torch.randn(3 << 20), bad=_Unpicklable())
    trainer = _trainer(pl, wl.CheckpointIO(), tmp_path, 1, enable_checkpointing=False)
    trainer.fit(model)
    with pytest.raises(RuntimeError, match="cannot pickle"):
        trainer.save_checkpoint(s3 + "bad.ckpt")
    assert _keys(s3_client, bucket) == []
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    with pytest.raises(FileNotFoundError):
        wl.CheckpointIO().load_checkpoint(s3 + "bad.ckpt")
    # an earlier checkpoint at the same path is kept whole
    good = {"w": torch.arange(5.0)}
    wl.CheckpointIO().save_checkpoint(good, s3 + "bad.ckpt")
    with pytest.raises(RuntimeError, match="cannot pickle"):
        wl.CheckpointIO().save_checkpoint({"big": torch.randn(3 << 20), "bad": _Unpicklable()},
                                          s3 + "bad.ckpt")
    assert torch.equal(torch.load(io.BytesIO(_download(s3_client, bucket, "bad.ckpt")))["w"],
                       good["w"])


def test_storage_options(pl, wl, s3, s3_client, bucket, tmp_path):
    plugin = wl.CheckpointIO()
    state = {"w": torch.ones(2)}
    # TorchCheckpointIO refuses any storage_options; this plugin takes a dict: store options
    # are used (a wrong type of one reaches wharf.Store), other keys ignored
    plugin.save_checkpoint(state, s3 + "a.ckpt", storage_options={"unrelated": 1})
    with pytest.raises(TypeError, match="region"):
        plugin.save_checkpoint(state, s3 + "b.ckpt", storage_options={"region": 5})
    with pytest.raises(TypeError, match="dict"):
        plugin.save_checkpoint(state, s3 + "c.ckpt", storage_options=["region"])
    assert _keys(s3_client, bucket) == ["a.ckpt"]
    # and through the Trainer
    trainer = _trainer(pl, plugin, tmp_path, 1, enable_checkpointing=False)
    trainer.fit(_module(pl, seed=0))
    trainer.save_checkpoint(s3 + "d.ckpt", storage_options={"region": "us-east-1"})
    with pytest.raises(TypeError, match="dict"):
        trainer.save_checkpoint(s3 + "e.ckpt", storage_options="us-east-1")
    assert _keys(s3_client, bucket) == ["a.ckpt", "d.ckpt"]


def test_store_options_skip_local_paths(pl, wl, s3, s3_client, bucket, tmp_path):
    # The docstring's plugin (region=...) with Lightning's default ModelCheckpoint, which
    # writes local files through the same plugin: the S3 options do not reach file://.
    plugin = wl.CheckpointIO(region="us-east-1", addressing_style="path")
    trainer = _trainer(pl, plugin, tmp_path, 4)
    trainer.fit(_module(pl, seed=0))
    saved = sorted(tmp_path.rglob("*.ckpt"))
    assert len(saved) == 1, saved
    assert plugin.load_checkpoint(saved[0])["global_step"] == 4
    plugin.save_checkpoint({"w": torch.ones(1)}, f"file://{tmp_path}/x.ckpt")
    plugin.remove_checkpoint(saved[0])
    assert not saved[0].exists() and (tmp_path / "x.ckpt").exists()
    # ... and still reach the object store
    trainer.save_checkpoint(s3 + "run/a.ckpt")
    trainer.save_checkpoint(s3 + "run/b.ckpt")
    assert _keys(s3_client, bucket) == ["run/a.ckpt", "run/b.ckpt"]
    # a folder URI with its options in a query is a folder too
    plugin.remove_checkpoint(s3 + "run/?region=us-east-1")
    assert _keys(s3_client, bucket) == []


def test_store_options_are_checked_and_match_wharf_store(wl):
    with pytest.raises(TypeError, match="bogus"):
        wl.CheckpointIO(bogus="x")
    assert repr(wl.CheckpointIO(region="eu-west-1")) == \
        "wharf.lightning.CheckpointIO(region='eu-west-1')"
    # the names are wharf.Store's (its error for an unknown option lists them)
    with pytest.raises(ValueError, match="valid: ") as e:
        wharf.Store("file:///", bogus="x")
    valid = str(e.value).split("valid: ")[1].rstrip(")").split(", ")
    assert tuple(valid) == wl.STORE_OPTIONS


def _run(code):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)


def test_import_wharf_does_not_import_lightning_and_no_lightning_is_a_clear_error():
    out = _run("import sys, wharf, wharf.torch\n"
               "print(sorted(m for m in sys.modules if 'lightning' in m))\n"
               "for m in ('lightning', 'lightning_fabric', 'pytorch_lightning'):\n"
               "    sys.modules[m] = None  # as if not installed\n"
               "try:\n"
               "    import wharf.lightning\n"
               "except ImportError as e:\n"
               "    print('ImportError:', e)\n")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "[]"
    assert lines[1].startswith("ImportError: wharf.lightning needs PyTorch Lightning")
    assert "pip install lightning" in lines[1]
