# SPDX-License-Identifier: Apache-2.0
"""The save mechanisms a benchmark compares, each timed end to end (file closed, and for the
durable ones synced). The tags they report follow DeepSpeedExamples' ``torch_save_utils.py``
(``test_save``, ``test_ds_aio_fast_save``, ...), so that its readers recognize each row; the
functions are named after their mechanism (``save_torch``, ``save_ds_aio_fast``, ...)."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import IO, Any, Callable, Dict, List, Optional, cast

import torch

from .. import serialization
from ..writer import MockFileWriter, PyFileWriter

_MiB = 1 << 20


@dataclass
class SaveResult:
    tag: str
    nbytes: int
    seconds: float
    stats: Optional[Dict[str, Any]] = None
    skipped: str = ""

    def line(self) -> str:
        if self.skipped:
            return f"{self.tag} -- skipped: {self.skipped}"
        gb = self.nbytes / 1e9
        rate = gb / self.seconds if self.seconds > 0 else 0.0
        return f"{self.tag} -- {gb:.2f} GB, {self.seconds:.2f} secs, {rate:.2f} GB/s"


@dataclass
class SaveSettings:
    folder: str
    io_buffer_mb: int = 64
    single_io_buffer: bool = False
    zipfile: bool = False
    show_statistics: bool = True
    gpu: bool = False


def _torch_save_kwargs(s: SaveSettings) -> Dict[str, Any]:
    return {"_use_new_zipfile_serialization": s.zipfile}


def _timed(tag: str, path: str, fn: Callable[[], Optional[Dict[str, Any]]]) -> SaveResult:
    if os.path.exists(path):
        os.unlink(path)
    start = time.perf_counter()
    stats = fn()
    seconds = time.perf_counter() - start
    nbytes = os.path.getsize(path) if os.path.exists(path) else int((stats or {}).get("bytes", 0))
    return SaveResult(tag, nbytes, seconds, stats)


def save_torch(obj: Any, path: str, s: SaveSettings) -> SaveResult:
    return _timed("test_save", path, lambda: torch.save(obj, path, **_torch_save_kwargs(s)))


def save_torch_fsync(obj: Any, path: str, s: SaveSettings) -> SaveResult:
    def run() -> None:
        torch.save(obj, path, **_torch_save_kwargs(s))
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    return _timed("test_save_fsync", path, run)


def save_ds_mock(obj: Any, path: str, s: SaveSettings) -> SaveResult:
    def run() -> Dict[str, Any]:
        with MockFileWriter(path) as f:
            torch.save(obj, f, **_torch_save_kwargs(s))
        return f.stats()

    return _timed("test_ds_mock_save", path, run)


def save_ds_py(obj: Any, path: str, s: SaveSettings) -> SaveResult:
    def run() -> Dict[str, Any]:
        with PyFileWriter(path) as f:
            torch.save(obj, f, **_torch_save_kwargs(s))
        return f.stats()

    return _timed("test_ds_py_save", path, run)


def save_ds_aio_fast(obj: Any, path: str, s: SaveSettings) -> SaveResult:
    def run() -> Dict[str, Any]:
        return serialization.save(obj, path, use_legacy_format=not s.zipfile,
                                  io_buffer_mb=s.io_buffer_mb, single_io_buffer=s.single_io_buffer)

    rss_before = reset_peak_rss()
    result = _timed("test_ds_aio_fast_save", path, run)
    if result.stats is not None and rss_before is not None:
        # Peak resident memory the save added: the pinned staging buffer (when the pool had
        # none yet) plus torch's pickle, whatever the checkpoint size.
        result.stats["peak_rss_growth_bytes"] = max(0, status_kib("VmHWM") * 1024 - rss_before)
    if s.show_statistics and result.stats is not None:
        print(f"  fastpersist stats = {_format_stats(result.stats)}")
    return result


def status_kib(key: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM, ...)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def reset_peak_rss() -> Optional[int]:
    """Resets the process's peak RSS (VmHWM) to its current RSS; returns that RSS in bytes, or
    None where /proc does not allow it (then no growth is reported)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return status_kib("VmRSS") * 1024
    except (OSError, KeyError):
        return None


