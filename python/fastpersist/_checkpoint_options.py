# SPDX-License-Identifier: Apache-2.0
"""The one place the façade builds ``_core.CheckpointOptions``: the C++ defaults, with only the
settings the caller gave (not None) applied, each converted and checked for type. Shared by
:class:`CheckpointManager` and the DCP storage writer (fastpersist.dcp), which keeps the settings
as a plain dict so that it pickles, and builds the options in the process that writes."""

from __future__ import annotations

from typing import Any, Dict, Optional, Union

from . import _core
from ._system import parse_size
from ._engine_options import ENGINE_SETTINGS, UINT_MAX, check_flag, check_int, check_uint
from .writer import engine_options

INT64_MAX = (1 << 63) - 1

Size = Union[int, str]

# Python name -> C++ field, by kind. Sizes take ints or strings such as "4GiB".
_SIZES = {"staging_budget": "staging_budget_bytes", "staging_window": "staging_window_bytes",
          "target_file_size": "target_file_bytes", "min_file_size": "min_file_bytes"}
_COUNTS = {"max_parallel_files": "max_parallel_files", "max_in_flight": "max_in_flight",
           "compression_threads": "compression_threads", "full_every": "full_every",
           "save_every_steps": "save_every_steps"}
_FLAGS = {"lock_staging_memory": "lock_staging_memory", "durable": "durable", "checksums": "checksums",
          "incremental": "incremental", "xor_deltas": "xor_deltas"}
# The engine settings a CheckpointManager and the DCP reader and writer take (DeepNVMe's knobs;
# the others keep the defaults and FASTPERSIST_* values): names from C++'s list.
ENGINE = tuple(n for n in ENGINE_SETTINGS
               if n in ("backend", "block_size", "queue_depth", "intra_op_parallelism"))

# The codec's name and level: C++ parses the name and checks the level for the codec.
_CODEC = ("compression", "compression_level")

SETTINGS = tuple(_SIZES) + tuple(_COUNTS) + tuple(_FLAGS) + ENGINE + _CODEC + ("save_every_seconds",)
INT32_MAX = (1 << 31) - 1


def checkpoint_options(settings: Dict[str, Any], keep_last: Optional[int] = None,
                       keep_every: Optional[int] = None) -> Any:
    """``_core.CheckpointOptions`` from `settings` (names in SETTINGS; None = the C++ default)."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise TypeError(f"fastpersist: unknown checkpoint setting(s): {', '.join(unknown)}")
    keep_last = None if keep_last is None else check_uint("keep_last", keep_last, UINT_MAX)
    keep_every = None if keep_every is None else check_uint("keep_every", keep_every, INT64_MAX)
    o = _core.CheckpointOptions()  # the C++ defaults; only what the caller gave changes
    o.engine = engine_options(**{name: settings.get(name) for name in ENGINE})
    for name, field_name in _SIZES.items():
        if settings.get(name) is not None:
            setattr(o, field_name, parse_size(settings[name]))
    for name, field_name in _COUNTS.items():
        if settings.get(name) is not None:
            setattr(o, field_name, check_uint(name, settings[name], INT64_MAX))
    for name, field_name in _FLAGS.items():
        if settings.get(name) is not None:
            setattr(o, field_name, check_flag(name, settings[name]))
    compression = settings.get("compression")
    if compression is not None:
        if not isinstance(compression, str):
            raise TypeError("fastpersist: compression must be 'zstd', 'lz4', 'none' or None, "
                            f"got {type(compression).__name__}")
        o.compression = compression  # ValueError from C++ for an unknown name
    level = settings.get("compression_level")
    if level is not None:
        o.compression_level = check_int("compression_level", level, -INT32_MAX, INT32_MAX)
    seconds = settings.get("save_every_seconds")
    if seconds is not None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError("fastpersist: save_every_seconds must be a number of seconds, "
                            f"got {type(seconds).__name__}")
        o.save_every_seconds = float(seconds)  # C++ checks it (finite, above 0) at open
    o.keep_last = keep_last
    o.keep_every = keep_every
    o.validate()  # C++ says what is out of range (keep_last 0, max_in_flight 0, ...)
    return o
