"""PyTorch Lightning checkpoints on any wharf URI: ``wharf.lightning.CheckpointIO``.

A CheckpointIO plugin (like s3torchconnector's ``S3LightningCheckpoint``): Lightning's
checkpoint writes, reads and removals go to s3://, gs://, file:// or a local path through
wharf, with no fsspec file system involved::

    import lightning.pytorch as pl            # or: import pytorch_lightning as pl
    import wharf.lightning

    io = wharf.lightning.CheckpointIO(region="us-east-1")    # store options, as wharf.Store's
    trainer = pl.Trainer(max_steps=1000, plugins=[io])
    trainer.fit(model)
    trainer.save_checkpoint("s3://bucket/run1/last.ckpt")
    # later: a new run goes on from step 1000
    trainer = pl.Trainer(max_steps=2000, plugins=[io])
    trainer.fit(model, ckpt_path="s3://bucket/run1/last.ckpt")

One class for both flavours: Lightning's Trainer accepts a plugin when it is an instance of its
own package's ``CheckpointIO`` (``lightning.fabric.plugins.io.CheckpointIO`` for
``lightning.pytorch``, ``lightning_fabric.plugins.io.CheckpointIO`` for ``pytorch_lightning``;
two distinct classes with the same ABC interface). ``wharf.lightning.CheckpointIO`` subclasses
every one of them that is installed, so the same plugin goes to a ``lightning.pytorch`` Trainer,
a ``pytorch_lightning`` Trainer, and either flavour's ``Fabric``. Importing this module imports
Lightning (``import wharf`` never does); with neither ``lightning`` nor ``lightning_fabric``
(which ``pytorch_lightning`` installs) it raises ImportError.

Saves are ``wharf.torch.save``: torch.save's bytes, byte for byte (plain ``torch.load`` of the
object reads the checkpoint), streamed up while the state is serialized, and committed
atomically when the save completes: a save that raises (an unpicklable object in the
checkpoint, an interrupt) leaves no object behind, and never a partial one. Loads are
``wharf.torch.load`` (ranged reads with read-ahead, pinned to the object's ETag).

``ModelCheckpoint`` with a remote ``dirpath``: the callback writes, loads and removes its
checkpoints through this plugin, but it also keeps its own books through fsspec (``exists``,
``ls``, ``makedirs`` on ``dirpath``), so an ``s3://`` dirpath additionally needs fsspec's S3
file system (``s3fs``, configured for the same endpoint, e.g. ``AWS_ENDPOINT_URL``); without
it Lightning raises "Install s3fs to access S3" when the callback is created. Without s3fs,
keep ``dirpath`` (and ``default_root_dir``) local, and put checkpoints on the object store
with ``trainer.save_checkpoint(uri)`` / ``ckpt_path=uri``, which go through the plugin only.
"""
import importlib
import importlib.util
import json
import os
import shutil
from typing import Any, Dict, Optional

import wharf
import wharf.torch


def _bases() -> tuple:
    """The CheckpointIO base class of each Lightning flavour that is installed."""
    bases = []
    # lightning.pytorch's Trainer takes lightning.fabric's class; pytorch_lightning's takes
    # lightning_fabric's (pytorch_lightning depends on lightning_fabric, which Fabric uses
    # on its own too).
    for package, module in (("lightning", "lightning.fabric.plugins.io"),
                            ("lightning_fabric", "lightning_fabric.plugins.io")):
        if importlib.util.find_spec(package) is not None:
            bases.append(importlib.import_module(module).CheckpointIO)
    if not bases:
        raise ImportError("wharf.lightning needs PyTorch Lightning: `pip install lightning` "
                          "(for lightning.pytorch) or `pip install pytorch_lightning`")
    return tuple(bases)


_BASES = _bases()

# The store options of wharf.Store / wharf.open (store/spec.cc, StoreOptions::Names).
STORE_OPTIONS = tuple(wharf._wharf.store_option_names)


def _keep_storage(storage, location):
    # TorchCheckpointIO's default map_location: tensors stay where torch.load puts them first
    # (CPU), whatever device they were saved from.
    return storage


