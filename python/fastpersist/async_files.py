# SPDX-License-Identifier: Apache-2.0
"""``AsyncFileSaver``: ``torch.save`` files written while training goes on.

A save has three stages, each on its own thread:

1. **pickle** (the caller's thread): ``torch.save`` runs into a ``_core.DeferredFileWriter``
   (_captured_file.py). Storages of at least ``lend_min_bytes`` are recorded by address, not
   copied; smaller ones (BatchNorm statistics and counters, which a forward pass changes in
   place) are copied now. ``save()`` then returns.
2. **snapshot** (one background thread, saves in order): C++ copies the lent storages into a
   pinned buffer from the saver's pool (kept and reused by later saves). From then on the
   trainer may change its tensors again. :meth:`AsyncFileSaver.wait_snapshots` waits for this
   stage; :meth:`AsyncFileSaver.guard_optimizer_steps` makes every optimizer's ``step()`` call
   it, so that no step changes a weight that is still being copied.
3. **write** (a second background thread, in order): C++ writes the file next to its target
   (O_DIRECT, fdatasync) and renames it over the target, so the path holds either the previous
   file or the new one, whole.

At most ``max_pending`` saves are between stages 1 and 3: ``save()`` waits for the oldest
beyond that, so snapshot memory stays within ``max_pending`` checkpoints. A failed save raises
its error from the next ``save()``, ``wait()`` or ``close()``. Interpreter exit finishes the
writes in flight (the bytes are in the snapshot already).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional

from . import _core
from ._captured_file import CapturedFile, capture_into
from ._engine_options import check_uint
from .writer import PathLike, writer_options

# Storages below this are copied when save() is called: a forward pass updates some of them in
# place (BatchNorm's running statistics and batch counter), and the optimizer guard only holds
# back optimizer.step(). Weights and optimizer moments, which only step() changes, are larger.
DEFAULT_LEND_MIN_BYTES = 1 << 20
# Released snapshot buffers are kept for the next saves up to this many bytes (all of them:
# pinning memory is slow, and a run saves the same sizes again and again).
_KEEP_SNAPSHOT_BYTES = 1 << 62


class FileSaveHandle:
    """One save of an :class:`AsyncFileSaver`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._snapshot = threading.Event()
        self._written: "Future[Dict[str, Any]]" = Future()
        self._reported = False

    def snapshot_done(self) -> bool:
        """True once the state's tensors may change again (or the save failed)."""
        return self._snapshot.is_set()

    def wait_snapshot(self) -> None:
        self._snapshot.wait()

    def done(self) -> bool:
        """True once the file is written (or the save failed)."""
        return self._written.done()

    def wait(self) -> Dict[str, Any]:
        """Waits for the file and returns the writer's statistics; raises what failed."""
        self._reported = True
        return self._written.result()

    def __repr__(self) -> str:
        state = "done" if self.done() else ("writing" if self.snapshot_done() else "snapshotting")
        return f"<fastpersist.FileSaveHandle {self.path!r} {state}>"


