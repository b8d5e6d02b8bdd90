# SPDX-License-Identifier: Apache-2.0
"""The save mechanisms a benchmark compares, each timed end to end (file closed, and for the
durable ones synced). Tags follow DeepSpeedExamples' ``torch_save_utils.py``."""

from __future__ import annotations

import ctypes.util
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

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


def test_save(obj: Any, path: str, s: SaveSettings) -> SaveResult:
    return _timed("test_save", path, lambda: torch.save(obj, path, **_torch_save_kwargs(s)))


def test_save_fsync(obj: Any, path: str, s: SaveSettings) -> SaveResult:
    def run() -> None:
        torch.save(obj, path, **_torch_save_kwargs(s))
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    return _timed("test_save_fsync", path, run)


def test_ds_mock_save(obj: Any, path: str, s: SaveSettings) -> SaveResult:
    def run() -> Dict[str, Any]:
        with MockFileWriter(path) as f:
            torch.save(obj, f, **_torch_save_kwargs(s))
        return f.stats()

    return _timed("test_ds_mock_save", path, run)


def test_ds_py_save(obj: Any, path: str, s: SaveSettings) -> SaveResult:
    def run() -> Dict[str, Any]:
        with PyFileWriter(path) as f:
            torch.save(obj, f, **_torch_save_kwargs(s))
        return f.stats()

    return _timed("test_ds_py_save", path, run)


def test_ds_aio_fast_save(obj: Any, path: str, s: SaveSettings) -> SaveResult:
    def run() -> Dict[str, Any]:
        stats = serialization.save(obj, path, use_legacy_format=not s.zipfile,
                                   io_buffer_mb=s.io_buffer_mb, single_io_buffer=s.single_io_buffer)
        if s.show_statistics:
            print(f"  fastpersist stats = {_format_stats(stats)}")
        return stats

    return _timed("test_ds_aio_fast_save", path, run)


def test_ds_gds_fast_save(obj: Any, path: str, s: SaveSettings) -> SaveResult:
    if not s.gpu:
        return SaveResult("test_ds_gds_fast_save", 0, 0.0, skipped="needs --gpu")
    if ctypes.util.find_library("cufile") is None:
        return SaveResult("test_ds_gds_fast_save", 0, 0.0, skipped="cuFile (libcufile) not found")
    return SaveResult("test_ds_gds_fast_save", 0, 0.0,
                      skipped="GPUDirect Storage writes are not implemented yet")


def deepspeed_fast_save(obj: Any, path: str, s: SaveSettings) -> SaveResult:
    """DeepSpeed's own FastFileWriter with the settings of DeepSpeedExamples' torch_save_utils."""
    try:
        from deepspeed.io import FastFileWriter, FastFileWriterConfig
        from deepspeed.ops.op_builder import AsyncIOBuilder
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        return SaveResult("deepspeed_fast_save", 0, 0.0, skipped=f"deepspeed not importable ({e})")
    if not AsyncIOBuilder().is_compatible():
        return SaveResult("deepspeed_fast_save", 0, 0.0, skipped="DeepSpeed async_io op incompatible")
    h = AsyncIOBuilder().load(verbose=False).aio_handle(8 * _MiB, 8, False, False, 1)
    pinned = h.new_cpu_locked_tensor(s.io_buffer_mb * _MiB, torch.empty(0, dtype=torch.uint8))

    def run() -> None:
        cfg = FastFileWriterConfig(dnvme_handle=h, pinned_tensor=pinned,
                                   double_buffer=not s.single_io_buffer, num_parallel_writers=1,
                                   writer_rank=0)
        w = FastFileWriter(file_path=path, config=cfg)
        torch.save(obj, w, **_torch_save_kwargs(s))
        w.close()

    try:
        return _timed("deepspeed_fast_save", path, run)
    finally:
        h.free_cpu_locked_tensor(pinned)


def _format_stats(stats: Dict[str, Any]) -> str:
    keys = ("bytes", "write_secs", "fill_bytes", "fill_secs", "zero_copy_bytes", "slow_path_bytes",
            "io_wait_secs", "drains", "pinned_bytes")
    return "{" + ", ".join(f"{k}: {stats[k]:.3f}" if isinstance(stats[k], float) else
                           f"{k}: {stats[k]}" for k in keys if k in stats) + "}"


ALL: List[Callable[[Any, str, SaveSettings], SaveResult]] = [
    test_save,
    test_save_fsync,
    test_ds_mock_save,
    test_ds_py_save,
    test_ds_aio_fast_save,
    test_ds_gds_fast_save,
    deepspeed_fast_save,
]


def run_all(obj: Any, s: SaveSettings, file_stem: str,
            only: Optional[List[str]] = None) -> List[SaveResult]:
    """Runs every mechanism on `obj` (GPU state is used as is); prints and returns the results."""
    results = []
    for saver in ALL:
        if only and saver.__name__ not in only:
            continue
        path = os.path.join(s.folder, f"{saver.__name__}_{file_stem}.pt")
        result = saver(obj, path, s)
        print(result.line(), flush=True)
        results.append(result)
        if os.path.exists(path):
            os.unlink(path)
    return results
