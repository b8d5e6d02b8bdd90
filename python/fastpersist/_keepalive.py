# SPDX-License-Identifier: Apache-2.0
"""Keeps the Python objects behind async requests alive until their I/O has finished.

An async call of the C++ binding returns the object that pins the buffer's memory (the buffer
itself, or a memoryview holding its export). A tensor handed to ``async_pwrite`` and then dropped
by the caller would otherwise be freed (and its memory reused) while the kernel still reads it.

Protocol (safe with any number of threads submitting, waiting and making sync calls):

1. ``submitted(obj)`` runs after the request was submitted, so every object in ``_pending``
   belongs to a request submitted before any drain that later takes it.
2. A *drain* is any call that may collect requests: ``wait()`` and every sync call (they drain
   the handle too). Each C++ drain returns only after the requests it collected finished, but
   one drain may collect requests that a concurrent one was waiting for.
3. ``wait()`` moves ``_pending`` to ``_retiring`` when it starts. ``_retiring`` is dropped only
   when no drain is running: whichever drains collected those requests have returned by then,
   so the requests are finished.

A drain that never ends (one thread calling sync ops back to back forever) only delays the
release; it never releases early.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator, List


class KeepAlive:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: List[Any] = []
        self._retiring: List[Any] = []
        self._active_drains = 0

    def submitted(self, obj: Any) -> None:
        """Call after an async request on `obj`'s memory was submitted successfully."""
        with self._lock:
            self._pending.append(obj)

    @contextmanager
    def drain(self, collects_pending: bool) -> Iterator[None]:
        """Wraps a call that may collect requests; `collects_pending` for wait()."""
        with self._lock:
            self._active_drains += 1
            if collects_pending:
                self._retiring.extend(self._pending)
                self._pending.clear()
        try:
            yield
        finally:
            done: List[Any] = []
            with self._lock:
                self._active_drains -= 1
                if self._active_drains == 0:
                    done, self._retiring = self._retiring, []
            del done  # outside the lock: freeing a buffer may run arbitrary Python code

    def release_all(self) -> None:
        """Drops everything; only once the handle has no request in flight any more."""
        with self._lock:
            dropped = self._pending + self._retiring
            self._pending, self._retiring = [], []
        del dropped

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending) + len(self._retiring)
