# SPDX-License-Identifier: Apache-2.0
"""File objects that ``torch.save`` writes into.

``FastFileWriter`` streams the bytes through pinned double buffers and async O_DIRECT writes of
the C++ engine; the file appears at its path only when ``close()`` committed it (written to a
temporary next to it, fdatasync'ed, renamed, directory fsync'ed). ``MockFileWriter`` counts bytes
and writes nothing (pure serialization cost); ``PyFileWriter`` is plain buffered Python I/O.
Together they mirror DeepSpeed's ``deepspeed.io`` writers for side-by-side benchmarks.

None of them has ``fileno()``: torch then hands every byte to ``write()`` instead of writing to
a raw descriptor behind the writer's back.
"""

from __future__ import annotations

import math
import os
import time
from types import TracebackType
from typing import Any, Callable, Dict, Optional, Tuple, Type, Union

from . import _core
from ._engine_options import UINT_MAX, check_flag, check_uint, engine_options
from .config import configured_writer_buffer

PathLike = Union[str, "os.PathLike[str]"]

_MiB = 1 << 20


class WriteOnlyFile:
    """The surface ``torch.save`` asks of a write-only, non-seekable file object whose bytes are
    committed by the object itself (``close()``, ``persist()``), not by ``flush()``. No
    ``fileno()``: torch then hands every byte to ``write()``."""

    def flush(self) -> None:
        """Nothing to do: the writer commits the bytes itself. torch.save calls this at the end."""

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False


