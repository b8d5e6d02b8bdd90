# SPDX-License-Identifier: Apache-2.0
"""``fastpersist.save`` / ``fastpersist.load``: ``torch.save`` / ``torch.load`` at storage speed.

``save`` runs the stock ``torch.save`` into a :class:`~fastpersist.FastFileWriter` (no patched
torch). Where the installed torch supports it, storages are aligned to 4096 bytes in the file
(so their bytes can go straight to O_DIRECT) and the CRC32 pass is skipped (``torch.load`` never
checks it). The result is an ordinary checkpoint that plain ``torch.load`` reads.

``load`` reads the whole file with parallel O_DIRECT requests into one aligned buffer and lets
torch's own unpickler build the objects with every tensor's storage a view of that buffer: the
bytes are read once and never copied again. Files in the legacy (non-zip) format, or a torch
without the internal entry point, are loaded from the same buffer with one copy.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from typing import Any, Callable, Dict, Iterator, Optional, Union

from . import _core
from .writer import FastFileWriter, PathLike, engine_options

MapLocation = Union[None, str, Any, Dict[str, str], Callable[..., Any]]

_STORAGE_ALIGNMENT = 4096
_ZIP_MAGIC = b"PK\x03\x04"


def _torch() -> Any:
    import torch  # deferred: fastpersist works without torch for AioHandle users

    return torch


@contextlib.contextmanager
def _fast_save_settings(align: bool, crc32: bool, pinned_d2h: bool = True) -> Iterator[None]:
    """Temporarily sets torch's serialization config, restored on exit. torch keeps these
    overrides per thread (torch.utils._config_module), so saves in several threads at once
    do not see each other's settings."""
    torch = _torch()
    config: Any
    try:
        from torch.utils.serialization import config  # torch >= 2.7
    except ImportError:
        config = None
    saved: Dict[str, Any] = {}
    try:
        if config is not None:
            if align and hasattr(config.save, "storage_alignment"):
                saved["storage_alignment"] = config.save.storage_alignment
                config.save.storage_alignment = _STORAGE_ALIGNMENT
            if hasattr(config.save, "compute_crc32"):
                saved["compute_crc32"] = config.save.compute_crc32
                config.save.compute_crc32 = crc32
            if pinned_d2h and hasattr(config.save, "use_pinned_memory_for_d2h"):
                saved["use_pinned_memory_for_d2h"] = config.save.use_pinned_memory_for_d2h
                config.save.use_pinned_memory_for_d2h = True
        elif hasattr(torch.serialization, "set_crc32_options"):  # torch 2.6
            saved["crc32_fn"] = torch.serialization.get_crc32_options()
            torch.serialization.set_crc32_options(crc32)
        yield
    finally:
        if config is not None:
            for key, value in saved.items():
                setattr(config.save, key, value)
        elif "crc32_fn" in saved:
            torch.serialization.set_crc32_options(saved["crc32_fn"])


