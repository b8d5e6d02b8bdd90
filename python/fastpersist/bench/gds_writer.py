# SPDX-License-Identifier: Apache-2.0
"""The sink of the ``test_ds_gds_fast_save`` tag: DeepSpeedExamples' GDS variant of
FastFileWriter, rebuilt on :class:`fastpersist.GdsHandle` for the comparison only.

As in DeepSpeed, ``torch.save`` writes host bytes into a double buffer that lives in GPU memory
(two tensors registered with cuFile), and each full half is written to the file by cuFile while
the other half fills. The bytes torch hands over are already on the host (torch copies GPU
storages itself), so this path is GPU -> host -> GPU -> file: the tag measures DeepNVMe's design,
not a fast one. fastpersist's own saves stage GPU tensors through pinned host memory instead.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Dict

import torch

from ..gds_handle import GdsHandle

_MiB = 1 << 20


class GdsStreamWriter:
    """A write-only file object for ``torch.save``; ``close()`` syncs the file."""

    def __init__(self, path: str, io_buffer_mb: int = 64) -> None:
        self._path = path
        self._h = GdsHandle(block_size=8 * _MiB, queue_depth=8, intra_op_parallelism=1)
        half = max(1, io_buffer_mb // 2) * _MiB
        example = torch.empty(0, dtype=torch.uint8, device="cuda")
        self._halves = [self._h.new_pinned_device_tensor(half, example) for _ in range(2)]
        self._current = 0
        self._fill = 0
        self._offset = 0  # file offset of the current half
        self._in_flight = False
        self._bytes = 0
        self._h.sync_pwrite(self._halves[0][:0], path, truncate=True)  # creates / empties it

    def write(self, data: Any) -> int:
        with warnings.catch_warnings():  # torch.save's bytes are read-only; only read here
            warnings.simplefilter("ignore", UserWarning)
            src = torch.frombuffer(memoryview(data).cast("B"), dtype=torch.uint8)
        pos = 0
        while pos < src.numel():
            half = self._halves[self._current]
            n = min(src.numel() - pos, half.numel() - self._fill)
            half[self._fill:self._fill + n].copy_(src[pos:pos + n])
            self._fill += n
            pos += n
            if self._fill == half.numel():
                self._drain()
        self._bytes += src.numel()
        return src.numel()

    def _drain(self) -> None:
        if self._fill == 0:
            return
        if self._in_flight:
            self._h.wait()
        self._h.async_pwrite(self._halves[self._current][:self._fill], self._path, self._offset)
        self._in_flight = True
        self._offset += self._fill
        self._current ^= 1
        self._fill = 0

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._drain()
        if self._in_flight:
            self._h.wait()
        fd = os.open(self._path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        for t in self._halves:
            self._h.free_pinned_device_tensor(t)
        self._h.close()

    def stats(self) -> Dict[str, Any]:
        return {"bytes": self._bytes, "mode": self._h.mode if not self._h.closed else ""}

    def __enter__(self) -> "GdsStreamWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
