# SPDX-License-Identifier: Apache-2.0
"""The one place the façade builds EngineOptions: the C++ defaults, then the FASTPERSIST_*
environment variables, then the caller's explicit arguments (which always win), each checked
for type and range before it reaches C++."""

from __future__ import annotations

import operator
from typing import Any, Optional

from . import _core

UINT_MAX = (1 << 32) - 1


def check_uint(name: str, value: Any, maximum: int) -> int:
    """An int (or an integer type such as numpy's: anything with __index__) in [0, maximum];
    TypeError / ValueError naming `name` otherwise. Floats and strings are refused, not
    truncated or parsed."""
    return check_int(name, value, 0, maximum)


def check_int(name: str, value: Any, minimum: int, maximum: int) -> int:
    """Like check_uint, for a signed range [minimum, maximum]."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise TypeError(f"fastpersist: {name} must be an int, got {type(value).__name__}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"fastpersist: {name} must be an int, got {type(value).__name__}") from None
    if value < minimum or value > maximum:
        raise ValueError(f"fastpersist: {name} must be in [{minimum}, {maximum}], got {value}")
    return value


def check_flag(name: str, value: Any) -> bool:
    """True or False (numpy's bool too); TypeError naming `name` otherwise: bool("false") is
    True, so a string or a number is refused rather than guessed at."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise TypeError(f"fastpersist: {name} must be True or False, got {type(value).__name__}")


def engine_options(
    backend: Optional[str] = None,
    block_size: Optional[int] = None,
    queue_depth: Optional[int] = None,
    intra_op_parallelism: Optional[int] = None,
    single_submit: Optional[bool] = None,
    overlap_events: Optional[bool] = None,
    direct_io: Optional[bool] = None,
    direct_io_min_bytes: Optional[int] = None,
) -> Any:
    """EngineOptions with every argument that is not None applied over defaults + environment."""
    o = _core.engine_options_from_env(_core.EngineOptions())
    if backend is not None:
        o.backend = str(backend)
    if block_size is not None:
        o.block_size = check_uint("block_size", block_size, (1 << 64) - 1)
    if queue_depth is not None:
        o.queue_depth = check_uint("queue_depth", queue_depth, UINT_MAX)
    if intra_op_parallelism is not None:
        o.intra_op_parallelism = check_uint("intra_op_parallelism", intra_op_parallelism, UINT_MAX)
    if single_submit is not None:
        o.single_submit = check_flag("single_submit", single_submit)
    if overlap_events is not None:
        o.overlap_events = check_flag("overlap_events", overlap_events)
    if direct_io is not None:
        o.direct_io = check_flag("direct_io", direct_io)
    if direct_io_min_bytes is not None:
        o.direct_io_min_bytes = check_uint("direct_io_min_bytes", direct_io_min_bytes, (1 << 64) - 1)
    o.validate()
    return o
