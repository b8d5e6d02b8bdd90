# SPDX-License-Identifier: Apache-2.0
"""Exceptions of fastpersist beyond the built-in ones.

I/O failures are ``OSError`` (with errno and filename), bad arguments ``ValueError``; these add
the two checkpoint-specific cases a training script may want to catch on their own.
"""

from __future__ import annotations


class CheckpointCorruptError(ValueError):
    """Stored bytes are damaged: a checksum mismatch, a truncated or missing file, a bad manifest.

    The message names the checkpoint, the file and, where known, the tensor.
    """


class CheckpointLockedError(RuntimeError):
    """Another CheckpointManager (in this or another process) holds the root's lock."""


__all__ = ["CheckpointCorruptError", "CheckpointLockedError"]
