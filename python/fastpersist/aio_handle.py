# SPDX-License-Identifier: Apache-2.0
"""`AioHandle`: DeepNVMe's ``aio_handle`` API, backed by the fastpersist C++ engine.

Code written for ``deepspeed.ops.op_builder.AsyncIOBuilder().load().aio_handle(...)`` runs
unchanged: same constructor knobs, method names and return values (sync calls return how many
requests completed, async calls return 0 and are collected by ``wait()``). Differences:

* Any buffer size and file offset works; nothing is silently short. The length of a transfer is
  always the buffer's own: C++ reads address, length, layout and device from the object, and
  refuses (ValueError, before any I/O) read-only memory to read into and non-contiguous buffers.
* CUDA tensors are accepted, as DeepNVMe's are, and staged through pinned host memory chunk by
  chunk, with async copies on a stream of the handle's own overlapped with the file I/O
  (docs/gpu.md). Before handing one over, the façade waits for the current stream of the
  tensor's device; work on other streams is the caller's to finish. Without a usable CUDA
  runtime a CUDA tensor raises ``fastpersist.GpuUnavailableError`` and nothing changes.
* Writes never truncate unless asked (``truncate=True``): threads or async batches writing
  disjoint ranges of one file keep each other's bytes, and a shorter rewrite leaves the old tail.
* Errors raise exceptions instead of printing and returning -1 (or aborting): ``OSError``
  subclasses carrying ``errno`` and ``filename`` for I/O failures, ``ValueError`` for bad
  arguments, including a read past the end of the file.
* Besides torch tensors, numpy arrays and any buffer-protocol object are accepted.
* Buffers given to async calls are kept alive by the handle until ``wait()`` returns, so a
  temporary tensor cannot be freed while the kernel still writes from it.

The GIL is released while I/O runs, and a handle may be used from several threads at once.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

from . import _core
from ._engine_options import check_uint, engine_options
from ._buffers import is_torch_tensor, lendable, settle_device_memory
from ._keepalive import KeepAlive

FileTarget = Union[str, "os.PathLike[str]", int]



#: Counters of one handle's engine since it was created (the C++ record, read-only):
#: requests, bytes_written, bytes_read, direct_bytes, buffered_bytes, bounce_bytes,
#: short_transfers, direct_fallbacks, last_fallback_reason.
IoStats = _core.IoStats


def _check_offset(file_offset: Any) -> int:
    return check_uint("file_offset", file_offset, (1 << 63) - 1)


def _target(filename: Any, fd: Optional[int]) -> Union[str, int]:
    """A path (str) or a caller's file descriptor (int)."""
    if fd is not None:
        if filename is not None:
            raise TypeError("fastpersist: pass either filename or fd, not both")
        filename = fd
    if filename is None:
        raise TypeError("fastpersist: a filename (or fd=) is required")
    if isinstance(filename, bool):
        raise TypeError("fastpersist: filename must be a path or an int file descriptor")
    if isinstance(filename, int):
        if filename < 0:
            raise ValueError(f"fastpersist: invalid file descriptor {filename}")
        return filename
    path = os.fspath(filename)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    return path


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("fastpersist: this method needs torch (pip install torch)") from e
    return torch


