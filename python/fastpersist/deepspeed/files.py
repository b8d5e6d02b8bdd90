# SPDX-License-Identifier: Apache-2.0
"""One DeepSpeed checkpoint file: pickled by ``torch.save`` into a ``_core.DeferredFileWriter``
(_captured_file.py: the tensors' storages are lent to it, not copied), persisted by C++ (durable, with the XXH3-64
of the whole file), and loaded by ``torch.load`` while C++ checks it against its manifest record.

Loads read through the page cache, as DeepSpeed's own engine does: the loaded tensors need memory
of their own anyway (DeepSpeed's optimizer adopts them as its state), and a whole-file buffer
behind zero-copy tensors would stay alive, with the parts nobody adopted, for the whole run."""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import threading
from typing import Any, List, Optional, Tuple

import torch

from .. import _core
from ..errors import CheckpointCorruptError
from .._seekable import SeekableReader
from ..import_deepspeed import STAND_INS
from .._captured_file import CapturedFile, capture_into
from .settings import EngineSettings


def capture(state: Any, directory: str, name: str, settings: EngineSettings,
            rank: Optional[int]) -> CapturedFile:
    """torch.save(state) into a new CapturedFile that lends every tensor's storage."""
    f = CapturedFile(directory, name, settings.engine, settings.writer,
                     checksums=settings.checksums, rank=rank)
    return capture_into(f, state)


# ----------------------------------------------------------------------------- loading
def deepspeed_safe_globals() -> List[Any]:
    """The real DeepSpeed classes behind the globals its checkpoint files pickle (the names
    fastpersist.import_deepspeed stands in for: loss scalers, the ZeRO stage enum, fragment
    addresses), allowed in weights_only loads of the engine's own files."""
    found: List[Any] = []
    for _, dotted in STAND_INS:
        module, _, name = dotted.rpartition(".")
        with contextlib.suppress(ImportError):
            cls = getattr(importlib.import_module(module), name, None)
            if cls is not None:
                found.append(cls)
    return found


def check(path: str, record: Any, checksums: bool) -> None:
    """Checks the file against its manifest record (CheckpointCorruptError naming it)."""
    _core.check_object_file(path, record, checksums)


def load_file(path: str, record: Optional[Any], checksums: bool, map_location: Any,
              weights_only: bool) -> Any:
    """``torch.load(path)``, with the file checked against its manifest `record` (when there is
    one) by a C++ thread at the same time: both read through the page cache, so the file comes
    from the disk once, and the load holds no second copy of it. The state is returned only
    once the check passed; a file that fails it raises CheckpointCorruptError, also when the
    damage made torch.load fail first."""
    failure: List[BaseException] = []
    checker: Optional[threading.Thread] = None
    if record is not None:
        def run() -> None:
            try:
                check(path, record, checksums)
            except BaseException as e:  # noqa: BLE001 (raised by the loading thread)
                failure.append(e)

        checker = threading.Thread(target=run, name="fastpersist-check", daemon=True)
        checker.start()
    try:
        state = _torch_load(path, map_location, weights_only)
    except BaseException:
        if checker is not None:
            checker.join()
            if failure:
                raise failure[0] from None
        raise
    if checker is not None:
        checker.join()
        if failure:
            raise failure[0]
    return state


def load_split_file(reader: Any, path: str, checksums: bool, map_location: Any,
                    weights_only: bool) -> Tuple[Any, int]:
    """``torch.load`` of a split file (a compressed or incremental tag's) through a file object
    whose reads C++ serves from the skeleton and the pieces (each piece checked with
    `checksums`): torch reads each storage record in one ``readinto`` of the storage's own
    memory, which C++ fills straight, so the file is never held in memory twice. Returns the
    state and the file's size."""
    split = reader.open_split_file(os.path.basename(path))
    with _SplitFileObject(split, checksums) as f:
        try:
            return _torch_load(path, map_location, weights_only, f), int(split.size)
        except BaseException:
            if f.failure is not None:
                raise f.failure from None  # what C++ found (damage names the file and piece)
            raise


class _SplitFileObject(SeekableReader):
    """A split file (``_core.SplitFile``) as a read-only, seekable file object.

    torch's reader calls ``readinto`` from C++ and, when it fails, goes on to ``read`` with the
    error still set, which loses it. So ``readinto`` keeps a failure in ``failure`` and returns
    0, and ``read`` raises it: torch then raises it cleanly."""

    def __init__(self, split: Any, verify: bool) -> None:
        super().__init__()
        self._split = split
        self._verify = verify
        self.failure: Optional[BaseException] = None

    def _size(self) -> int:
        return int(self._split.size)

    def readinto(self, buffer: Any) -> int:
        if self.failure is not None:
            return 0
        try:
            n = int(self._split.read_into(self._pos, buffer, self._verify))
        except Exception as e:  # noqa: BLE001 (raised by read(), see the class comment)
            self.failure = e
            return 0
        self._pos += n
        return n

    def read(self, size: int = -1) -> bytes:
        if self.failure is not None:
            raise self.failure
        data = super().read(size)
        if self.failure is not None:
            raise self.failure
        return b"" if data is None else data


def _torch_load(path: str, map_location: Any, weights_only: bool, source: Any = None) -> Any:
    try:
        with torch.serialization.safe_globals(deepspeed_safe_globals()):
            return torch.load(path if source is None else source, map_location=map_location,
                              weights_only=weights_only)
    except pickle.UnpicklingError as e:
        if not weights_only:
            raise CheckpointCorruptError(f"fastpersist: {path} does not unpickle: {e}") from None
        raise pickle.UnpicklingError(
            f"fastpersist: {path} was refused by torch.load(weights_only=True): {e}. Load only "
            "files you trust with weights_only=False (install(..., weights_only=False)).") from None
