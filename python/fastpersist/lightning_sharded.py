# SPDX-License-Identifier: Apache-2.0
"""Lightning's sharded saves through fastpersist: ``FastPersistModelParallelStrategy``.

Lightning's ``ModelParallelStrategy`` (FSDP2 / tensor parallel through DTensors) saves a sharded
checkpoint by calling ``torch.distributed.checkpoint`` itself, with no hook for a storage
writer and without its ``CheckpointIO``. This subclass keeps everything else and replaces
those two calls: each save goes through :class:`fastpersist.dcp.FastPersistWriter`, each load
through :class:`fastpersist.dcp.FastPersistReader`.

A checkpoint path (``.../epoch=1-step=100.ckpt``, ``.../last.ckpt``) becomes a fastpersist root
holding one committed checkpoint: a save commits a new tag in it (every rank's shards, checksums,
DCP's metadata and Lightning's own metadata, committed once for all ranks), and only then is the
previous tag removed (``keep_last=1``). A crash at any moment leaves the previous checkpoint whole
at the path. ``fastpersist verify/list/inspect`` work on it.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed.checkpoint as dcp
from lightning.pytorch.strategies import ModelParallelStrategy  # type: ignore[import-not-found, import-untyped, unused-ignore]

from . import _core
from .checkpoint import tag_for
from .dcp import FastPersistReader, FastPersistWriter
from .errors import CheckpointCorruptError
from .serialization import resolve_weights_only

# Lightning's checkpoint minus the module and optimizer states (loops, callbacks, hyper-
# parameters, versions): one torch.save'd value inside the DCP checkpoint.
METADATA_KEY = "lightning_metadata"


class FastPersistModelParallelStrategy(ModelParallelStrategy):  # type: ignore[misc, unused-ignore]
    """``ModelParallelStrategy`` whose sharded checkpoints are saved and loaded by fastpersist.

    Args:
        checkpoint_options: :class:`fastpersist.dcp.FastPersistWriter` settings for every save
            (``durable``, ``checksums``, ``staging_budget``, ``max_parallel_files``, ...);
            ``storage_options`` of one save (``trainer.save_checkpoint(path,
            storage_options={...})``) override them for that save.
        *args, **kwargs: ``ModelParallelStrategy``'s own.

    Loads of checkpoints that Lightning itself wrote (its own sharded folders and full
    ``.ckpt`` files) go to ``ModelParallelStrategy`` unchanged.
    """

    def __init__(self, *args: Any, checkpoint_options: Optional[Dict[str, Any]] = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fp_options = _checked_options(checkpoint_options, "checkpoint_options")

    def save_checkpoint(self, checkpoint: Dict[str, Any], filepath: Any,
                        storage_options: Optional[Any] = None) -> None:
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)  # type: ignore[no-any-return]
        options = {**self._fp_options, **_checked_options(storage_options, "storage_options")}
        path = Path(self.broadcast(os.path.abspath(os.fspath(filepath))))
        step = int(self._attached_module().trainer.global_step)
        # Rank 0 checks the path and picks the new tag; every rank raises the same error.
        verdict: Tuple[str, ...] = self.broadcast(_plan_save(path, step) if self.is_global_zero
                                                  else ("",))
        if verdict[0] == "error":
            raise _error(verdict[1], verdict[2])
        state: Dict[str, Any] = {"state_dict": checkpoint.pop("state_dict")}
        for i, optimizer_state in enumerate(checkpoint.pop("optimizer_states", [])):
            state[f"optimizer_{i}"] = optimizer_state
        buf = io.BytesIO()
        torch.save(checkpoint, buf)
        state[METADATA_KEY] = buf.getvalue()  # bytes: one value, unpickled by torch.load below
        writer = FastPersistWriter(path / verdict[1], keep_last=1, step=step, **options)
        try:
            dcp.save(state, storage_writer=writer)
        finally:
            writer.close()

    def load_checkpoint(self, checkpoint_path: Any,
                        weights_only: Optional[bool] = None) -> Dict[str, Any]:
        path = Path(self.broadcast(os.path.abspath(os.fspath(checkpoint_path))))
        if not _is_ours(path):
            return super().load_checkpoint(checkpoint_path, weights_only=weights_only)  # type: ignore[no-any-return]
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                             get_model_state_dict,
                                                             get_optimizer_state_dict,
                                                             set_optimizer_state_dict)

        unsafe = weights_only is False  # None and True: torch's weights_only allow-list
        strict = self._attached_module().strict_loading
        module = self.model
        if module is None:
            raise RuntimeError("fastpersist: load_checkpoint before the strategy set up its model")
        module_state = {"state_dict": get_model_state_dict(module)}
        dcp.load(module_state, storage_reader=FastPersistReader(path, unsafe_objects=unsafe))
        module.load_state_dict(module_state["state_dict"], strict=strict)
        for i, optimizer in enumerate(self.optimizers):
            key = f"optimizer_{i}"
            optimizer_state = {key: get_optimizer_state_dict(module, optimizer)}
            dcp.load(optimizer_state, storage_reader=FastPersistReader(path, unsafe_objects=unsafe))
            set_optimizer_state_dict(module, optimizer, optim_state_dict=optimizer_state[key],
                                     options=StateDictOptions(cpu_offload=True))
        metadata: Dict[str, Any] = {METADATA_KEY: b""}
        dcp.load(metadata, storage_reader=FastPersistReader(path, unsafe_objects=unsafe))
        raw = metadata[METADATA_KEY]
        if not isinstance(raw, bytes):
            raise CheckpointCorruptError(f"fastpersist: {path}: {METADATA_KEY!r} is not bytes")
        return torch.load(io.BytesIO(raw), map_location="cpu",  # type: ignore[no-any-return]
                          weights_only=resolve_weights_only(weights_only))


    def _attached_module(self) -> Any:
        module = self.lightning_module
        if module is None:
            raise RuntimeError("fastpersist: the strategy has no LightningModule attached")
        return module


def _checked_options(options: Optional[Any], where: str) -> Dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(f"fastpersist: {where} must be a dict of FastPersistWriter settings, got "
                        f"{type(options).__name__}")
    for name in ("keep_last", "keep_every", "step", "metadata"):
        if name in options:
            raise TypeError(f"fastpersist: {name!r} in {where}: each checkpoint path holds one "
                            "checkpoint (ModelCheckpoint's save_top_k rotates the paths), and "
                            "the step is the trainer's")
    FastPersistWriter(os.path.join(os.sep, "settings-check", "tag"), **options)  # raises on bad ones
    return dict(options)


def _plan_save(path: Path, step: int) -> Tuple[str, ...]:
    """("tag", new tag) to save `path` as, or ("error", class name, message) when it is a
    file or another framework's folder: nothing is changed then."""
    kind = _core.classify_path(str(path)).kind.name
    if kind == "MISSING":
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return ("error", "OSError", f"fastpersist: cannot create {path}: {e}")
    elif path.is_file():
        return ("error", "NotADirectoryError",
                f"fastpersist: {path} is a file; a sharded checkpoint is a folder (remove the file "
                "or save elsewhere)")
    elif not _is_ours(path) and any(path.iterdir()):
        return ("error", "FileExistsError",
                f"fastpersist: {path} holds something that is not a fastpersist checkpoint "
                f"({_core.classify_path(str(path)).description}); it is left as it is")
    base = tag_for(step)
    tag, n = base, 1
    while (path / tag).exists():
        n += 1
        tag = f"{base}.{n}"
    return ("tag", tag)


def _is_ours(path: Path) -> bool:
    """A fastpersist checkpoint, or a root with a committed one (Lightning's own sharded folder
    is a directory without a manifest too, but has no committed fastpersist checkpoint)."""
    kind = _core.classify_path(str(path)).kind.name
    if kind == "CHECKPOINT":
        return True
    return kind == "ROOT" and _core.latest_checkpoint(str(path)) is not None


def _error(name: str, message: str) -> Exception:
    cls = {"NotADirectoryError": NotADirectoryError, "FileExistsError": FileExistsError}.get(
        name, OSError)
    return cls(message)


__all__ = ["FastPersistModelParallelStrategy", "METADATA_KEY"]
