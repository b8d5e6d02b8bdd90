# SPDX-License-Identifier: Apache-2.0
"""A read-only, seekable file object over something of known size: the position bookkeeping
the façade's readers share (an object-store part handed to boto3, a split DeepSpeed file
handed to torch.load). Subclasses give the size and read."""

from __future__ import annotations

import io


class SeekableReader(io.RawIOBase):
    def __init__(self) -> None:
        super().__init__()
        self._pos = 0

    def _size(self) -> int:
        raise NotImplementedError

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        bases = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size()}
        if whence not in bases:
            raise ValueError(f"seek: whence {whence!r}")
        pos = bases[whence] + offset
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos
