# SPDX-License-Identifier: Apache-2.0
"""The one place the façade builds EngineOptions: the C++ defaults, then the FASTPERSIST_*
environment variables, then the caller's explicit arguments (which always win), each checked
for type and range before it reaches C++."""

from __future__ import annotations

import operator
from typing import Any

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


# The engine settings by name, in C++'s order (options.h, kEngineSettings), with the kind of
# value each takes; the largest value each kind can carry into C++.
ENGINE_SETTINGS = tuple(s.name for s in _core.ENGINE_SETTINGS)
_KIND = {s.name: s.kind for s in _core.ENGINE_SETTINGS}
_MAXIMUM = {"bytes": (1 << 64) - 1, "count": UINT_MAX}


def engine_options(**given: Any) -> Any:
    """EngineOptions with every setting in `given` (ENGINE_SETTINGS by name) that is not None
    applied over defaults + environment; C++ then checks the ranges."""
    unknown = sorted(set(given) - set(ENGINE_SETTINGS))
    if unknown:
        raise TypeError(f"fastpersist: unknown engine setting(s): {', '.join(unknown)}")
    o = _core.engine_options_from_env(_core.EngineOptions())
    for name in ENGINE_SETTINGS:
        value = given.get(name)
        if value is None:
            continue
        kind = _KIND[name]
        if kind == "backend":
            value = str(value)
        elif kind == "flag":
            value = check_flag(name, value)
        else:
            value = check_uint(name, value, _MAXIMUM[kind])
        setattr(o, name, value)
    o.validate()
    return o
