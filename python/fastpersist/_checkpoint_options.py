# SPDX-License-Identifier: Apache-2.0
"""The one place the façade builds ``_core.CheckpointOptions``: the C++ defaults, with only the
settings the caller gave (not None) applied, each converted and checked for type. Shared by
:class:`CheckpointManager` and the DCP storage writer (fastpersist.dcp), which keeps the settings
as a plain dict so that it pickles, and builds the options in the process that writes."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Union

from . import _core
from ._system import parse_size
from ._engine_options import ENGINE_SETTINGS, UINT_MAX, check_flag, check_int, check_uint
from .writer import engine_options

INT64_MAX = (1 << 63) - 1

Size = Union[int, str]

# The checkpoint settings by name, in C++'s order (checkpoint.h, kCheckpointSettings): the
# option field each sets and the kind of value it takes.
_FIELDS = {s.name: (s.field, s.kind) for s in _core.CHECKPOINT_SETTINGS}
# The engine settings a CheckpointManager and the DCP reader and writer take (DeepNVMe's knobs;
# the others keep the defaults and FASTPERSIST_* values): names from C++'s list.
ENGINE = tuple(n for n in ENGINE_SETTINGS
               if n in ("backend", "block_size", "queue_depth", "intra_op_parallelism"))

SETTINGS = tuple(_FIELDS) + ENGINE
INT32_MAX = (1 << 31) - 1


def _codec(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"fastpersist: {name} must be 'zstd', 'lz4', 'none' or None, "
                        f"got {type(value).__name__}")
    return value  # ValueError from C++ for an unknown name


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"fastpersist: {name} must be a number of seconds, "
                        f"got {type(value).__name__}")
    return float(value)  # C++ checks it (finite, above 0) at open


# How a value of each kind is checked for type before C++ checks its range.
_CHECKS: Dict[str, Callable[[str, Any], Any]] = {
    "bytes": lambda name, value: parse_size(value),
    "count": lambda name, value: check_uint(name, value, INT64_MAX),
    "flag": check_flag,
    "codec": _codec,
    "level": lambda name, value: check_int(name, value, -INT32_MAX, INT32_MAX),
    "seconds": _seconds,
}


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
    for name, (field, kind) in _FIELDS.items():
        if settings.get(name) is not None:
            setattr(o, field, _CHECKS[kind](name, settings[name]))
    o.keep_last = keep_last
    o.keep_every = keep_every
    o.validate()  # C++ says what is out of range (keep_last 0, max_in_flight 0, ...)
    return o
