# SPDX-License-Identifier: Apache-2.0
"""Lightning's ``CheckpointIO`` over fastpersist: ``Trainer(plugins=[FastPersistCheckpointIO()])``.

Every ``.ckpt`` stays a file that ``torch.load`` and Lightning read, but it is written by the
fastpersist engine (O_DIRECT, fdatasync, directory fsync) into a temporary next to it and renamed
into place: the path holds the previous file or the new one, whole, even after a crash.

With ``async_save=True`` a save returns once the checkpoint is pickled; its tensors are copied
into pinned memory in the background (:class:`fastpersist.AsyncFileSaver`), and every
optimizer's ``step()`` waits for that copy, not for the storage. Lightning's own
``AsyncCheckpointIO`` instead clones every tensor on the training thread first.

Works with ``lightning`` 2.x (``lightning.pytorch.Trainer`` and ``lightning.fabric.Fabric``).
Sharded strategies do not use ``CheckpointIO``: ``FastPersistModelParallelStrategy``
(lightning_sharded.py) saves and loads their checkpoints through fastpersist's DCP plug-in.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict, Optional

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO  # type: ignore[import-not-found, import-untyped, unused-ignore]

from ._engine_options import check_flag
from .async_files import AsyncFileSaver, writer_options_checked
from .lightning_sharded import FastPersistModelParallelStrategy
from .serialization import load, save
from .writer import writer_options

# What a save may be told, here and in storage_options: how the file is written, and whether
# the save returns before it is.
_SAVE_OPTIONS = ("async_save", *sorted(writer_options.__kwdefaults__ or {}))


class FastPersistCheckpointIO(CheckpointIO):  # type: ignore[misc, unused-ignore]
    """Saves and loads Lightning's ``.ckpt`` files through fastpersist.

    Args:
        async_save: ``save_checkpoint`` returns before the file is written [False].
        max_pending: async saves not yet written; a further save waits for the oldest [2].
        **options: how files are written, as for :class:`fastpersist.FastFileWriter`:
            ``durable`` [True], ``io_buffer_mb``, ``single_io_buffer``, ``backend``,
            ``block_size``, ``queue_depth``, ``intra_op_parallelism``, ...

    ``storage_options`` of one save (``trainer.save_checkpoint(path, storage_options=...)``)
    is a dict of the same options (``async_save`` included) for that save only.
    """

    def __init__(self, *, async_save: bool = False, max_pending: int = 2,
                 **options: Any) -> None:
        super().__init__()
        _check_names(options, "FastPersistCheckpointIO()")
        self._async_save = check_flag("async_save", async_save)
        self._options = dict(options)
        writer_options_checked(self._options)  # a bad value raises here, before any save
        self._max_pending = max_pending
        self._saver: Optional[AsyncFileSaver] = None
        if async_save:
            self._async_saver()  # checks max_pending now

    # ------------------------------------------------------------------ CheckpointIO
    def save_checkpoint(self, checkpoint: Dict[str, Any], path: Any,
                        storage_options: Optional[Any] = None) -> None:
        options = self._save_options(storage_options)
        async_save = check_flag("async_save", options.pop("async_save", self._async_save))
        writer_options_checked(options)
        target = _local_file(path, "save to")
        directory = os.path.dirname(target)
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise NotADirectoryError(f"fastpersist: cannot save {target}: {directory} is a file, "
                                     "not a directory")
        os.makedirs(directory, exist_ok=True)
        if async_save:
            self._async_saver().save(checkpoint, target, **options)
            return
        if self._saver is not None:
            self._saver.wait(target)  # an async save to the same path lands first
        save(checkpoint, target, **options)

    def load_checkpoint(self, path: Any, map_location: Optional[Any] = "cpu",
                        weights_only: Optional[bool] = None) -> Any:
        target = _local_file(path, "load")
        if self._saver is not None:
            self._saver.wait(target)
        if not os.path.exists(target):
            raise FileNotFoundError(f"Checkpoint file not found: {target}")
        return load(target, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: Any) -> None:
        target = _local_file(path, "remove")
        if self._saver is not None:
            self._saver.wait(target)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        elif os.path.lexists(target):
            os.unlink(target)
        else:
            return
        if self._options.get("durable", True):
            _fsync_directory(os.path.dirname(target))

    def teardown(self) -> None:
        """Waits for the async saves in flight (raising the first that failed) and frees
        their snapshot memory."""
        saver, self._saver = self._saver, None
        if saver is not None:
            saver.close()

    # ------------------------------------------------------------------ helpers
    def wait(self) -> None:
        """Waits for every async save so far; raises the first that failed."""
        if self._saver is not None:
            self._saver.wait()

    def _async_saver(self) -> AsyncFileSaver:
        if self._saver is None:
            saver = AsyncFileSaver(max_pending=self._max_pending, **self._options)
            saver.guard_optimizer_steps()
            self._saver = saver
        return self._saver

    def _save_options(self, storage_options: Optional[Any]) -> Dict[str, Any]:
        if storage_options is None:
            return dict(self._options)
        if not isinstance(storage_options, dict):
            raise TypeError("fastpersist: storage_options must be a dict of FastPersistCheckpointIO "
                            f"save options, got {type(storage_options).__name__}")
        _check_names(storage_options, "storage_options")
        return {**self._options, **storage_options}


def _check_names(options: Dict[str, Any], where: str) -> None:
    known = _SAVE_OPTIONS
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"fastpersist: unknown option(s) {', '.join(map(repr, unknown))} in "
                        f"{where}; known: {', '.join(sorted(known))}")


def _local_file(path: Any, what: str) -> str:
    target = os.fsdecode(os.fspath(path))
    if "://" in target:
        raise ValueError(f"fastpersist: cannot {what} {target}: FastPersistCheckpointIO writes "
                         "and reads local (or mounted) files, not URLs")
    target = os.path.abspath(target)
    if what != "remove" and os.path.isdir(target):
        raise IsADirectoryError(f"fastpersist: cannot {what} {target}: it is a directory (a "
                                "sharded checkpoint, or another framework's); "
                                "FastPersistCheckpointIO handles single .ckpt files")
    return target


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["FastPersistCheckpointIO", "FastPersistModelParallelStrategy"]
