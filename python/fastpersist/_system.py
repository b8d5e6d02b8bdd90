# SPDX-License-Identifier: Apache-2.0
"""What this machine and build offer: backends, folder probes, memory-lock limits, sizes."""

from __future__ import annotations

import os
from typing import List, Optional, Union

from . import _core


#: One I/O backend (the C++ record, read-only): name, built_in, available, reason, fix.
BackendInfo = _core.BackendInfo

#: How the engine opens files in a folder (the C++ record, read-only): direct, fallback_reason,
#: offset_alignment, memory_alignment.
FileIoMode = _core.FileIoMode


def backends() -> List[BackendInfo]:
    """Every backend in order of preference (io_uring, libaio, threads), with probe results."""
    return list(_core.probe_all_backends())


def resolve_backend(name: Optional[str] = None) -> "tuple[str, str]":
    """The backend `name` resolves to here, and a sentence saying why (None: the default
    backend of ``EngineOptions``, "auto")."""
    return _core.resolve_backend(_core.EngineOptions().backend if name is None else name)


def probe_file_io(path: Union[str, "os.PathLike[str]"]) -> FileIoMode:
    """How the engine would open `path` (a file, or a folder: probed with a temporary file)."""
    return _core.probe_file_io(os.fspath(path))


def parse_size(text: Union[str, int]) -> int:
    """'4096', '64KiB', '8M', '1GiB' -> bytes (K/M/G/T are powers of 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"fastpersist: size must not be negative, got {text}")
        return text
    return _core.parse_size(str(text))