class CheckpointIO(*_BASES):
    """Lightning's CheckpointIO over wharf: checkpoints on any wharf URI.

    ``CheckpointIO(**store_options)``: the store options of ``wharf.Store`` (``endpoint=``,
    ``region=``, ``anonymous=``, ``profile=``, ``addressing_style=``, ``api=``, ``cache=``)
    for every checkpoint this plugin writes, reads or removes; unset ones come from the URI's
    query and the environment (AWS_*, WHARF_*). Pass it in the Trainer's ``plugins``::

        trainer = Trainer(plugins=[wharf.lightning.CheckpointIO()])

    Paths may be URIs (``s3://bucket/ckpt/epoch=1.ckpt``, ``gs://...``, ``file:///...``) or
    local paths (``str`` or ``pathlib.Path``), which are files as with ``file://``.
    """

    def __init__(self, **store_options: Any) -> None:
        unknown = sorted(set(store_options) - set(STORE_OPTIONS))
        if unknown:
            raise TypeError(f"wharf.lightning.CheckpointIO: unknown store option(s) "
                            f"{', '.join(unknown)} (valid: {', '.join(STORE_OPTIONS)})")
        self.store_options: Dict[str, Any] = dict(store_options)

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.store_options.items())
        return f"wharf.lightning.CheckpointIO({opts})"

    def save_checkpoint(self, checkpoint: Dict[str, Any], path,
                        storage_options: Optional[Any] = None) -> None:
        """Writes ``checkpoint`` (torch.save's bytes) to ``path``; the object appears whole when
        the save completes, and nothing appears when it raises.

        ``storage_options`` (``Trainer.save_checkpoint(..., storage_options=...)``): None, or
        a dict whose store option keys (``region``, ``endpoint``...) override this plugin's
        for this save; other keys are ignored. Anything but a dict raises TypeError.
        """
        uri = _uri(path)
        wharf.torch.save(checkpoint, uri, **_for(uri, self._options(storage_options)))

    def load_checkpoint(self, path, map_location: Optional[Any] = _keep_storage,
                        weights_only: Optional[bool] = None, **kwargs: Any) -> Dict[str, Any]:
        """The checkpoint at ``path`` (torch.load of the object; reads anything torch.save
        wrote). ``map_location`` and ``weights_only`` are torch.load's, as in Lightning's
        TorchCheckpointIO (default: tensors on CPU; ``weights_only=None``: torch's default).
        A missing checkpoint raises FileNotFoundError (``wharf.NotFoundError``). Keyword
        arguments newer Lightning versions may add are accepted and ignored."""
        uri = _uri(path)
        return wharf.torch.load(uri, map_location=map_location, weights_only=weights_only,
                                **_for(uri, self.store_options))

    def remove_checkpoint(self, path) -> None:
        """Removes the checkpoint at ``path``, and, when ``path`` is a "directory" (a prefix
        followed by ``/``), every object below it, as TorchCheckpointIO's
        ``fs.rm(path, recursive=True)`` does. ``s3://b/ckpt`` removes ``ckpt`` and
        ``ckpt/...``, never ``ckpt.bak``. A missing path is not an error. Local paths are
        removed as files and folders (the folder holding them stays)."""
        uri = _uri(path)
        store = wharf.Store(uri, **_for(uri, self.store_options))
        if json.loads(store.spec)["scheme"] == "file":
            local = store.url("")[len("file://"):]
            if os.path.isdir(local) and not os.path.islink(local):
                shutil.rmtree(local)
            elif os.path.lexists(local):
                os.remove(local)
            return
        if uri.split("?", 1)[0].endswith("/"):  # a folder, options in a query or not
            keys = [o["key"] for o in store.list()]
        else:  # the object itself ("") and the objects below it ("/...")
            keys = [o["key"] for o in store.list() if o["key"] == "" or o["key"].startswith("/")]
        if keys:
            store.delete_many(keys)

    def teardown(self) -> None:
        """Nothing to release: each save, load and removal opens and closes its own files."""

    def _options(self, storage_options: Optional[Any]) -> Dict[str, Any]:
        if storage_options is None:
            return self.store_options
        if not isinstance(storage_options, dict):
            raise TypeError(
                f"`Trainer.save_checkpoint(..., storage_options=...)`: wharf.lightning."
                f"CheckpointIO takes a dict of store options ({', '.join(STORE_OPTIONS)}), "
                f"not {type(storage_options).__name__}")
        options = dict(self.store_options)
        options.update({k: v for k, v in storage_options.items() if k in STORE_OPTIONS})
        return options


def _uri(path) -> str:
    return os.fspath(path) if isinstance(path, os.PathLike) else str(path)


def _for(uri: str, options: Dict[str, Any]) -> Dict[str, Any]:
    """The store options that apply to ``uri``: all of them for an object store, only
    ``cache`` for a local path or file:// (Lightning's own ModelCheckpoint writes to a local
    folder through the same plugin that was given ``region=`` for its s3:// checkpoints)."""
    if "://" in uri and not uri.startswith("file://"):
        return options
    return {k: v for k, v in options.items() if k == "cache"}


__all__ = ["CheckpointIO", "STORE_OPTIONS"]
