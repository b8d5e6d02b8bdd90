# SPDX-License-Identifier: Apache-2.0
"""What this machine and build offer: backends, folder probes, memory-lock limits, sizes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Union

from . import _core


@dataclass(frozen=True)
class BackendInfo:
    """One I/O backend: whether it was compiled in, whether it runs here, and if not why."""

    name: str
    built_in: bool
    available: bool
    reason: str
    fix: str


@dataclass(frozen=True)
class FileIoMode:
    """How the engine opens files in a folder: O_DIRECT or not (and why), alignment."""

    direct: bool
    fallback_reason: str
    offset_alignment: int
    memory_alignment: int


def backends() -> List[BackendInfo]:
    """Every backend in order of preference (io_uring, libaio, threads), with probe results."""
    return [
        BackendInfo(p.name, p.built_in, p.available, p.reason, p.fix)
        for p in _core.probe_all_backends()
    ]


def resolve_backend(name: Optional[str] = None) -> "tuple[str, str]":
    """The backend `name` resolves to here, and a sentence saying why (None: the default
    backend of ``EngineOptions``, "auto")."""
    return _core.resolve_backend(_core.EngineOptions().backend if name is None else name)


def probe_file_io(path: Union[str, "os.PathLike[str]"]) -> FileIoMode:
    """How the engine would open `path` (a file, or a folder: probed with a temporary file)."""
    m = _core.probe_file_io(os.fspath(path))
    return FileIoMode(m.direct, m.fallback_reason, m.offset_alignment, m.memory_alignment)


def parse_size(text: Union[str, int]) -> int:
    """'4096', '64KiB', '8M', '1GiB' -> bytes (K/M/G/T are powers of 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"fastpersist: size must not be negative, got {text}")
        return text
    return _core.parse_size(str(text))
