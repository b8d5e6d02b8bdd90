# SPDX-License-Identifier: Apache-2.0
"""A one-line progress bar on stderr for long operations, the twin of the CLI's C++
``ProgressBar`` (tools/progress.h), drawing the same line::

    convert write ckpt/step-00000001  1.2 GiB / 3.1 GiB  [=========>          ]  1.5 GiB/s

Redrawn in place with ``\\r``, at most every `min_interval` seconds, so calling ``update()`` for
every chunk costs nothing measurable; ``finish()`` draws the final state and ends the line. A
disabled bar does nothing, which lets callers create one unconditionally. Thread-safe.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Optional, TextIO

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes_short(n: float) -> str:
    """"1.2 GiB": one decimal, binary units (the C++ ``format_bytes_short``)."""
    if not n > 0:
        return "0 B"
    unit = 0
    while unit + 1 < len(_UNITS) and n >= 1024.0:
        n /= 1024.0
        unit += 1
    return f"{n:.0f} B" if unit == 0 else f"{n:.1f} {_UNITS[unit]}"


def stderr_is_tty() -> bool:
    """True when stderr is a terminal (where a redrawn bar makes sense)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


class ProgressBar:
    """``update(done, total)`` in bytes, then ``finish()``; see the module's docstring."""

    def __init__(self, label: str, enabled: bool, out: Optional[TextIO] = None,
                 min_interval: float = 0.1) -> None:
        self._label = label
        self._out = out if out is not None else sys.stderr
        self._enabled = bool(enabled) and self._out is not None
        self._min_interval = min_interval
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._lock = threading.Lock()
        self._done = 0
        self._total = 0
        self._last_width = 0  # characters drawn last time, to blank leftovers
        self._drawn = False
        self._finished = False

    @property
    def enabled(self) -> bool:
        return self._enabled

    def update(self, done: int, total: int) -> None:
        """`done` of `total` bytes; redraws when the interval passed (or on the first call)."""
        if not self._enabled:
            return
        with self._lock:
            if self._finished:
                return
            self._done, self._total = int(done), int(total)
            self._draw_locked(force=False)

    def finish(self, clear: bool = False) -> None:
        """Draws the final state and ends the line; blanks it instead with `clear`. Idempotent."""
        if not self._enabled:
            return
        with self._lock:
            if self._finished:
                return
            self._finished = True
            if not self._drawn:  # nothing on the line: leave the terminal alone
                return
            if clear:
                self._out.write("\r" + " " * self._last_width + "\r")
            else:
                self._draw_locked(force=True)
                self._out.write("\n")
            self._out.flush()

    @staticmethod
    def render(label: str, done: int, total: int, seconds: float, bar_width: int = 24) -> str:
        """The bar's text without the leading ``\\r`` (the C++ ``ProgressBar::render``)."""
        fraction = 1.0 if total == 0 else min(max(done / total, 0.0), 1.0)
        width = max(bar_width, 1)
        filled = int(math.floor(fraction * width))
        bar = "=" * filled + (">" if filled < width and done > 0 else "")
        text = (f"{label}  {format_bytes_short(done)} / {format_bytes_short(total)}  "
                f"[{bar.ljust(width)}]")
        if seconds > 0 and done > 0:
            text += f"  {format_bytes_short(done / seconds)}/s"
        return text

    def _draw_locked(self, force: bool) -> None:
        now = time.monotonic()
        if not force and self._drawn and now - self._last_draw < self._min_interval:
            return
        self._last_draw = now
        self._drawn = True
        text = self.render(self._label, self._done, self._total, now - self._start)
        width = len(text)
        if width < self._last_width:
            text += " " * (self._last_width - width)
        self._last_width = width
        self._out.write("\r" + text)
        self._out.flush()
