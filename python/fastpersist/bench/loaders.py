# SPDX-License-Identifier: Apache-2.0
"""``python -m fastpersist.bench load``: how fast a checkpoint comes back from storage.

The checkpoint is saved once (``fastpersist.save``: a standard zip-format torch file that plain
``torch.load`` reads), then every loop evicts it from the page cache and times each loader on
the cold file, in an order that rotates from loop to loop:

- ``torch_load``: ``torch.load(path, weights_only=True)``, buffered reads through the page cache;
- ``fastpersist_load``: ``fastpersist.load(path)``, one parallel O_DIRECT read into one aligned
  buffer, every tensor a view of it (no second copy);
- ``safetensors_load``: ``safetensors.torch.load_file`` on a safetensors copy of the same
  tensors (when safetensors is installed), plus a read of one byte per page, as it maps the
  file and would otherwise read nothing.

Each load is checked against the saved tensors (outside the timing) once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import mmap
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .. import serialization


@dataclass
class LoadResult:
    tag: str
    nbytes: int
    seconds: List[float] = field(default_factory=list)
    skipped: str = ""

    @staticmethod
    def line_for(tag: str, nbytes: int, seconds: float) -> str:
        gb = nbytes / 1e9
        return f"{tag} -- {gb:.2f} GB, {seconds:.2f} secs, {gb / seconds if seconds > 0 else 0.0:.2f} GB/s"

    def rate(self, seconds: float) -> float:
        return self.nbytes / 1e9 / seconds if seconds > 0 else 0.0

    def best(self) -> float:
        return max(self.rate(s) for s in self.seconds)

    def median(self) -> float:
        return statistics.median(self.rate(s) for s in self.seconds)


# ------------------------------------------------------------------ page cache control
_libc: Optional[ctypes.CDLL] = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        _libc.mincore.restype = ctypes.c_int
    return _libc


def cached_fraction(path: str) -> float:
    """The fraction of the file's pages in the page cache (mincore over a private mapping,
    which reports the page cache's pages as long as nothing writes to it)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    page = mmap.PAGESIZE
    pages = (size + page - 1) // page
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        anchor = ctypes.c_char.from_buffer(m)  # the mapping's first byte, for its address
        try:
            rc = _c().mincore(ctypes.addressof(anchor), size, vec)
        finally:
            del anchor  # the mapping cannot close while a ctypes object exports it
        if rc != 0:
            return -1.0
    return sum(v & 1 for v in vec) / pages


def drop_all_caches() -> None:
    """Writes back every dirty page and drops the whole page cache (and the dentry and inode
    caches), so the next read of any file starts cold. Needs root; without it only the
    write-back happens (direct reads bypass the cache anyway)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def evict(path: str, drop_caches: bool = False) -> float:
    """Writes the file back and drops its pages from the page cache; returns the fraction of
    its pages still cached afterwards (0.0 when the eviction worked)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if drop_caches:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")
        except OSError:
            pass
    try:
        return cached_fraction(path)
    except OSError:
        return -1.0


# ------------------------------------------------------------------ the checkpoint
def _unique_tensors(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (GPT-2's tied embeddings): keep the first."""
    seen = set()
    out = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.contiguous()
    return out


def _touch(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """safetensors maps the file and reads a page only when it is first used: read one byte of
    every page, so the timing covers getting the bytes off the storage, as for the others."""
    for t in state.values():
        if t.numel():
            t.reshape(-1).view(torch.uint8)[::4096].sum()
    return state


def _check(loaded: Dict[str, torch.Tensor], expected: Dict[str, torch.Tensor], tag: str) -> None:
    missing = set(expected) - set(loaded)
    if missing:
        raise AssertionError(f"{tag}: {len(missing)} tensors missing, e.g. {sorted(missing)[:3]}")
    for name, t in expected.items():
        if not torch.equal(loaded[name], t):
            raise AssertionError(f"{tag}: tensor {name!r} differs from the saved one")


def run_load(state: Dict[str, torch.Tensor], folder: str, stem: str, loops: int,
             drop_caches: bool = False, safetensors: bool = True) -> Dict[str, LoadResult]:
    path = os.path.join(folder, f"load_{stem}.pt")
    st_path = os.path.join(folder, f"load_{stem}.safetensors")
    loaders: List[Tuple[str, str, Callable[[], Any]]] = [
        ("torch_load", path, lambda: torch.load(path, weights_only=True)),
        ("fastpersist_load", path, lambda: serialization.load(path)),
    ]
    results: Dict[str, LoadResult] = {}
    try:
        start = time.perf_counter()
        serialization.save(state, path)
        print(f"# saved {os.path.getsize(path) / 1e9:.2f} GB with fastpersist.save in "
              f"{time.perf_counter() - start:.2f}s: {path}", flush=True)
        if safetensors:
            try:
                from safetensors.torch import load_file, save_file
            except ImportError:
                results["safetensors_load"] = LoadResult("safetensors_load", 0,
                                                         skipped="safetensors is not installed")
            else:
                save_file(_unique_tensors(state), st_path)
                loaders.append(("safetensors_load", st_path, lambda: _touch(load_file(st_path))))
        for tag, p, _ in loaders:
            results[tag] = LoadResult(tag, os.path.getsize(p))
        for r in results.values():
            if r.skipped:
                print(f"{r.tag} -- skipped: {r.skipped}", flush=True)
        checked = set()
        for loop in range(loops):
            k = loop % len(loaders)
            for tag, p, fn in loaders[k:] + loaders[:k]:
                left = evict(p, drop_caches)
                if left > 0.01:
                    print(f"# warning: {left:.0%} of {p} still in the page cache after eviction",
                          flush=True)
                t0 = time.perf_counter()
                obj = fn()
                seconds = time.perf_counter() - t0
                results[tag].seconds.append(seconds)
                print(LoadResult.line_for(tag, results[tag].nbytes, seconds), flush=True)
                if tag not in checked:
                    expected = _unique_tensors(state) if tag == "safetensors_load" else state
                    _check(obj, expected, tag)
                    checked.add(tag)
                del obj
                gc.collect()
    finally:
        for p in (path, st_path):
            if os.path.exists(p):
                os.unlink(p)
    return results


def print_summary(results: Dict[str, LoadResult]) -> None:
    done = {t: r for t, r in results.items() if r.seconds}
    if not done:
        return
    print(f"# cold-file load, {len(next(iter(done.values())).seconds)} loops, GB/s best / median:")
    for tag, r in done.items():
        print(f"#   {tag:18s} {r.best():6.2f} / {r.median():6.2f}")
    if "torch_load" in done and "fastpersist_load" in done:
        fp, tl = done["fastpersist_load"], done["torch_load"]
        print(f"# fastpersist_load / torch_load: best {fp.best() / tl.best():.2f}x, "
              f"median {fp.median() / tl.median():.2f}x", flush=True)
