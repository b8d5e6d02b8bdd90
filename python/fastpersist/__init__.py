# SPDX-License-Identifier: Apache-2.0
"""fastpersist: save and load deep-learning checkpoints at the speed of the storage.

The DeepNVMe-compatible async I/O handle::

    import torch, fastpersist
    h = fastpersist.AioHandle(block_size=8 << 20, queue_depth=32, intra_op_parallelism=4)
    t = h.new_cpu_locked_tensor(1 << 20, torch.empty(0, dtype=torch.float32))
    h.async_pwrite(t, "/mnt/nvme/t.bin")
    assert h.wait() == 1

``torch.save`` / ``torch.load`` at storage speed, durable, loadable by plain torch::

    fastpersist.save(model.state_dict(), "/mnt/nvme/ckpt.pt")
    sd = fastpersist.load("/mnt/nvme/ckpt.pt")
"""

from __future__ import annotations

from . import _core
from ._system import BackendInfo, FileIoMode, backends, parse_size, probe_file_io, resolve_backend
from .aio_handle import AioHandle, IoStats, aio_handle
from .serialization import load, read_file, save
from .writer import FastFileWriter, MockFileWriter, PyFileWriter

PinnedBuffer = _core.PinnedBuffer
__version__: str = _core.__version__

__all__ = [
    "AioHandle",
    "FastFileWriter",
    "MockFileWriter",
    "PyFileWriter",
    "BackendInfo",
    "FileIoMode",
    "IoStats",
    "PinnedBuffer",
    "__version__",
    "aio_handle",
    "backends",
    "load",
    "parse_size",
    "probe_file_io",
    "read_file",
    "resolve_backend",
    "save",
]