class AioHandle:
    """An async I/O handle with DeepNVMe's knobs.

    Every argument left as None takes the value of the C++ ``EngineOptions`` (the one defaults
    table, docs/settings.md: DeepNVMe's defaults for the five DeepNVMe knobs).

    Args:
        block_size: bytes per I/O request submitted to the kernel.
        queue_depth: requests in flight per worker.
        single_submit: one submit syscall per request instead of one per batch.
        overlap_events: keep the queue topped up instead of lock-step batches.
        intra_op_parallelism: worker threads; each moves one contiguous slice of every request.
        backend: "auto" (io_uring > libaio > threads), "io_uring", "libaio" or "threads";
            None means FASTPERSIST_BACKEND from the environment, else the default.
        direct_io, direct_io_min_bytes: O_DIRECT for transfers of at least that many bytes;
            None means the environment's FASTPERSIST_DIRECT_IO* or the default.
    """

    def __init__(
        self,
        block_size: Optional[int] = None,
        queue_depth: Optional[int] = None,
        single_submit: Optional[bool] = None,
        overlap_events: Optional[bool] = None,
        intra_op_parallelism: Optional[int] = None,
        backend: Optional[str] = None,
        direct_io: Optional[bool] = None,
        direct_io_min_bytes: Optional[int] = None,
    ) -> None:
        # DeepNVMe's constructor always sets its five knobs, so the environment does not tune
        # them here: one left as None takes C++'s default, not FASTPERSIST_*.
        defaults = _core.EngineOptions()

        def knob(value: Any, name: str) -> Any:
            return getattr(defaults, name) if value is None else value

        options = engine_options(
            backend=backend, block_size=knob(block_size, "block_size"),
            queue_depth=knob(queue_depth, "queue_depth"),
            intra_op_parallelism=knob(intra_op_parallelism, "intra_op_parallelism"),
            single_submit=knob(single_submit, "single_submit"),
            overlap_events=knob(overlap_events, "overlap_events"), direct_io=direct_io,
            direct_io_min_bytes=direct_io_min_bytes)
        self._h = self._create(options)
        # Objects of async requests, kept alive until their I/O finished (_keepalive.py).
        self._keepalive = KeepAlive()

    @staticmethod
    def _create(options: "_core.EngineOptions") -> Any:
        return _core.AioHandle.create(options)

    # ---------------------------------------------------------------- knobs (DeepNVMe getters)
    def get_block_size(self) -> int:
        return self._h.get_block_size()

    def get_queue_depth(self) -> int:
        return self._h.get_queue_depth()

    def get_single_submit(self) -> bool:
        return self._h.get_single_submit()

    def get_overlap_events(self) -> bool:
        return self._h.get_overlap_events()

    def get_intra_op_parallelism(self) -> int:
        return self._h.get_intra_op_parallelism()

    def get_alignment(self) -> int:
        """Buffer sizes that are multiples of this split into equal, block-aligned slices."""
        return self._h.get_alignment()

    @property
    def backend(self) -> str:
        """The backend in use ("io_uring", "libaio" or "threads")."""
        return self._h.backend

    @property
    def backend_reason(self) -> str:
        """Why this backend was picked."""
        return self._h.backend_reason

    @property
    def closed(self) -> bool:
        return self._h.closed

    def stats(self) -> IoStats:
        return self._h.stats()

    # ---------------------------------------------------------------- transfers
    def sync_pwrite(
        self,
        buffer: Any,
        filename: Optional[FileTarget] = None,
        file_offset: int = 0,
        *,
        fd: Optional[int] = None,
        truncate: bool = False,
    ) -> int:
        """Writes `buffer` to the file at `file_offset`; returns the completed request count.

        The rest of the file is left as it was; ``truncate=True`` (writes by name) empties the
        file first, so it ends where this write ends.
        """
        return self._sync(True, buffer, _target(filename, fd), file_offset, False, truncate)

    def sync_pread(
        self,
        buffer: Any,
        filename: Optional[FileTarget] = None,
        file_offset: int = 0,
        *,
        fd: Optional[int] = None,
    ) -> int:
        """Fills `buffer` from the file at `file_offset`; returns the completed request count."""
        return self._sync(False, buffer, _target(filename, fd), file_offset, False, False)

    def async_pwrite(
        self,
        buffer: Any,
        filename: Optional[FileTarget] = None,
        file_offset: int = 0,
        *,
        fd: Optional[int] = None,
        truncate: bool = False,
    ) -> int:
        """Starts writing `buffer`; returns 0. Collect it with wait(). See sync_pwrite."""
        return self._async(True, buffer, _target(filename, fd), file_offset, False, truncate)

    def async_pread(
        self,
        buffer: Any,
        filename: Optional[FileTarget] = None,
        file_offset: int = 0,
        *,
        fd: Optional[int] = None,
    ) -> int:
        """Starts filling `buffer`; returns 0. Collect it with wait()."""
        return self._async(False, buffer, _target(filename, fd), file_offset, False, False)

    def pwrite(
        self,
        buffer: Any,
        filename: FileTarget,
        validate: bool = False,
        async_op: bool = False,
        file_offset: int = 0,
        *,
        truncate: bool = False,
        **kwargs: Any,
    ) -> int:
        """DeepNVMe's pwrite(buffer, filename, validate, async, file_offset=0).

        The 4th argument is named `async` in DeepNVMe (a Python keyword): pass it positionally,
        as ``async_op=``, or as ``**{"async": True}``. With validate, the written range is read
        back and compared at completion; a mismatch raises OSError (EIO). ``truncate``: see
        sync_pwrite.
        """
        async_op = _async_flag(async_op, kwargs)
        return self._transfer(
            True, buffer, _target(filename, None), file_offset, validate, async_op, truncate
        )

    def pread(
        self,
        buffer: Any,
        filename: FileTarget,
        validate: bool = False,
        async_op: bool = False,
        file_offset: int = 0,
        **kwargs: Any,
    ) -> int:
        """DeepNVMe's pread(buffer, filename, validate, async, file_offset=0); see pwrite."""
        async_op = _async_flag(async_op, kwargs)
        return self._transfer(
            False, buffer, _target(filename, None), file_offset, validate, async_op, False
        )

    def wait(self) -> int:
        """Blocks until every request submitted so far finished; returns how many did.

        If any failed, raises the first error (after all of them finished).
        """
        with self._keepalive.drain(collects_pending=True):
            return self._h.wait()

    # ---------------------------------------------------------------- pinned memory
    def new_cpu_locked_buffer(self, nbytes: int) -> "_core.PinnedBuffer":
        """Pinned, page-aligned host memory of `nbytes` bytes (a buffer-protocol object)."""
        return self._h.new_cpu_locked_buffer(check_uint("nbytes", nbytes, (1 << 63) - 1))

    def free_cpu_locked_buffer(self, buffer: Any) -> bool:
        """Stops tracking a buffer from new_cpu_locked_buffer (memory goes with its last user)."""
        return self._h.free_cpu_locked_buffer(lendable(buffer))

    def new_cpu_locked_tensor(
        self, num_elem: int, example_tensor: Any = None, **kwargs: Any
    ) -> Any:
        """A 1-D CPU tensor of `num_elem` elements of example_tensor's dtype, in pinned memory.

        Only the dtype of `example_tensor` is used (a torch.dtype is accepted too). The tensor
        keeps its memory alive; free_cpu_locked_tensor() makes the handle forget it.
        """
        torch = _torch()
        if example_tensor is None:
            example_tensor = kwargs.pop("example_tenosr", None)  # DeepNVMe's spelling
        if kwargs:
            raise TypeError(f"fastpersist: unexpected keyword arguments {sorted(kwargs)}")
        if example_tensor is None:
            raise TypeError(
                "fastpersist: new_cpu_locked_tensor needs an example tensor (or a dtype)"
            )
        dtype = example_tensor if isinstance(example_tensor, torch.dtype) else example_tensor.dtype
        num_elem = check_uint("num_elem", int(num_elem), (1 << 62) - 1)
        element_size = torch.empty((), dtype=dtype).element_size()
        nbytes = num_elem * element_size
        if nbytes == 0:
            return torch.empty(0, dtype=dtype)
        pinned = self.new_cpu_locked_buffer(nbytes)
        # frombuffer keeps `pinned` (which owns the memory) referenced by the tensor's storage.
        return torch.frombuffer(pinned, dtype=torch.uint8, count=nbytes).view(dtype)

    def free_cpu_locked_tensor(self, tensor: Any) -> bool:
        """Makes the handle forget a tensor from new_cpu_locked_tensor; False if unknown."""
        return self.free_cpu_locked_buffer(tensor)

    def new_cpu_locked_array(
        self, shape: Union[int, "tuple[int, ...]"], dtype: Any = "uint8"
    ) -> Any:
        """numpy twin of new_cpu_locked_tensor: a writable array in pinned memory."""
        import numpy

        dtype = numpy.dtype(dtype)
        shape_tuple = (shape,) if isinstance(shape, int) else tuple(shape)
        count = 1
        for dim in shape_tuple:
            count *= check_uint("shape", int(dim), (1 << 62) - 1)
        nbytes = count * dtype.itemsize
        if nbytes == 0:
            return numpy.empty(shape_tuple, dtype=dtype)
        pinned = self.new_cpu_locked_buffer(nbytes)
        return (
            numpy.frombuffer(memoryview(pinned), dtype=numpy.uint8, count=nbytes)
            .view(dtype)
            .reshape(shape_tuple)
        )

    def is_pinned(self, tensor: Any) -> bool:
        """True for memory inside this handle's locked buffers, or a torch-pinned tensor
        (False for a CUDA tensor: device memory is not host memory, pinned or not)."""
        if is_torch_tensor(tensor) and tensor.is_cuda:
            return False
        if self._h.is_pinned(lendable(tensor)):
            return True
        if is_torch_tensor(tensor):
            try:
                return bool(tensor.is_pinned())
            except RuntimeError:  # CPU-only torch builds may refuse to answer
                return False
        return False

    # ---------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Waits for outstanding requests (raising their first error) and frees the handle."""
        if self._h.closed:
            return
        try:
            self.wait()
        finally:
            self._h.close()
            self._keepalive.release_all()

    def __enter__(self) -> "AioHandle":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # already failing: finish the I/O, but don't mask the original error
            self.close()
        except Exception:
            pass

    def __del__(self) -> None:
        h = getattr(self, "_h", None)
        if h is not None and not h.closed:
            h.close()  # waits for requests in flight before their buffers may go away
        keepalive = getattr(self, "_keepalive", None)
        if keepalive is not None:
            keepalive.release_all()

    def __repr__(self) -> str:
        if self._h.closed:
            return f"<fastpersist.{type(self).__name__} closed>"
        return (
            f"<fastpersist.{type(self).__name__} backend={self.backend} block_size={self.get_block_size()} "
            f"queue_depth={self.get_queue_depth()} "
            f"intra_op_parallelism={self.get_intra_op_parallelism()}>"
        )

    # ---------------------------------------------------------------- internals
    def _transfer(
        self,
        is_write: bool,
        buffer: Any,
        target: Union[str, int],
        file_offset: int,
        validate: bool,
        async_op: bool,
        truncate: bool,
    ) -> int:
        if async_op:
            return self._async(is_write, buffer, target, file_offset, bool(validate), truncate)
        return self._sync(is_write, buffer, target, file_offset, bool(validate), truncate)

    def _async(
        self, is_write: bool, buffer: Any, target: Union[str, int], file_offset: int,
        validate: bool, truncate: bool,
    ) -> int:
        buffer = lendable(buffer)
        offset = _check_offset(file_offset)
        settle_device_memory(buffer)
        h = self._h
        if isinstance(target, int):
            _check_fd_request(validate, truncate)
            fn = h.async_pwrite_fd if is_write else h.async_pread_fd
            pin = fn(buffer, target, offset)
        elif validate:
            if is_write:
                pin = h.pwrite(buffer, target, True, True, offset, bool(truncate)).pin
            else:
                pin = h.pread(buffer, target, True, True, offset).pin
        elif is_write:
            pin = h.async_pwrite(buffer, target, offset, bool(truncate))
        else:
            pin = h.async_pread(buffer, target, offset)
        self._keepalive.submitted(pin)
        return 0

    def _sync(
        self, is_write: bool, buffer: Any, target: Union[str, int], file_offset: int,
        validate: bool, truncate: bool,
    ) -> int:
        buffer = lendable(buffer)
        offset = _check_offset(file_offset)
        settle_device_memory(buffer)
        h = self._h
        if isinstance(target, int):
            _check_fd_request(validate, truncate)
            # No sync call on a descriptor in the C++ API: submit, then drain like wait().
            self._async(is_write, buffer, target, offset, False, False)
            return self.wait()
        # A sync call drains the handle like wait(), so it counts as a drain (_keepalive.py).
        with self._keepalive.drain(collects_pending=False):
            if validate:
                if is_write:
                    return h.pwrite(buffer, target, True, False, offset, bool(truncate)).completed
                return h.pread(buffer, target, True, False, offset).completed
            if is_write:
                return h.sync_pwrite(buffer, target, offset, bool(truncate))
            return h.sync_pread(buffer, target, offset)


def _check_fd_request(validate: bool, truncate: bool) -> None:
    if validate:
        raise ValueError("fastpersist: validate needs a file name, not a file descriptor")
    if truncate:
        raise ValueError("fastpersist: truncate applies to writes by file name; a caller's file "
                         "descriptor is never truncated")


def _async_flag(async_op: bool, kwargs: dict) -> bool:
    if "async" in kwargs:
        value = kwargs.pop("async")
        if async_op:
            raise TypeError("fastpersist: pass either async or async_op, not both")
        async_op = value
    if kwargs:
        raise TypeError(f"fastpersist: unexpected keyword arguments {sorted(kwargs)}")
    return bool(async_op)


# DeepNVMe's spelling.
aio_handle = AioHandle
