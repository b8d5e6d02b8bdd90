# SPDX-License-Identifier: Apache-2.0
"""A ``torch.save`` recorded now and written later: the file object over ``_core.DeferredFileWriter``.

``torch.save`` pickles a state into a :class:`CapturedFile` on the caller's thread. The storages
of the tensors the caller lends are recorded by address, not copied; everything else (pickle
opcodes, zip headers, small tensors) is copied as it arrives. ``snapshot()`` copies the lent
storages into a pinned buffer from a pool, after which the caller may change them again;
``persist()`` writes the file (O_DIRECT, durable, atomically replacing or refusing an existing
one as asked). Both release the GIL. Used by the DeepSpeed engine (deepspeed/files.py) and by
:class:`fastpersist.AsyncFileSaver`.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, cast

import torch

from . import _core
from .serialization import _fast_save_settings
from .writer import WriteOnlyFile


class CapturedFile(WriteOnlyFile):
    """The file object torch.save writes into: write() records, persist() writes the file."""

    def __init__(self, directory: str, name: str, engine: Any, writer: Any, *, checksums: bool,
                 rank: Optional[int] = None, replace_existing: bool = False) -> None:
        self._w = _core.DeferredFileWriter(directory, name, engine, writer, checksums, rank,
                                           replace_existing=replace_existing)
        self.name = name

    def lend(self, state: Any, min_bytes: int = 0) -> None:
        """Lends the host storages of at least `min_bytes` of every tensor in `state` (the
        caller keeps them alive and unchanged until snapshot() or persist() returns); smaller
        ones are copied as torch.save writes them."""
        seen = set()
        for t in tensors_of(state):
            if t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            if storage.nbytes() == 0 or storage.nbytes() < min_bytes or \
                    storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            self._w.borrow(torch.empty(0, dtype=torch.uint8).set_(storage))

    def write(self, data: Any) -> int:
        return int(self._w.write(data))

    def snapshot(self, pool: Any) -> None:
        """Copies the lent storages into a buffer from `pool` (a ``_core.PinnedBufferPool``)."""
        self._w.snapshot(pool)

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


def capture_into(f: CapturedFile, state: Any, lend_min_bytes: int = 0) -> CapturedFile:
    """torch.save(state) into `f` (4 KiB-aligned storages, no CRC: a manifest's checksum covers
    the file, and torch.load never checks torch's own); `f` is aborted if that raises."""
    try:
        f.lend(state, lend_min_bytes)
        with _fast_save_settings(align=True, crc32=False):
            torch.save(state, cast(Any, f))  # a file object without fileno()
    except BaseException:
        f.abort()
        raise
    return f


def tensors_of(obj: Any) -> Iterator[torch.Tensor]:
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