def save(
    obj: Any,
    path: PathLike,
    *,
    align_storages: bool = True,
    compute_crc32: bool = False,
    use_legacy_format: bool = False,
    pickle_protocol: Optional[int] = None,
    pinned_d2h: bool = True,
    **writer_options: Any,
) -> Dict[str, Any]:
    """Saves ``obj`` like ``torch.save(obj, path)``, durably and at storage speed.

    The file appears at ``path`` only once it is complete and synced; an exception inside
    ``torch.save`` or an I/O error leaves the previous file (if any) untouched.

    Args:
        align_storages: 4096-byte storage alignment in the file (torch >= 2.7).
        compute_crc32: keep torch's CRC32 pass (off by default: torch.load never checks it).
        use_legacy_format: ``_use_new_zipfile_serialization=False``.
        pinned_d2h: GPU storages are copied to the host through page-locked memory (torch's
            ``use_pinned_memory_for_d2h``, torch >= 2.7; in the zip format). That copy is a DMA
            at full PCIe speed instead of a staged pageable one. When torch's pinned block is
            aligned for O_DIRECT (its default allocator, cudaHostAlloc, gives page-aligned
            blocks), the storage, at a 4096-aligned file offset, is written straight to the
            file (``zero_copy_bytes`` in the statistics) without passing through the writer's
            buffer. CPU tensors are not affected.
        writer_options: passed to :class:`FastFileWriter` (io_buffer_mb, single_io_buffer,
            durable, backend, block_size, queue_depth, intra_op_parallelism, progress, ...; for
            parallel writers num_parallel_writers, writer_rank, stripe_mb and commit_timeout).

    Returns:
        The writer's statistics (bytes, seconds, zero-copy bytes, ...), plus ``committed``
        (this call renamed the file into place: always, unless parallel writers) and
        ``file_committed`` (the file is at ``path``: for a parallel writer, true when its close
        completed the set or, with ``commit_timeout``, saw another writer complete it).
    """
    torch = _torch()
    # None: torch.save's own default protocol.
    protocol = {} if pickle_protocol is None else {"pickle_protocol": pickle_protocol}
    with _fast_save_settings(align_storages and not use_legacy_format, compute_crc32, pinned_d2h):
        with FastFileWriter(path, **writer_options) as f:
            torch.save(obj, f, _use_new_zipfile_serialization=not use_legacy_format, **protocol)
    return {**f.stats(), "committed": f.committed, "file_committed": f.file_committed}