class FastFileWriter(WriteOnlyFile):
    """A write-only file object for ``torch.save`` backed by the fastpersist engine.

    ``with FastFileWriter(path) as f: torch.save(obj, f)`` commits the file when the block ends
    normally and leaves no file (and the old one untouched) when it raises.

    Every option left as None takes the value of the C++ ``FastFileWriterOptions`` (the engine
    knobs: ``EngineOptions`` and the environment), see docs/settings.md.

    Args:
        path: the file to create or replace.
        io_buffer_mb: pinned staging memory in MiB, both halves together. It stays this size
            whatever the checkpoint size.
        single_io_buffer: one staging half (fill, write, wait) instead of two that overlap.
        zero_copy: write block-aligned source memory straight to the file without copying.
        durable: fdatasync the file and fsync its directory at close.
        num_parallel_writers, writer_rank, stripe_mb: split persisting among N writers that
            each run the same serialization; writer r persists stripes k with k % N == r. The
            file appears, complete, when the last writer closed, and only if every writer saw
            the same bytes (across processes use torch's zip format, not the legacy one). If one
            writer aborts (or its ``with`` block raises), the others' ``close()`` raise
            ``OSError`` (errno ``ECANCELED``) and no file appears.
        commit_timeout: seconds a parallel writer's ``close()`` that does not complete the set
            waits for the others to commit the file (0, the C++ default: return as soon as this
            writer's stripes are durable, even if the set never completes). On success
            ``file_committed`` is True; when the time is up ``close()`` raises ``TimeoutError``
            naming the ranks that have not closed and those that serialized different bytes
            (this writer commits nothing). A writer that is still running may still complete the
            set later; when none is, the last one out removes the shared temporary files.
        backend, block_size, queue_depth, intra_op_parallelism, single_submit, overlap_events:
            engine knobs (see docs/settings.md).
        show_statistics: print the statistics line at close.
        progress: called after each ``write()`` with the bytes written so far (accepted by the
            writer: at most its staging buffer ahead of the storage; ``close()`` commits).
    """

    def __init__(
        self,
        path: PathLike,
        *,
        io_buffer_mb: Optional[float] = None,
        single_io_buffer: Optional[bool] = None,
        zero_copy: Optional[bool] = None,
        durable: Optional[bool] = None,
        num_parallel_writers: Optional[int] = None,
        writer_rank: Optional[int] = None,
        stripe_mb: Optional[float] = None,
        commit_timeout: Optional[float] = None,
        backend: Optional[str] = None,
        block_size: Optional[int] = None,
        queue_depth: Optional[int] = None,
        intra_op_parallelism: Optional[int] = None,
        single_submit: Optional[bool] = None,
        overlap_events: Optional[bool] = None,
        show_statistics: bool = False,
        progress: Optional[Callable[[int], None]] = None,
    ) -> None:
        self._path = os.fsdecode(os.fspath(path))
        eng, opts = writer_options(
            io_buffer_mb=io_buffer_mb, single_io_buffer=single_io_buffer, zero_copy=zero_copy,
            durable=durable, num_parallel_writers=num_parallel_writers, writer_rank=writer_rank,
            stripe_mb=stripe_mb, commit_timeout=commit_timeout, backend=backend,
            block_size=block_size, queue_depth=queue_depth,
            intra_op_parallelism=intra_op_parallelism, single_submit=single_submit,
            overlap_events=overlap_events)
        self._show_statistics = show_statistics
        self._progress = progress
        self._io_error: Optional[OSError] = None
        self._w = _core.FastFileWriter(self._path, eng, opts)

    # -- the file-object surface torch.save uses
    def write(self, data: Any) -> int:
        """Appends a bytes-like object; returns its length (always all of it)."""
        try:
            n = self._w.write(data)
        except OSError as e:
            if self._io_error is None:
                self._io_error = e
            raise
        if self._progress is not None:
            self._progress(int(self._w.bytes_written))
        return n

    def close(self) -> None:
        """Commits the file. Idempotent. Raises OSError if any write failed (no file is left).

        Parallel writers: raises OSError with errno ECANCELED when another writer aborted, and
        TimeoutError when ``commit_timeout`` passed before the set was committed; the writer is
        then closed and left no file at the path.
        """
        if self._w.closed:
            return
        self._w.close()
        if self._show_statistics:
            print(self._w.stats_line())

    def abort(self) -> None:
        """Discards everything written; the target path keeps whatever it had before."""
        self._w.abort()

    @property
    def closed(self) -> bool:
        return bool(self._w.closed)

    @property
    def committed(self) -> bool:
        """True once this writer's close() made the file appear (the last of parallel writers)."""
        return bool(self._w.committed)

    @property
    def file_committed(self) -> bool:
        """True once the file is at its path: committed by this close(), or by another parallel
        writer while this one waited (``commit_timeout``). False after a close() that returned
        without waiting for the other writers."""
        return bool(self._w.file_committed)

    @property
    def name(self) -> str:
        return self._path

    @property
    def bytes_written(self) -> int:
        return int(self._w.bytes_written)

    def stats(self) -> Dict[str, Any]:
        """Counters like DeepSpeed's (bytes, write/fill seconds, zero-copy and slow-path bytes)."""
        return dict(self._w.stats())

    def __enter__(self) -> "FastFileWriter":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if exc_type is None:
            self.close()
            return
        self.abort()
        root = self._io_error
        if root is not None and exc is not root and _raised_while_handling(exc, root):
            # torch.save's zip writer finishes the archive even after write() failed, and the
            # RuntimeError ("unexpected pos") it then raises would hide the I/O error (ENOSPC,
            # EIO) that caused it. Raise the cause; torch's error stays in its context.
            raise root

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<fastpersist.FastFileWriter {self._path!r} {state}, {self.bytes_written} bytes>"


