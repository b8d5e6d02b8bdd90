# SPDX-License-Identifier: Apache-2.0
"""``python -m fastpersist.bench peers``: every checkpoint library this machine has, and
fastpersist, saving and loading the same tensors on the same folder, in one run.

Each round runs every save case, then every load case, in an order that rotates from round to
round; every load starts with the whole page cache dropped (root) and its files evicted. A case
measures wall time, the CPU time of the whole process (every thread; fio's own for the limit)
and the growth of the process's peak resident memory. Durable saves include their fsync.
Before the rounds, untimed: every mechanism is set up (DeepSpeed's op and pinned buffer, the
manager's staging memory), DCP's ``thread_count`` is chosen (the fastest of 1, 2 and 4), and
fio tries its candidate settings to find the limit (:mod:`fastpersist.bench.fio`).

Loads read what the round's saves wrote: torch.load, torch.load(mmap=True) and fastpersist.load
the ``torch.save`` + fsync file, safetensors its file, DCP its folder, the manager its own
checkpoint (into new memory, and ``into=`` existing warm tensors). Every loader's result is
checked against the saved tensors once, outside the timing.
"""

from __future__ import annotations

import gc
import os
import resource
import shutil
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch

from .. import serialization
from . import fio as fio_limit
from .loaders import drop_all_caches, evict
from .savers import DeepSpeedWriter, reset_peak_rss, status_kib
from .table import rotated
from .workloads import Workload

GB = 1e9
_MiB = 1 << 20


def _nothing() -> None:
    return None


@dataclass
class Case:
    """One mechanism. `run` does the timed work; for an async save it returns the seconds the
    call blocked its caller, for a load the loaded ``{name: tensor}`` (checked once)."""

    key: str
    name: str
    kind: str  # "save" or "load"
    run: Callable[[], Any]
    ours: bool = False
    limit: bool = False  # fio: the hardware limit, not a peer
    durable: bool = True
    before: Callable[[], None] = _nothing  # untimed, just before each run
    after: Callable[[], None] = _nothing  # untimed, just after each run
    in_place: bool = False  # loads into the workload's own tensors: a failure ends the run
    skipped: str = ""


@dataclass
class Sample:
    seconds: float
    cpu_seconds: float
    peak_bytes: Optional[int]  # growth of the process's peak RSS; None for fio
    blocking_seconds: Optional[float] = None


@dataclass
class CaseResult:
    case: Case
    nbytes: int
    samples: List[Sample] = field(default_factory=list)


# ------------------------------------------------------------------ measuring
def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(case: Case) -> "tuple[Sample, Any]":
    case.before()
    base = None if case.limit else reset_peak_rss()
    cpu0 = _cpu_self()
    t0 = time.perf_counter()
    value = case.run()
    seconds = time.perf_counter() - t0
    cpu = _cpu_self() - cpu0
    peak = None if base is None else max(0, status_kib("VmHWM") * 1024 - base)
    if case.limit:
        cpu = value.cpu_seconds
        seconds = value.seconds
    blocking = float(value) if case.kind == "save" and isinstance(value, float) else None
    return Sample(seconds, cpu, peak, blocking), value


# ------------------------------------------------------------------ the cases
@dataclass
class Setup:
    workload: Workload
    folder: str
    fio: Optional[str]
    fio_write: Optional[fio_limit.FioSettings] = None
    fio_read: Optional[fio_limit.FioSettings] = None
    fio_bytes: int = 0
    dcp_threads: int = 1
    log: Callable[[str], None] = print
    manager: Any = None
    closers: List[Callable[[], None]] = field(default_factory=list)

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def close(self) -> None:
        while self.closers:
            self.closers.pop()()


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _evict_tree(path: str) -> None:
    drop_all_caches()
    if os.path.isdir(path):
        for dirpath, _dirs, files in os.walk(path):
            for name in files:
                evict(os.path.join(dirpath, name))
    elif os.path.exists(path):
        evict(path)


def _touch_every_byte(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Reads every byte of every tensor (a mapped file's pages come off the storage here)."""
    for t in state.values():
        if t.numel():
            t.reshape(-1).view(torch.uint8).max()
    return state


def _touch_every_page(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    for t in state.values():
        if t.numel():
            t.reshape(-1).view(torch.uint8)[::4096].sum()
    return state


def _dcp() -> Any:
    import torch.distributed.checkpoint as dcp

    # One process, on purpose (no_dist=True): DCP's "assuming the intent is ... a single
    # process" warning would only interleave with the progress lines.
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    return dcp


def _dcp_save(state: Dict[str, torch.Tensor], path: str, threads: int) -> None:
    dcp = _dcp()
    from torch.distributed.checkpoint import FileSystemWriter

    dcp.save(state, storage_writer=FileSystemWriter(path, sync_files=True, thread_count=threads),
             no_dist=True)


def choose_dcp_threads(s: Setup, options: List[int]) -> int:
    """DCP's FileSystemWriter at its best: the fastest thread_count, each tried once, untimed
    for the results."""
    best, best_t = options[0], float("inf")
    path = s.path("peers-dcp-choose")
    for n in options:
        _remove(path)
        os.sync()
        t0 = time.perf_counter()
        _dcp_save(s.workload.tensors, path, n)
        t = time.perf_counter() - t0
        s.log(f"DCP FileSystemWriter thread_count={n}: {s.workload.nbytes / GB / t:.2f} GB/s")
        if t < best_t:
            best, best_t = n, t
    _remove(path)
    return best


def save_cases(s: Setup, available: Dict[str, str]) -> List[Case]:
    st = s.workload.tensors
    torch_path, st_path = s.path("peers-torch.pt"), s.path("peers.safetensors")
    dcp_path, nosync_path = s.path("peers-dcp"), s.path("peers-torch-nosync.pt")
    fp_path, ds_path = s.path("peers-fastpersist.pt"), s.path("peers-deepspeed.pt")
    cases: List[Case] = []

    def torch_save() -> None:
        torch.save(st, nosync_path)

    cases.append(Case("torch_save", "torch.save (no fsync: not durable)", "save", torch_save,
                      durable=False, before=lambda: _remove(nosync_path),
                      after=lambda: _remove(nosync_path)))

    def torch_save_fsync() -> None:
        torch.save(st, torch_path)
        _fsync(torch_path)

    cases.append(Case("torch_save_fsync", "torch.save + fsync", "save", torch_save_fsync,
                      before=lambda: _remove(torch_path)))

    def safetensors_save() -> None:
        from safetensors.torch import save_file

        save_file(st, st_path)
        _fsync(st_path)

    cases.append(Case("safetensors_save", "safetensors save_file + fsync", "save", safetensors_save,
                      before=lambda: _remove(st_path), skipped=available.get("safetensors", "")))
    cases.append(Case("dcp_save", f"DCP FileSystemWriter (thread_count {s.dcp_threads})", "save",
                      lambda: _dcp_save(st, dcp_path, s.dcp_threads),
                      before=lambda: _remove(dcp_path)))

    ds_skipped, ds = available.get("deepspeed", ""), None
    if not ds_skipped:
        try:
            ds = DeepSpeedWriter()
            s.closers.append(ds.close)
        except RuntimeError as e:
            ds_skipped = str(e)

    def deepspeed_save() -> None:
        assert ds is not None
        ds.save(st, ds_path)

    cases.append(Case("deepspeed_save", "DeepSpeed FastFileWriter", "save", deepspeed_save,
                      before=lambda: _remove(ds_path), after=lambda: _remove(ds_path),
                      skipped=ds_skipped))
    cases.append(Case("fastpersist_save", "fastpersist.save", "save",
                      lambda: serialization.save(st, fp_path), ours=True,
                      before=lambda: _remove(fp_path), after=lambda: _remove(fp_path)))
    mgr = _manager(s)

    def manager_sync() -> None:
        mgr.save("sync", st)

    def manager_async() -> float:
        t0 = time.perf_counter()
        handle = mgr.save_async("async", st)
        blocked = time.perf_counter() - t0
        handle.wait()
        return blocked

    cases.append(Case("manager_save", "CheckpointManager.save", "save", manager_sync, ours=True,
                      before=lambda: _drop_tag(mgr, "sync")))
    cases.append(Case("manager_save_async", "CheckpointManager.save_async", "save", manager_async,
                      ours=True, before=lambda: _drop_tag(mgr, "async"),
                      after=lambda: _drop_tag(mgr, "async")))
    if s.fio is not None and s.fio_write is not None:
        fio_path, fio_exe, w = s.path("peers-fio.dat"), s.fio, s.fio_write
        cases.append(Case("fio_write", f"fio O_DIRECT write ({w.label()})", "save",
                          lambda: fio_limit.run(fio_exe, "write", fio_path, s.fio_bytes, w),
                          limit=True))
    return cases


def load_cases(s: Setup, available: Dict[str, str]) -> List[Case]:
    wl = s.workload
    torch_path, st_path, dcp_path = s.path("peers-torch.pt"), s.path("peers.safetensors"), s.path("peers-dcp")
    mgr = _manager(s)
    ckpt = mgr.path("sync")
    cases: List[Case] = []
    cases.append(Case("torch_load", "torch.load", "load",
                      lambda: torch.load(torch_path, weights_only=True),
                      before=lambda: _evict_tree(torch_path)))
    cases.append(Case("torch_load_mmap", "torch.load(mmap=True), every byte read", "load",
                      lambda: _touch_every_byte(torch.load(torch_path, weights_only=True, mmap=True)),
                      before=lambda: _evict_tree(torch_path)))

    def safetensors_load() -> Dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        return _touch_every_page(load_file(st_path))

    cases.append(Case("safetensors_load", "safetensors load_file, every page read", "load",
                      safetensors_load, before=lambda: _evict_tree(st_path),
                      skipped=available.get("safetensors", "")))

    def zero_state() -> None:
        # In place, as a resume into a built model: the destination is warm but must not
        # already hold the answer (the check would then prove nothing).
        for t in wl.tensors.values():
            t.zero_()

    def evict_and_zero(path: str) -> Callable[[], None]:
        def prepare() -> None:
            _evict_tree(path)
            zero_state()
        return prepare

    def dcp_load() -> Dict[str, torch.Tensor]:
        _dcp().load(wl.tensors, storage_reader=_fs_reader(dcp_path), no_dist=True)
        return wl.tensors

    cases.append(Case("dcp_load", "DCP FileSystemReader (in place)", "load", dcp_load,
                      in_place=True, before=evict_and_zero(dcp_path)))
    cases.append(Case("fastpersist_load", "fastpersist.load", "load",
                      lambda: serialization.load(torch_path), ours=True,
                      before=lambda: _evict_tree(torch_path)))
    cases.append(Case("manager_load", "CheckpointManager.load (new memory, verified)", "load",
                      lambda: mgr.load("sync"), ours=True, before=lambda: _evict_tree(ckpt)))
    cases.append(Case("manager_load_into", "CheckpointManager.load into= (in place, verified)",
                      "load", lambda: mgr.load("sync", into=wl.tensors), ours=True, in_place=True,
                      before=evict_and_zero(ckpt)))
    if s.fio is not None and s.fio_read is not None:
        fio_path, fio_exe, r = s.path("peers-fio.dat"), s.fio, s.fio_read
        cases.append(Case("fio_read", f"fio O_DIRECT read ({r.label()})", "load",
                          lambda: fio_limit.run(fio_exe, "read", fio_path, s.fio_bytes, r),
                          limit=True))
    return cases


def _fs_reader(path: str) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(path)


def _manager(s: Setup) -> Any:
    """The run's CheckpointManager, its staging memory allocated before anything is timed (a
    training job keeps its manager)."""
    if s.manager is None:
        from ..checkpoint import CheckpointManager

        root = s.path("peers-manager")
        shutil.rmtree(root, ignore_errors=True)
        mgr = CheckpointManager(root)
        mgr.save("warmup", s.workload.tensors)
        mgr.remove("warmup")
        s.manager = mgr

        def close() -> None:
            mgr.close()
            s.manager = None
            shutil.rmtree(root, ignore_errors=True)
        s.closers.append(close)
    return s.manager


def _drop_tag(mgr: Any, tag: str) -> None:
    if os.path.isdir(mgr.path(tag)):
        mgr.remove(tag)


def availability() -> Dict[str, str]:
    """Why a peer cannot run here (missing package), by package."""
    out: Dict[str, str] = {}
    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        out["safetensors"] = "safetensors is not installed"
    try:
        from deepspeed.ops.op_builder import AsyncIOBuilder  # type: ignore[import-not-found, import-untyped]

        if not AsyncIOBuilder().is_compatible():
            out["deepspeed"] = "DeepSpeed's async_io op cannot build here (libaio-dev missing?)"
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        out["deepspeed"] = f"deepspeed is not importable ({type(e).__name__}: {e})"
    return out


# ------------------------------------------------------------------ the run
def run(s: Setup, rounds: int, only: Optional[List[str]] = None) -> List[CaseResult]:
    """Every case `rounds` times (see the module docstring); returns the results, skipped
    cases included (without samples)."""
    available = availability()
    saves = [c for c in save_cases(s, available) if not only or c.key in only]
    loads = [c for c in load_cases(s, available) if not only or c.key in only]
    results = {c.key: CaseResult(c, s.fio_bytes if c.limit else s.workload.nbytes) for c in saves + loads}
    checked = set()
    for r in range(rounds):
        for phase in (saves, loads):
            for case in rotated([c for c in phase if not c.skipped], r):
                os.sync()
                s.log(f"round {r + 1}/{rounds}: {case.name}")
                try:
                    sample, value = measure(case)
                except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
                    if case.in_place:
                        raise RuntimeError(f"{case.name} failed after the workload's tensors were "
                                           "zeroed for it, so the run cannot go on") from e
                    case.skipped = f"failed: {type(e).__name__}: {e}"
                    s.log(f"  {case.key} failed, left out: {case.skipped}")
                    continue
                if case.kind == "load" and not case.limit and case.key not in checked:
                    s.workload.check(value, case.name)
                    checked.add(case.key)
                del value
                gc.collect()
                case.after()
                results[case.key].samples.append(sample)
                s.log(f"  {s.workload.nbytes / GB / sample.seconds:.2f} GB/s, {sample.seconds:.2f} s")
    return list(results.values())