def save_ds_gds_fast(obj: Any, path: str, s: SaveSettings) -> SaveResult:
    """DeepSpeedExamples' GDS tag: torch.save into a double buffer in GPU memory, written by
    cuFile (bench/gds_writer.py). Skipped, saying why, without --gpu or without cuFile."""
    if not s.gpu:
        return SaveResult("test_ds_gds_fast_save", 0, 0.0, skipped="needs --gpu")
    from ..gds_handle import gds_info

    why = gds_info().unavailable_reason()
    if why:
        return SaveResult("test_ds_gds_fast_save", 0, 0.0, skipped=why)
    from .gds_writer import GdsStreamWriter

    def run() -> Dict[str, Any]:
        with GdsStreamWriter(path, io_buffer_mb=s.io_buffer_mb) as f:
            # A file object by duck typing (write/flush), as torch.save accepts.
            torch.save(obj, cast(IO[bytes], f), **_torch_save_kwargs(s))
            stats = f.stats()
        return stats

    return _timed("test_ds_gds_fast_save", path, run)


class DeepSpeedWriter:
    """DeepSpeed's own FastFileWriter with the settings of DeepSpeedExamples' torch_save_utils:
    one aio handle (8 MiB blocks, queue depth 8, one thread) and one pinned buffer, made once
    and reused by every :meth:`save` (as a training job does). Raises RuntimeError saying why
    where DeepSpeed cannot run."""

    def __init__(self, io_buffer_mb: int = 64, double_buffer: bool = True) -> None:
        try:
            # the ignores: import-not-found without deepspeed, import-untyped with it
            from deepspeed.io import (  # type: ignore[import-not-found, import-untyped]
                FastFileWriter, FastFileWriterConfig)
            from deepspeed.ops.op_builder import (  # type: ignore[import-not-found, import-untyped]
                AsyncIOBuilder)
        except Exception as e:  # noqa: BLE001 - any import failure means "not available"
            raise RuntimeError(f"deepspeed not importable ({e})") from e
        _patch_deepspeed_utils_op()
        if not AsyncIOBuilder().is_compatible():
            raise RuntimeError("DeepSpeed async_io op incompatible")
        self._writer, self._config = FastFileWriter, FastFileWriterConfig
        self._double_buffer = double_buffer
        self._handle = AsyncIOBuilder().load(verbose=False).aio_handle(8 * _MiB, 8, False, False, 1)
        self._pinned = self._handle.new_cpu_locked_tensor(io_buffer_mb * _MiB,
                                                          torch.empty(0, dtype=torch.uint8))

    def save(self, obj: Any, path: str, **torch_save_kwargs: Any) -> None:
        cfg = self._config(dnvme_handle=self._handle, pinned_tensor=self._pinned,
                           double_buffer=self._double_buffer, num_parallel_writers=1, writer_rank=0)
        w = self._writer(file_path=path, config=cfg)
        torch.save(obj, w, **torch_save_kwargs)
        w.close()

    def close(self) -> None:
        if self._pinned is not None:
            self._handle.free_cpu_locked_tensor(self._pinned)
            self._pinned = None


def deepspeed_fast_save(obj: Any, path: str, s: SaveSettings) -> SaveResult:
    """DeepSpeed's own FastFileWriter (:class:`DeepSpeedWriter`), its set-up untimed."""
    try:
        writer = DeepSpeedWriter(s.io_buffer_mb, double_buffer=not s.single_io_buffer)
    except RuntimeError as e:
        return SaveResult("deepspeed_fast_save", 0, 0.0, skipped=str(e))
    try:
        return _timed("deepspeed_fast_save", path,
                      lambda: writer.save(obj, path, **_torch_save_kwargs(s)))
    finally:
        writer.close()


