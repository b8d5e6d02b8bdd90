# SPDX-License-Identifier: Apache-2.0
"""One DeepSpeed checkpoint file: pickled by ``torch.save`` into a ``_core.DeferredFileWriter``
(the tensors' storages are lent to it, not copied), persisted by C++ (durable, with the XXH3-64
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
from typing import Any, Iterator, List, Optional, Tuple, cast

import torch

from .. import _core
from ..errors import CheckpointCorruptError
from .._seekable import SeekableReader
from ..import_deepspeed import STAND_INS
from ..serialization import _fast_save_settings
from ..writer import WriteOnlyFile
from .settings import EngineSettings


class CapturedFile(WriteOnlyFile):
    """The file object torch.save writes into: write() records, persist() writes the file."""

    def __init__(self, directory: str, name: str, settings: EngineSettings,
                 rank: Optional[int]) -> None:
        self._w = _core.DeferredFileWriter(directory, name, settings.engine, settings.writer,
                                           settings.checksums, rank)
        self.name = name

    def lend(self, state: Any) -> None:
        """Lends the host storages of every tensor in `state` (the caller keeps `state` alive
        and unchanged until persist() returns)."""
        seen = set()
        for t in _tensors(state):
            if t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            self._w.borrow(torch.empty(0, dtype=torch.uint8).set_(storage))

    def write(self, data: Any) -> int:
        return int(self._w.write(data))

    def persist(self) -> Any:
        """Writes the file (GIL released) and returns its ``_core.ManifestFile`` record."""
        return self._w.persist()

    @property
    def writer(self) -> Any:
        """The ``_core.DeferredFileWriter`` (for ``ShardWriter.write_split``)."""
        return self._w

    def abort(self) -> None:
        self._w.abort()

    def stats(self) -> Any:
        return dict(self._w.stats())


def capture(state: Any, directory: str, name: str, settings: EngineSettings,
            rank: Optional[int]) -> CapturedFile:
    """torch.save(state) into a new CapturedFile (4 KiB-aligned storages, no CRC: the manifest's
    checksum covers the file)."""
    f = CapturedFile(directory, name, settings, rank)
    try:
        f.lend(state)
        with _fast_save_settings(align=True, crc32=False):
            torch.save(state, cast(Any, f))  # a file object without fileno()
    except BaseException:
        f.abort()
        raise
    return f


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    """The tensors of a state (dicts, lists, tuples, and objects' __dict__, as torch.save walks
    them, minus what no real state holds). Storages reached only in other ways are copied."""
    stack: List[Any] = [obj]
    seen = set()
    while stack:
        o = stack.pop()
        if isinstance(o, torch.Tensor):
            yield o
            continue
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif hasattr(o, "__dict__") and not isinstance(o, type):
            stack.extend(vars(o).values())


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
