# SPDX-License-Identifier: Apache-2.0
"""Exceptions of fastpersist beyond the built-in ones.

I/O failures are ``OSError`` (with errno and filename), bad arguments ``ValueError``; these add
the checkpoint-specific cases a training script may want to catch on their own.
"""

from __future__ import annotations

from typing import Dict

class CheckpointCorruptError(ValueError):
    """Stored bytes are damaged: a checksum mismatch, a truncated or missing file, a bad manifest.

    The message names the checkpoint, the file and, where known, the tensor.
    """


class CheckpointUnsupportedError(ValueError):
    """The checkpoint is intact but holds something this fastpersist or this torch cannot turn
    into tensors (a dtype torch has no counterpart for). ``CheckpointManager.resume`` skips such
    a checkpoint, as it skips a damaged one."""


class GpuUnavailableError(RuntimeError):
    """A call needed the GPU path and this process lacks it: the CUDA runtime (libcudart) or
    cuFile (libcufile, for GdsHandle) could not be loaded, or the device could not be used.

    The message names what is missing and why. Raised by ``AioHandle`` for CUDA tensors and by
    every GPU call of ``GdsHandle`` before anything is opened, created or truncated: a failed
    call changes nothing.
    """


class CheckpointLockedError(RuntimeError):
    """Another CheckpointManager (in this or another process) holds the root's lock."""


__all__ = ["CheckpointCorruptError", "CheckpointLockedError", "CheckpointUnsupportedError",
           "DistributedCheckpointError", "GpuUnavailableError"]


class DistributedCheckpointError(RuntimeError):
    """A multi-rank save failed on some rank: nothing was committed. Raised on every rank with
    the same message; ``failures`` maps each rank that failed (or never finished writing) to
    what happened there."""

    def __init__(self, message: str, failures: Dict[int, str]) -> None:
        super().__init__(message)
        self.failures = dict(failures)
