# SPDX-License-Identifier: Apache-2.0
"""Configuration files: the I/O settings ``fastpersist tune --output fastpersist.json`` found
best for a machine (C++ reads and checks them: config_file.h; docs/settings.md).

::

    fastpersist.load_config("fastpersist.json")   # or FASTPERSIST_CONFIG=fastpersist.json

Every engine, AioHandle, FastFileWriter, ``fastpersist.save``/``load`` and CheckpointManager
created afterwards in this process starts from it; FASTPERSIST_* variables and explicit
arguments still override it.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Union

from . import _core

PathLike = Union[str, "os.PathLike[str]"]
_ENGINE_FIELDS = tuple(s.name for s in _core.ENGINE_SETTINGS)  # C++'s kEngineSettings


def _as_dict(config: Any) -> Dict[str, Any]:
    return {"path": config.path or None,
            "engine": {f: getattr(config.engine, f) for f in _ENGINE_FIELDS},
            "writer_io_buffer_bytes": config.writer_io_buffer_bytes}


def load_config(path: PathLike) -> Dict[str, Any]:
    """Makes the configuration file at `path` this process's (read and checked now: an unknown
    setting, a wrong type or a value out of range raises ValueError naming the file and the
    field). Returns the settings it holds. ``load_config("")`` goes back to FASTPERSIST_CONFIG."""
    text = os.fsdecode(os.fspath(path))
    return _as_dict(_core.use_config_file(text))


def active_config() -> Dict[str, Any]:
    """The settings in force from a configuration file (``path`` None: no file), before the
    FASTPERSIST_* variables."""
    return _as_dict(_core.active_config(_core.EngineOptions()))


def configured_writer_buffer() -> Any:
    """The FastFileWriter staging size the active configuration sets, or None."""
    return _core.active_config(_core.EngineOptions()).writer_io_buffer_bytes