class _MemoryFile:
    """A read-only, seekable file over a memoryview (what torch's zip reader needs)."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._view) if n is None or n < 0 else min(len(self._view), self._pos + n)
        out = self._view[self._pos:end].tobytes()
        self._pos = end
        return out

    def readinto(self, b: Any) -> int:
        dst = memoryview(b).cast("B")
        n = min(len(dst), len(self._view) - self._pos)
        dst[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n

    def readline(self, limit: int = -1) -> bytes:
        end = len(self._view) if limit is None or limit < 0 else min(len(self._view), self._pos + limit)
        chunk = self._view[self._pos:end].tobytes()
        newline = chunk.find(b"\n")
        if newline >= 0:
            chunk = chunk[:newline + 1]
        self._pos += len(chunk)
        return chunk

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True


def read_file(path: PathLike, *, progress: Optional[Callable[[int, int], None]] = None,
              **engine_kwargs: Any) -> Any:
    """The whole file in one page-aligned buffer (buffer protocol), read with parallel O_DIRECT.

    With `progress`, the file is read in chunks of 64 MiB (each one parallel O_DIRECT request of
    the same engine, straight into the buffer) and ``progress(bytes_read, file_size)`` is called
    before the first and after each chunk.
    """
    opts = engine_options(**engine_kwargs)
    name = os.fsdecode(os.fspath(path))
    return _core.read_file(name, opts, progress)


def resolve_weights_only(weights_only: Optional[bool]) -> bool:
    """``weights_only=None`` as torch.load (torch >= 2.6) reads it: True, unless the environment
    says otherwise (TORCH_FORCE_WEIGHTS_ONLY_LOAD wins over TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD)."""
    if weights_only is not None:
        if not isinstance(weights_only, bool):
            raise TypeError(f"fastpersist: weights_only must be True, False or None, got "
                            f"{type(weights_only).__name__}")
        return weights_only
    truthy = ("1", "y", "yes", "true")
    if os.getenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in truthy:
        return True
    return os.getenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() not in truthy


def load(
    path: PathLike,
    map_location: MapLocation = None,
    *,
    weights_only: Optional[bool] = True,
    backend: Optional[str] = None,
    block_size: Optional[int] = None,
    queue_depth: Optional[int] = None,
    intra_op_parallelism: Optional[int] = None,
    **pickle_load_args: Any,
) -> Any:
    """Loads a ``torch.save`` file like ``torch.load(path, map_location, weights_only=...)``
    (``weights_only=None``: torch's default, see :func:`resolve_weights_only`).

    The file is read once with the engine; tensors of a zip-format checkpoint are views of that
    read buffer (no second copy) unless ``map_location`` moves them elsewhere.
    """
    torch = _torch()
    weights_only = resolve_weights_only(weights_only)
    buf = read_file(path, backend=backend, block_size=block_size, queue_depth=queue_depth,
                    intra_op_parallelism=intra_op_parallelism)
    view = memoryview(buf)
    if len(view) == 0:
        raise EOFError(f"fastpersist: {os.fspath(path)!r} is empty, not a checkpoint")
    is_zip = view[:4].tobytes() == _ZIP_MAGIC
    if not is_zip and not _starts_with_legacy_magic(view, torch):
        raise pickle.UnpicklingError(
            f"fastpersist: {os.fspath(path)!r} is not a torch checkpoint: it is neither a zip "
            "archive nor a legacy torch.save file")
    if not is_zip or not _can_load_zero_copy(torch):
        return torch.load(_MemoryFile(view), map_location=map_location, weights_only=weights_only,
                          **pickle_load_args)
    try:
        return load_zip_buffer(buf, map_location, weights_only=weights_only, **pickle_load_args)
    except pickle.UnpicklingError as e:
        if not weights_only:
            raise
        raise pickle.UnpicklingError(
            f"fastpersist.load with weights_only=True refused {os.fspath(path)!r}: {e}. "
            "Load only files you trust with weights_only=False.") from None


def is_zip_checkpoint(path: PathLike) -> bool:
    """True when the file starts like torch's zip format (what load_zip_buffer takes)."""
    with open(path, "rb") as f:
        return f.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC


def can_load_zip_buffer() -> bool:
    """True when the installed torch can build tensors as views of one buffer."""
    return _can_load_zero_copy(_torch())


def load_zip_buffer(buf: Any, map_location: MapLocation = None, *, weights_only: bool = True,
                    **pickle_load_args: Any) -> Any:
    """Unpickles a zip-format ``torch.save`` file held in `buf` (a writable buffer) with every
    tensor's storage a slice of `buf`: no copy. Needs :func:`can_load_zip_buffer`. Errors are
    torch's own (``pickle.UnpicklingError`` when weights_only refuses a global), and
    pickle_bounds.PickleRefusedError (an UnpicklingError) for a pickle that asks for more memory
    than the file holds."""
    torch = _torch()
    from torch.serialization import _load

    pickle_load_args.setdefault("encoding", "utf-8")
    # Every storage becomes a slice of this storage, which keeps `buf` alive through the tensors.
    overall = torch.frombuffer(buf, dtype=torch.uint8).untyped_storage()
    zip_file = torch._C.PyTorchFileReader(_MemoryFile(memoryview(buf)))
    if weights_only:
        from torch import _weights_only_unpickler

        from .pickle_bounds import check_pickle

        # No bytearray(N) beyond the file, nothing that does not parse (pickle_bounds.py).
        check_pickle(zip_file.get_record("data.pkl"), len(memoryview(buf).cast("B")),
                     "the torch file's pickle")

        return _load(zip_file, map_location, _weights_only_unpickler, overall_storage=overall,
                     **pickle_load_args)
    return _load(zip_file, map_location, pickle, overall_storage=overall, **pickle_load_args)


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Reads plain values only: without globals no pickle can run code, so any file is safe."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError("globals are not allowed here")


def _starts_with_legacy_magic(view: memoryview, torch: Any) -> bool:
    """A legacy torch.save file starts with a pickle of torch's magic number (any protocol).
    Checked first so that other files fail with a clear error, not torch's IndexError."""
    try:
        magic = _NoGlobalsUnpickler(_MemoryFile(view[:64])).load()
    except Exception:  # noqa: BLE001 - any failure means "not that pickle"
        return False
    return isinstance(magic, int) and magic == torch.serialization.MAGIC_NUMBER


def _can_load_zero_copy(torch: Any) -> bool:
    import inspect

    try:
        from torch.serialization import _load
    except ImportError:
        return False
    return "overall_storage" in inspect.signature(_load).parameters and hasattr(
        torch._C, "PyTorchFileReader")