def writer_options(
    *,
    io_buffer_mb: Optional[float] = None,
    single_io_buffer: Optional[bool] = None,
    zero_copy: Optional[bool] = None,
    durable: Optional[bool] = None,
    num_parallel_writers: Optional[int] = None,
    writer_rank: Optional[int] = None,
    stripe_mb: Optional[float] = None,
    commit_timeout: Optional[float] = None,
    backend: Optional[str] = None,
    block_size: Optional[int] = None,
    queue_depth: Optional[int] = None,
    intra_op_parallelism: Optional[int] = None,
    single_submit: Optional[bool] = None,
    overlap_events: Optional[bool] = None,
) -> Tuple[Any, Any]:
    """The ``(_core.EngineOptions, _core.FastFileWriterOptions)`` a :class:`FastFileWriter` with
    these arguments uses: C++'s defaults (and a tuned configuration's buffer size), with only
    what the caller set changed. TypeError / ValueError name a bad option."""
    opts = _core.FastFileWriterOptions()
    if io_buffer_mb is not None:
        opts.io_buffer_bytes = _buffer_bytes(io_buffer_mb)
    elif (configured := configured_writer_buffer()) is not None:  # a tuned configuration
        opts.io_buffer_bytes = configured
    if single_io_buffer is not None:
        opts.single_io_buffer = check_flag("single_io_buffer", single_io_buffer)
    if zero_copy is not None:
        opts.zero_copy = check_flag("zero_copy", zero_copy)
    if durable is not None:
        opts.durable = check_flag("durable", durable)
    if num_parallel_writers is not None:
        opts.num_writers = check_uint("num_parallel_writers", num_parallel_writers, UINT_MAX)
    if writer_rank is not None:
        opts.writer_rank = check_uint("writer_rank", writer_rank, UINT_MAX)
    if stripe_mb is not None:
        opts.stripe_bytes = int(stripe_mb * _MiB)
    if commit_timeout is not None:
        opts.commit_timeout_seconds = _commit_timeout_seconds(commit_timeout)
    eng = engine_options(backend=backend, block_size=block_size, queue_depth=queue_depth,
                         intra_op_parallelism=intra_op_parallelism,
                         single_submit=single_submit, overlap_events=overlap_events)
    return eng, opts


def _buffer_bytes(io_buffer_mb: Any) -> int:
    if isinstance(io_buffer_mb, bool) or not isinstance(io_buffer_mb, (int, float)) or \
            not io_buffer_mb > 0:
        raise ValueError(f"fastpersist: io_buffer_mb must be a number of MiB > 0, got "
                         f"{io_buffer_mb!r}")
    return int(io_buffer_mb * _MiB)


def _commit_timeout_seconds(value: float) -> float:
    """``commit_timeout`` as the C++ option; TypeError / ValueError for anything but a finite
    number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"fastpersist: commit_timeout must be a number of seconds or None, "
                        f"got {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"fastpersist: commit_timeout must be a finite number of seconds >= 0, "
                         f"got {value}")
    return seconds


def _raised_while_handling(exc: Optional[BaseException], cause: BaseException) -> bool:
    """True if `exc` was raised implicitly while `cause` was being handled (its __context__
    chain, not an explicit ``raise ... from``, leads to `cause`)."""
    seen = 0
    while exc is not None and seen < 16:
        if exc.__cause__ is not None or exc.__suppress_context__:
            return False
        exc = exc.__context__
        if exc is cause:
            return True
        seen += 1
    return False


class _CountingWriter:
    """What the two baseline writers share: byte/call/time counters and the context manager."""

    def __init__(self) -> None:
        self._bytes = 0
        self._calls = 0
        self._secs = 0.0

    def _sink(self, data: Any) -> int:
        raise NotImplementedError

    def write(self, data: Any) -> int:
        t = time.perf_counter()
        n = self._sink(data)
        self._bytes += n
        self._calls += 1
        self._secs += time.perf_counter() - t
        return n

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        raise NotImplementedError

    @property
    def bytes_written(self) -> int:
        return self._bytes

    def stats(self) -> Dict[str, Any]:
        return {"bytes": self._bytes, "write_calls": self._calls, "write_secs": self._secs}

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class MockFileWriter(_CountingWriter):
    """Counts what torch.save writes and writes nothing: the pure serialization cost."""

    def __init__(self, path: Optional[PathLike] = None) -> None:
        super().__init__()
        self._path = os.fsdecode(os.fspath(path)) if path is not None else ""
        self.closed = False

    def _sink(self, data: Any) -> int:
        return memoryview(data).nbytes

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class PyFileWriter(_CountingWriter):
    """Plain buffered Python file writes (``open(path, "wb")``), for comparison.

    ``durable=True`` adds an fsync at close, which plain ``torch.save`` never does.
    """

    def __init__(self, path: PathLike, *, durable: bool = False) -> None:
        super().__init__()
        self._f = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._durable = durable

    def _sink(self, data: Any) -> int:
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def close(self) -> None:
        if self._f.closed:
            return
        self._f.flush()
        if self._durable:
            os.fsync(self._f.fileno())
        self._f.close()
