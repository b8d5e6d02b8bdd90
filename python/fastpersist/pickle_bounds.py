# SPDX-License-Identifier: Apache-2.0
"""No allocation larger than the input justifies, in the pickles fastpersist reads from a
checkpoint (untrusted input).

``bytearray(N)`` and ``bytes(N)`` are globals that ``torch.load(weights_only=True)`` allows: a
46-byte pickle that calls ``bytearray(3 * 10**9)`` costs 3 GB before anything can refuse it.

- fastpersist's own restricted unpicklers (the object sidecar, DCP metadata) resolve those two
  names to :func:`bounded_constructor`, which refuses a size argument larger than the input;
- before a pickle goes to torch's weights-only unpickler (a DCP value's small archive, a
  DeepSpeed file in ``convert``), :func:`check_pickle` scans its opcodes (linear, allocating
  nothing of the sizes it reads) and refuses one that references ``bytearray`` or ``bytes`` and
  holds an integer larger than the input: the only way to pass such a size.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import zipfile
from typing import Any, Callable, Union

# The size-taking constructors torch's weights-only allowlist holds.
SIZED = {"bytearray": bytearray, "bytes": bytes}
_INT_OPCODES = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"}


class PickleTooLargeError(pickle.UnpicklingError):
    """A pickle asks for more memory than its input justifies."""


def bounded_constructor(name: str, limit: int, what: str) -> Callable[..., Any]:
    """``bytearray`` / ``bytes`` that refuse a size (an int argument) above `limit` bytes."""
    ctor = SIZED[name]

    def make(*args: Any) -> Any:
        if args and isinstance(args[0], int) and not isinstance(args[0], bool) and args[0] > limit:
            raise PickleTooLargeError(f"{what} asks for {name}({args[0]}), more than its "
                                      f"{limit} bytes could hold: refused as hostile or damaged")
        return ctor(*args)

    return make


def check_pickle(data: bytes, limit: int, what: str) -> None:
    """Raises PickleTooLargeError when the pickle `data` references ``bytearray`` or ``bytes``
    and holds an integer above `limit` (the size of the input it came from). A pickle that does
    not parse is left to its unpickler, which reports it."""
    sized = False
    largest = 0
    try:
        for op, arg, _ in pickletools.genops(io.BytesIO(data)):
            if op.name in _INT_OPCODES and isinstance(arg, int):
                largest = max(largest, arg)
            elif isinstance(arg, str) and (arg in SIZED or arg.endswith((" bytearray", " bytes"))):
                sized = True  # STACK_GLOBAL's name, or GLOBAL's "module name"
    except Exception:  # noqa: BLE001 (malformed: its unpickler says what is wrong)
        return
    if sized and largest > limit:
        raise PickleTooLargeError(f"{what} builds bytes or a bytearray and holds the size "
                                  f"{largest}, more than its {limit} bytes could hold: refused "
                                  "as hostile or damaged")


def check_torch_file(source: Union[str, bytes], what: str) -> None:
    """:func:`check_pickle` for what ``torch.load`` would unpickle: the ``data.pkl`` of a zip
    archive (a path or bytes), or a legacy file's leading pickle; the limit is the whole
    input's size."""
    if isinstance(source, (bytes, bytearray)):
        size = len(source)
        opened: Any = io.BytesIO(source)
    else:
        opened = open(source, "rb")
        size = opened.seek(0, io.SEEK_END)
        opened.seek(0)
    with opened:
        if zipfile.is_zipfile(opened):
            opened.seek(0)
            with zipfile.ZipFile(opened) as archive:
                pickles = [n for n in archive.namelist() if n.endswith("data.pkl")]
                if not pickles:
                    return
                info = archive.getinfo(pickles[0])
                if info.file_size > size:
                    raise PickleTooLargeError(f"{what}: its pickle claims {info.file_size} "
                                              f"bytes, more than the file's {size}")
                data = archive.read(info)
        else:
            opened.seek(0)
            data = opened.read(size)
    check_pickle(data, size, what)
