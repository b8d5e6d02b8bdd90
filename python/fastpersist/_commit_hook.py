# SPDX-License-Identifier: Apache-2.0
"""``CheckpointManager(on_commit=...)``: a callback after each commit, without polling.

One thread per manager takes the saves in the order they were started (which is their commit
order) and blocks on each (``wait_done``, GIL released) until it is committed or failed. After a
commit it calls ``callback(committed)`` with a :class:`CommittedCheckpoint` (its root, tag,
path, step and :class:`fastpersist.CheckpointInfo`). A
failed save is skipped: its error stays for ``wait()`` or the next save to report, as without a
hook. An exception from the callback is warned about (``RuntimeWarning``) and never fails a
save. ``save()`` returns after the callback of its own commit ran; ``close()`` after every one.
"""

from __future__ import annotations

import os
import queue
import threading
import warnings
from typing import Any, Callable, NamedTuple, Optional

from . import _core

_STOP = object()


class CommittedCheckpoint(NamedTuple):
    """What ``on_commit`` is called with."""
    root: str
    tag: str
    path: str  # the checkpoint directory, root/tag
    step: Optional[int]
    info: Any  # its fastpersist.CheckpointInfo (sizes, tensors, sequence, ...)


class CommitHook:
    def __init__(self, callback: Callable[[Any], None], root: str) -> None:
        if not callable(callback):
            raise TypeError(f"fastpersist: on_commit must be callable, got "
                            f"{type(callback).__name__}")
        self._callback = callback
        self._root = root
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="fastpersist-on-commit",
                                        daemon=True)
        self._thread.start()

    def watch(self, pending: Any, tag: str) -> threading.Event:
        """Calls the callback once `pending` (a save with ``wait_done()``) committed `tag`;
        the event is set when that is over (or the save failed)."""
        called = threading.Event()
        self._queue.put((pending, tag, called))
        return called

    def close(self) -> None:
        """Returns once the callbacks of every watched save ran. Idempotent."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            pending, tag, called = item
            try:
                if pending.wait_done():
                    self._call(tag)
            finally:
                called.set()

    def _call(self, tag: str) -> None:
        info: Optional[Any] = None
        try:
            info = next((c for c in _core.list_checkpoints(self._root).committed if c.tag == tag),
                        None)
            if info is not None:  # None: removed already (by another process)
                self._callback(CommittedCheckpoint(self._root, tag, os.path.join(self._root, tag),
                                                   info.step, info))
        except Exception as e:  # noqa: BLE001 - a hook never fails a save
            warnings.warn(f"fastpersist: the on_commit callback raised for checkpoint {tag!r}: "
                          f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=1)
