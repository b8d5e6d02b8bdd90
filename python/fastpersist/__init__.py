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
from .config import active_config, load_config
from .errors import (CheckpointCorruptError, CheckpointLockedError, CheckpointUnsupportedError,
                     DistributedCheckpointError, GpuUnavailableError)
from .gds_handle import GdsHandle, gds_handle, gds_info
from .maintenance import StaleFiles, clean_stale_temp_files
from .object_store import open_object_store as _open_object_store
from .serialization import load, read_file, save
from .writer import FastFileWriter, MockFileWriter, PyFileWriter


def __getattr__(name: str) -> object:
    # The checkpoint API needs torch; import it on first use so AioHandle users need no torch.
    lazy = {
        "CheckpointManager": ("checkpoint", "CheckpointManager"),
        "CheckpointInfo": ("checkpoint", "CheckpointInfo"),
        "SaveHandle": ("checkpoint", "SaveHandle"),
        "Tier": ("tiers", "Tier"),
        "TierStatus": ("tiers", "TierStatus"),
        "TierWarning": ("tiers", "TierWarning"),
        "CheckpointLocation": ("tiers", "CheckpointLocation"),
        "S3Store": ("object_store", "S3Store"),
        "BackgroundState": ("warm_restore", "BackgroundState"),
        "AsyncFileSaver": ("async_files", "AsyncFileSaver"),
        "CommittedCheckpoint": ("_commit_hook", "CommittedCheckpoint"),
        "FileSaveHandle": ("async_files", "FileSaveHandle"),
        "load_checkpoint": ("checkpoint", "load_checkpoint"),
        "save_safetensors": ("safetensors_io", "save_safetensors"),
        "load_safetensors": ("safetensors_io", "load_safetensors"),
    }
    if name not in lazy:
        raise AttributeError(f"module 'fastpersist' has no attribute {name!r}")
    import importlib

    module, attr = lazy[name]
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value
    return value

# Tier URLs ("s3://...") reach C++ as strings; C++ asks this to open them (boto3, imported only
# when a store is made).
_core.set_object_store_opener(_open_object_store)

PinnedBuffer = _core.PinnedBuffer
__version__: str = _core.__version__

__all__ = [
    "AioHandle",
    "AsyncFileSaver",
    "FileSaveHandle",
    "CheckpointCorruptError",
    "DistributedCheckpointError",
    "CheckpointInfo",
    "CheckpointLockedError",
    "CheckpointUnsupportedError",
    "CheckpointManager",
    "CommittedCheckpoint",
    "SaveHandle",
    "Tier",
    "TierStatus",
    "TierWarning",
    "CheckpointLocation",
    "S3Store",
    "BackgroundState",
    "FastFileWriter",
    "GdsHandle",
    "GpuUnavailableError",
    "MockFileWriter",
    "PyFileWriter",
    "BackendInfo",
    "FileIoMode",
    "IoStats",
    "PinnedBuffer",
    "StaleFiles",
    "__version__",
    "aio_handle",
    "gds_handle",
    "gds_info",
    "active_config",
    "load_config",
    "backends",
    "clean_stale_temp_files",
    "load",
    "load_checkpoint",
    "load_safetensors",
    "parse_size",
    "probe_file_io",
    "read_file",
    "resolve_backend",
    "save",
    "save_safetensors",
]
