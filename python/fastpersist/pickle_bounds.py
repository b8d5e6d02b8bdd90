# SPDX-License-Identifier: Apache-2.0
"""No allocation larger than the input justifies, in the pickles fastpersist reads from a
checkpoint (untrusted input).

A few bytes of pickle can ask for gigabytes before anything refuses them:

- ``bytearray(N)`` and ``bytes(N)`` are globals that ``torch.load(weights_only=True)`` allows:
  a 41-byte pickle that calls ``bytearray(3 * 10**9)`` costs 3 GB;
- CPython's C unpickler keeps its memo in an array indexed by the PUT opcodes' argument: a
  ``LONG_BINPUT 1346324372`` resizes it to 21 GB;
- a FRAME (or a counted ``BINBYTES8``) that claims more bytes than follow makes a file-backed
  unpickler allocate the claim before reading.

So, before any unpickler sees untrusted bytes, :func:`check_pickle` scans their opcodes
(linear, allocating nothing of the sizes it reads) and refuses a pickle that does not parse, a
memo index or frame larger than the input, or one that references ``bytearray`` or ``bytes``
and holds an integer larger than the input (the only way to pass such a size). fastpersist's
own restricted unpicklers (the object sidecar, DCP metadata) also resolve those two names to
:func:`bounded_constructor`, which refuses a size argument larger than the input.
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


class PickleRefusedError(pickle.UnpicklingError):
    """A pickle refused before unpickling: it does not parse, or asks for more memory than its
    input justifies."""


class PickleTooLargeError(PickleRefusedError):
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


_MEMO_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}


def check_pickle(data: bytes, limit: int, what: str, *, bounded_constructors: bool = False) -> None:
    """Scans the pickle `data` (from an input of `limit` bytes) before it is unpickled.

    `bounded_constructors`: the unpickler resolves ``bytearray`` / ``bytes`` to
    :func:`bounded_constructor` itself, which refuses exactly the sizes that are too large, so
    the scan leaves them alone (a state may hold a bytearray and, elsewhere, a large integer).

    Raises:
        PickleTooLargeError: a memo index or frame larger than `limit`, or (unless
            `bounded_constructors`) a reference to ``bytearray`` / ``bytes`` with an integer
            above `limit`.
        PickleRefusedError: `data` is not a well-formed pickle.
    """
    _scan(io.BytesIO(data), len(data), limit, what, bounded_constructors)


def _scan(stream: io.BytesIO, total: int, limit: int, what: str, bounded_constructors: bool) -> None:
    """check_pickle for the one pickle that starts at `stream`'s position (of `total` bytes);
    leaves the stream after its STOP."""
    sized = False
    largest = 0
    try:
        for op, arg, pos in pickletools.genops(stream):
            name = op.name
            if name in _INT_OPCODES and isinstance(arg, int):
                largest = max(largest, arg)
            elif name in _MEMO_PUTS and isinstance(arg, int) and arg > limit:
                raise PickleTooLargeError(f"{what} stores a memo entry at index {arg}, more than "
                                          f"its {limit} bytes could number: refused as hostile "
                                          "or damaged")
            elif name == "FRAME" and isinstance(arg, int) and arg > total - (pos or 0):
                raise PickleTooLargeError(f"{what} has a frame of {arg} bytes, more than the "
                                          f"{total - (pos or 0)} that follow: refused as "
                                          "hostile or damaged")
            elif isinstance(arg, str) and (arg in SIZED or arg.endswith((" bytearray", " bytes"))):
                sized = True  # STACK_GLOBAL's name, or GLOBAL's "module name"
    except PickleRefusedError:
        raise
    except Exception as e:  # noqa: BLE001 - pickletools says what is malformed in many ways
        raise PickleRefusedError(f"{what} is not readable: not a well-formed pickle ({e})") from None
    if sized and largest > limit and not bounded_constructors:
        raise PickleTooLargeError(f"{what} builds bytes or a bytearray and holds the size "
                                  f"{largest}, more than its {limit} bytes could hold: refused "
                                  "as hostile or damaged")


# A legacy torch.save file begins with five pickles (magic number, protocol, system info, the
# object, the storage keys), then the storages' raw bytes.
_LEGACY_PICKLES = 5


def check_torch_file(source: Union[str, bytes], what: str) -> None:
    """:func:`check_pickle` for what ``torch.load`` would unpickle: every pickle of a zip
    archive (a path or bytes), or a legacy file's leading pickles; the limit is the whole
    input's size."""
    if isinstance(source, (bytes, bytearray)):
        size = len(source)
        opened: Any = io.BytesIO(source)
    else:
        opened = open(source, "rb")
        size = opened.seek(0, io.SEEK_END)
        opened.seek(0)
    with opened:
        if not zipfile.is_zipfile(opened):
            opened.seek(0)
            stream = io.BytesIO(opened.read(size))
            for _ in range(_LEGACY_PICKLES):
                if stream.tell() >= size:
                    break
                _scan(stream, size, size, what, False)
            return
        opened.seek(0)
        with zipfile.ZipFile(opened) as archive:
            # Every pickle of the archive, whatever the case of its name: torch's zip reader
            # finds "archive/dAta.pkl" as data.pkl.
            for info in archive.infolist():
                if info.filename.lower().endswith(".pkl"):
                    check_pickle(_stored_entry(archive, info, size, what), size, what)


def _stored_entry(archive: zipfile.ZipFile, info: zipfile.ZipInfo, size: int, what: str) -> bytes:
    """The bytes of one entry of a torch archive, after checking what its directory claims."""
    # The directory's sizes are claims: a read sized by them allocates first.
    claimed = max(info.file_size, info.compress_size)
    if claimed > size:
        raise PickleTooLargeError(f"{what}: its pickle claims {claimed} bytes, more than the "
                                  f"file's {size}")
    if info.compress_type != zipfile.ZIP_STORED:
        raise PickleRefusedError(f"{what}: its pickle is compressed, which a torch file never is")
    return archive.read(info)
