# SPDX-License-Identifier: Apache-2.0
"""Turns the buffers users pass (tensors, arrays, buffer-protocol objects) into raw memory.

`resolve(obj, writable)` returns ``(address, nbytes, keepalive)``. The C++ core only sees the
address; the caller keeps ``keepalive`` referenced until the I/O on that memory has finished.
torch and numpy are never imported here: an object can only be a tensor (an array) if the user
already imported torch (numpy), so ``sys.modules`` is consulted instead.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

from . import _core


class ResolvedBuffer(NamedTuple):
    address: int
    nbytes: int
    keepalive: Any


def _torch_module() -> Any:
    return sys.modules.get("torch")


def is_torch_tensor(obj: Any) -> bool:
    torch = _torch_module()
    return torch is not None and isinstance(obj, torch.Tensor)


def _resolve_tensor(t: Any, writable: bool) -> ResolvedBuffer:
    if t.device.type != "cpu":
        raise ValueError(
            f"fastpersist: tensors on device '{t.device}' are not supported yet; pass a CPU "
            "tensor (e.g. one from AioHandle.new_cpu_locked_tensor, filled with .copy_())"
        )
    if t.layout is not _torch_module().strided:
        raise ValueError(f"fastpersist: only dense (strided) tensors are supported, got {t.layout}")
    if not t.is_contiguous():
        raise ValueError(
            "fastpersist: the tensor is not contiguous; pass t.contiguous() (for writes) or a "
            "contiguous tensor to read into"
        )
    if t.is_conj() or t.is_neg():
        raise ValueError(
            "fastpersist: the tensor has a lazy conjugate/negative bit; call t.resolve_conj() / "
            "t.resolve_neg() first"
        )
    nbytes = t.numel() * t.element_size()
    return ResolvedBuffer(t.data_ptr() if nbytes else 0, nbytes, t)


def _resolve_ndarray(a: Any, writable: bool) -> ResolvedBuffer:
    if not a.flags.c_contiguous:
        raise ValueError(
            "fastpersist: the numpy array is not C-contiguous; pass numpy.ascontiguousarray(a)"
        )
    if writable and not a.flags.writeable:
        raise ValueError(
            "fastpersist: the numpy array is read-only; reading into it needs a writable array"
        )
    nbytes = int(a.nbytes)
    return ResolvedBuffer(int(a.__array_interface__["data"][0]) if nbytes else 0, nbytes, a)


def _resolve_buffer_protocol(obj: Any, writable: bool) -> ResolvedBuffer:
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(
            "fastpersist: expected a torch tensor, a numpy array or a buffer-protocol object "
            f"(bytes, bytearray, memoryview, mmap, ...), got {type(obj).__name__}"
        ) from None
    if writable and view.readonly:
        raise ValueError(
            f"fastpersist: the {type(obj).__name__} is read-only; reading into it needs a "
            "writable buffer (e.g. a bytearray)"
        )
    if not view.c_contiguous:
        raise ValueError(f"fastpersist: the {type(obj).__name__} buffer is not C-contiguous")
    try:
        address, nbytes = _core.buffer_address(view, writable)
    except BufferError as e:
        raise ValueError(f"fastpersist: cannot use the {type(obj).__name__} buffer: {e}") from None
    # The memoryview holds the buffer export, so e.g. a bytearray cannot be resized while it is
    # in use.
    return ResolvedBuffer(address if nbytes else 0, nbytes, view)


def resolve(obj: Any, writable: bool) -> ResolvedBuffer:
    """Address, size and keep-alive object of `obj`'s memory.

    `writable` is True for reads (the memory is written by the I/O). Raises ValueError for a
    buffer that cannot be used as given (non-contiguous, read-only for a read, on a GPU) and
    TypeError for an object that is not a buffer at all.
    """
    if is_torch_tensor(obj):
        return _resolve_tensor(obj, writable)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, numpy.ndarray):
        return _resolve_ndarray(obj, writable)
    if isinstance(obj, (str, int, float)) or obj is None:
        raise TypeError(
            "fastpersist: expected a torch tensor, a numpy array or a buffer-protocol object, "
            f"got {type(obj).__name__}"
        )
    return _resolve_buffer_protocol(obj, writable)