class AsyncFileSaver:
    """Saves objects like ``torch.save(obj, path)``, in the background (see the module's doc).

    Args:
        max_pending: saves between ``save()`` and their file being written [2].
        lend_min_bytes: storages of at least this many bytes are snapshotted in the background;
            smaller ones are copied by ``save()`` [1 MiB].
        writer_options: how the files are written, as for :class:`fastpersist.FastFileWriter`
            (durable, io_buffer_mb, single_io_buffer, backend, block_size, queue_depth,
            intra_op_parallelism, ...).
    """

    def __init__(self, *, max_pending: int = 2, lend_min_bytes: int = DEFAULT_LEND_MIN_BYTES,
                 **writer_options: Any) -> None:
        self._max_pending = check_uint("max_pending", max_pending, 1 << 16)
        if self._max_pending < 1:
            raise ValueError("fastpersist: max_pending must be at least 1, got 0")
        self._lend_min_bytes = check_uint("lend_min_bytes", lend_min_bytes, 1 << 62)
        self._writer_options = dict(writer_options)
        writer_options_checked(self._writer_options)
        self._pool: Any = _core.PinnedBufferPool(_KEEP_SNAPSHOT_BYTES)
        self._snapshots = ThreadPoolExecutor(1, thread_name_prefix="fastpersist-snapshot")
        self._writes = ThreadPoolExecutor(1, thread_name_prefix="fastpersist-write")
        self._lock = threading.Lock()
        self._in_flight: List[FileSaveHandle] = []
        self._failed: List[BaseException] = []
        self._guards: List[Any] = []
        self._closed = False

    # ------------------------------------------------------------------ saving
    def save(self, obj: Any, path: PathLike, **writer_options: Any) -> FileSaveHandle:
        """Pickles `obj` now and writes it to `path` in the background. `writer_options`
        override the saver's for this file. Raises the error of an earlier save that failed."""
        if self._closed:
            raise ValueError("fastpersist: the AsyncFileSaver is closed")
        self._raise_failed()
        options = {**self._writer_options, **writer_options}
        engine, writer = writer_options_checked(options)
        target = os.path.abspath(os.fsdecode(os.fspath(path)))
        directory, name = os.path.split(target)
        if os.path.isdir(target):
            raise IsADirectoryError(f"fastpersist: {target} is a directory; a torch.save file "
                                    "needs a file path")
        while True:  # snapshot memory stays within max_pending checkpoints
            with self._lock:
                if len(self._in_flight) < self._max_pending:
                    break
                oldest = self._in_flight[0]
            oldest._written.exception()  # waits; its error is kept for _raise_failed
            self._reap()
        self._raise_failed()
        f = CapturedFile(directory, name, engine, writer, checksums=False, replace_existing=True)
        capture_into(f, obj, self._lend_min_bytes)
        handle = FileSaveHandle(target)
        with self._lock:
            self._in_flight.append(handle)
        self._snapshots.submit(self._snapshot_then_write, f, handle, obj)
        return handle

    def _snapshot_then_write(self, f: CapturedFile, handle: FileSaveHandle, obj: Any) -> None:
        try:
            f.snapshot(self._pool)
        except BaseException as e:  # noqa: BLE001 (the handle reports it)
            f.abort()
            handle._written.set_exception(e)
            return
        finally:
            del obj  # the state is not needed once its storages are copied
            handle._snapshot.set()
        try:
            self._writes.submit(self._write, f, handle)
        except RuntimeError:  # the interpreter is exiting: write it here, before it does
            self._write(f, handle)

    @staticmethod
    def _write(f: CapturedFile, handle: FileSaveHandle) -> None:
        try:
            f.persist()
            stats = f.stats()
        except BaseException as e:  # noqa: BLE001
            f.abort()
            handle._written.set_exception(e)
            return
        handle._written.set_result(stats)

    # ------------------------------------------------------------------ waiting
    def wait_snapshots(self) -> None:
        """Blocks until every save so far has its snapshot: the saved tensors may change."""
        with self._lock:
            pending = list(self._in_flight)
        for h in pending:
            h.wait_snapshot()

    def wait(self, path: Optional[PathLike] = None) -> None:
        """Blocks until every save so far (or those to `path`) is written; raises the first
        error of a save that failed and was not reported yet."""
        with self._lock:
            pending = list(self._in_flight)
        if path is not None:
            target = os.path.abspath(os.fsdecode(os.fspath(path)))
            pending = [h for h in pending if h.path == target]
        for h in pending:
            h._written.exception()
        self._reap()
        self._raise_failed()

    def pending(self) -> List[FileSaveHandle]:
        """The saves whose files are not written yet."""
        self._reap()
        with self._lock:
            return list(self._in_flight)

    def guard_optimizer_steps(self) -> None:
        """Makes every ``torch.optim.Optimizer.step()`` in this process wait for the snapshots
        in flight (a global pre-hook; :meth:`close` removes it). Once is enough."""
        if self._guards:
            return
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        def before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
            self.wait_snapshots()

        self._guards.append(register_optimizer_step_pre_hook(before_step))

    def close(self) -> None:
        """Waits for every save, frees the snapshot memory and removes the optimizer guard;
        raises the first error not reported yet. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for guard in self._guards:
            guard.remove()
        self._guards.clear()
        try:
            self.wait()
        finally:
            self._snapshots.shutdown(wait=True)
            self._writes.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> "AsyncFileSaver":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ bookkeeping
    def _reap(self) -> None:
        with self._lock:
            done = [h for h in self._in_flight if h.done()]
            self._in_flight = [h for h in self._in_flight if not h.done()]
        for h in done:
            error = h._written.exception()
            if error is not None and not h._reported:
                h._reported = True
                self._failed.append(error)

    def _raise_failed(self) -> None:
        self._reap()
        if self._failed:
            error = self._failed.pop(0)
            raise error


def writer_options_checked(options: Dict[str, Any]) -> Any:
    """The C++ options for `options` (writer_options' names); TypeError names an unknown one."""
    try:
        return writer_options(**options)
    except TypeError as e:
        if "unexpected keyword argument" not in str(e):
            raise
        known = sorted(writer_options.__kwdefaults__ or {})
        unknown = sorted(set(options) - set(known))
        raise TypeError(f"fastpersist: unknown writer option(s) {', '.join(map(repr, unknown))}; "
                        f"known: {', '.join(known)}") from None