class _TorchCastToByteTensor:
    """Stands in for DeepSpeed's ``UtilsBuilder`` op where it cannot load (its CPU accelerator has
    no implementation, so ``FastFileWriter()`` raises). The op's ``cast_to_byte_tensor`` is used
    only by ``save_torch_storage_object_list``, which stock torch never calls; this is the same
    zero-copy reinterpretation written with torch views, so DeepSpeed's writer runs unchanged."""

    def load(self, *args: Any, **kwargs: Any) -> "_TorchCastToByteTensor":
        return self

    @staticmethod
    def cast_to_byte_tensor(tensors: Any) -> Any:
        def one(t: torch.Tensor) -> torch.Tensor:
            return t if t.element_size() <= 1 else t.reshape(-1).view(torch.uint8)

        return [one(t) for t in tensors] if isinstance(tensors, (list, tuple)) else one(tensors)


def _patch_deepspeed_utils_op() -> None:
    import deepspeed.io.fast_file_writer as ds_ffw  # type: ignore[import-not-found, import-untyped]

    if isinstance(ds_ffw.UtilsBuilder, type) and issubclass(ds_ffw.UtilsBuilder, _TorchCastToByteTensor):
        return
    try:
        ds_ffw.UtilsBuilder().load()
    except Exception:  # noqa: BLE001 - "not implemented on CPU backend" and build failures
        ds_ffw.UtilsBuilder = _TorchCastToByteTensor


def _format_stats(stats: Dict[str, Any]) -> str:
    keys = ("bytes", "write_secs", "fill_bytes", "fill_secs", "zero_copy_bytes", "slow_path_bytes",
            "io_wait_secs", "drains", "pinned_bytes", "peak_rss_growth_bytes")
    return "{" + ", ".join(f"{k}: {stats[k]:.3f}" if isinstance(stats[k], float) else
                           f"{k}: {stats[k]}" for k in keys if k in stats) + "}"


Saver = Callable[[Any, str, SaveSettings], SaveResult]

# Every mechanism, in the order they run, under the tag it reports (what --only selects).
ALL: Dict[str, Saver] = {
    "test_save": save_torch,
    "test_save_fsync": save_torch_fsync,
    "test_ds_mock_save": save_ds_mock,
    "test_ds_py_save": save_ds_py,
    "test_ds_aio_fast_save": save_ds_aio_fast,
    "test_ds_gds_fast_save": save_ds_gds_fast,
    "deepspeed_fast_save": deepspeed_fast_save,
}


def settle() -> None:
    """Untimed, between two measurements: write back every dirty page and let the journal commit
    (on a filesystem mounted with ``discard`` that is also when the blocks of the file just
    deleted are discarded), so one mechanism's leftovers do not slow the next one down."""
    os.sync()


def run_all(obj: Any, s: SaveSettings, file_stem: str,
            only: Optional[List[str]] = None, loops: int = 1, rotate: int = 0,
            warmup: bool = True) -> List[SaveResult]:
    """Runs every mechanism on `obj` (GPU state is used as is); prints and returns the results.

    With ``loops > 1`` each loop runs every mechanism once, starting one mechanism later than
    the loop before, so that no mechanism always follows the same one. With `warmup`, the
    first mechanism runs once untimed before anything is measured: the first save of a process
    pays for faulting in the state's pages and for the folder's first allocations, which once
    made the first line of a run (test_save) read 0.44 GB/s against 1.73 for the next one."""
    chosen = [(tag, saver) for tag, saver in ALL.items() if not only or tag in only]
    results = []
    if warmup and chosen:
        first_tag, first = chosen[rotate % len(chosen)]
        path = os.path.join(s.folder, f"warmup_{file_stem}.pt")
        quiet = dataclasses.replace(s, show_statistics=False)
        print(f"# warm-up, untimed: {first_tag}", flush=True)
        first(obj, path, quiet)
        if os.path.exists(path):
            os.unlink(path)
        settle()
    for loop in range(loops):
        k = (loop + rotate) % len(chosen) if chosen else 0
        for tag, saver in chosen[k:] + chosen[:k]:
            path = os.path.join(s.folder, f"{tag}_{file_stem}.pt")
            settle()
            result = saver(obj, path, s)
            print(result.line(), flush=True)
            results.append(result)
            if os.path.exists(path):
                os.unlink(path)
    settle()
    return results
