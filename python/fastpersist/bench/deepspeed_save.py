# SPDX-License-Identifier: Apache-2.0
"""``python -m fastpersist.bench deepspeed``: the seed's ``deepspeed_save_model.py``. A Hugging Face
model (built from its config) in a DeepSpeed engine saves one tag per checkpoint engine through
``engine.save_checkpoint``, then loads it back cold through ``engine.load_checkpoint``:

- ``ds_torch_engine``: DeepSpeed's TorchCheckpointEngine as it is (page cache, no fsync);
- ``ds_torch_engine_fsync``: the same, with an fsync of every file and of the tag folder;
- ``ds_fast_engine``: DeepSpeed's FastCheckpointEngine, where DeepSpeed can build it (it needs an
  accelerator: skipped with DeepSpeed's error elsewhere);
- ``fastpersist``: fastpersist.deepspeed.install(engine), synchronous;
- ``fastpersist_async``: the same with async_save=True: the time save_checkpoint blocks, what the
  next training step pays (its time minus a step without a save), and the time to the commit;
- ``fastpersist_zstd``: compression="zstd" (a split tag: readable through fastpersist, or after
  ``fastpersist convert``);
- ``fastpersist_incremental``: incremental=True, saved after an untimed full base with no step
  between (frozen weights): what a save costs when nothing changed.

Each line reads ``tag -- X GB, Y secs, Z GB/s`` (sizes summed over the tag folder) and says
whether the tag is durable when the save returns. With fio installed, fio's best O_DIRECT write
of the same size runs first, as the bound. Every rank (``--world N``: N processes, gloo) saves
its share; rank 0 prints.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import shutil
import socket
import sys
import threading
import time
from typing import Any, Dict, List, Optional

import torch

from . import fio as fio_bench
from . import models

_GB = 1e9


def add_parser(sub: Any) -> None:
    p = sub.add_parser("deepspeed", help="save a Hugging Face model with engine.save_checkpoint, "
                       "once per checkpoint engine (DeepSpeed's and fastpersist's)")
    p.add_argument("--folder", required=True, help="I/O folder (e.g. an NVMe mount)")
    p.add_argument("--model", required=True, choices=sorted(models.MODELS))
    p.add_argument("--optimizer", action="store_true",
                   help="Adam state in the checkpoint (one training step materializes it)")
    p.add_argument("--zero_stage", type=int, default=0, choices=(0, 1, 2, 3))
    p.add_argument("--half", action="store_true", help="bf16 weights (DeepSpeed's bf16 mode)")
    p.add_argument("--zipfile", action="store_true",
                   help="accepted for the seed's command line: DeepSpeed's engines always write "
                        "torch's zip format")
    p.add_argument("--io_buffer_mb", type=int, default=64,
                   help="pinned staging MiB per file writer (default 64)")
    p.add_argument("--single_io_buffer", action="store_true", help="disable double buffering")
    p.add_argument("--world", type=int, default=1, help="ranks (processes, gloo; default 1)")
    p.add_argument("--only", nargs="*", default=None, metavar="TAG", help="run only these tags")
    p.add_argument("--no-fio", dest="fio", action="store_false", help="skip the fio bound")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="do not save once, untimed, before measuring (that first save pays for "
                        "faulting in the process's memory: without it the first line reads low)")


def run(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.folder):
        sys.exit(f"error: --folder {args.folder!r} is not a directory")
    if args.world < 1:
        sys.exit("error: --world must be at least 1")
    port = _free_port()
    try:
        if args.world == 1:
            _rank(0, args, port)
        else:
            import torch.multiprocessing as mp

            mp.spawn(_rank, args=(args, port), nprocs=args.world)
    finally:
        # DeepSpeed's CPU accelerator leaves a shared-memory all-reduce buffer per run in
        # /dev/shm (64 MiB each), which would add up run after run: remove this run's.
        for path in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_{port}_*"):
            with contextlib.suppress(OSError):
                os.unlink(path)
    return 0


# ----------------------------------------------------------------------------- one rank
def _rank(rank: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(args.world), LOCAL_RANK=str(rank),
                      LOCAL_SIZE=str(args.world))
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if not torch.cuda.is_available() else "cuda")
    import deepspeed  # type: ignore[import-not-found, import-untyped, unused-ignore]
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    say = print if rank == 0 else (lambda *a, **k: None)
    start = time.perf_counter()
    model = models.build(args.model)
    engine = _engine(deepspeed, model, args)
    step = _trainer(engine)
    if args.optimizer:
        step()  # materializes Adam's state, as the seed's --optimizer does
    base_step = min(_timed(step) for _ in range(2))
    say(f"# built {args.model} and its DeepSpeed engine (ZeRO {args.zero_stage}, "
        f"{'bf16' if args.half else 'fp32'}, {args.world} rank(s)) in "
        f"{time.perf_counter() - start:.1f}s; a training step takes {base_step:.2f}s", flush=True)
    root = os.path.join(args.folder, f"ds_{args.model}")
    if rank == 0:
        shutil.rmtree(root, ignore_errors=True)
    dist.barrier()
    def wanted(tag: str) -> bool:
        return args.only is None or tag in args.only

    results: List[Dict[str, Any]] = []

    def measure(tag: str, durable: str, save: Any, load: Any, after_save: Any = None) -> None:
        dist.barrier()
        t = time.perf_counter()
        with _PeakRss() as save_rss:
            save(tag)
            dist.barrier()
        seconds = time.perf_counter() - t
        size = _folder_bytes(os.path.join(root, tag))
        say(f"{tag} -- {size / _GB:.2f} GB, {seconds:.2f} secs, {size / _GB / seconds:.2f} GB/s "
            f"[{durable}]", flush=True)
        results.append({"tag": tag, "bytes": size, "save": seconds, "durable": durable,
                        "save_rss": save_rss.added})
        if after_save is not None:
            after_save(tag)
        _evict(os.path.join(root, tag))
        dist.barrier()
        t = time.perf_counter()
        _count_reading(engine)
        with _PeakRss() as load_rss:
            load(tag)
            dist.barrier()
        results[-1]["load"] = time.perf_counter() - t
        results[-1]["load_rss"] = load_rss.added
        reading = _reading_seconds(engine)
        say(f"{tag} -- load_checkpoint {results[-1]['load']:.2f} secs (cold files), of which "
            f"{reading:.2f} in the checkpoint engine's load() (reading and unpickling; the rest "
            f"is DeepSpeed's own work); memory added at the peak: save "
            f"{save_rss.added / _GB:.2f} GB, load {load_rss.added / _GB:.2f} GB", flush=True)
        if rank == 0:
            shutil.rmtree(os.path.join(root, tag), ignore_errors=True)
        dist.barrier()

    if args.warmup:  # DeepSpeed's own engine, untimed, into a folder removed at once
        engine.save_checkpoint(os.path.join(root, "warmup"), tag="warmup")
        dist.barrier()
        if rank == 0:
            shutil.rmtree(os.path.join(root, "warmup"), ignore_errors=True)
        dist.barrier()
    def stock_load(tag: str) -> Any:
        return engine.load_checkpoint(root, tag)

    if wanted("ds_torch_engine"):
        measure("ds_torch_engine", "not durable",
                lambda tag: engine.save_checkpoint(root, tag=tag), stock_load)
    if wanted("ds_torch_engine_fsync"):
        original = engine.checkpoint_engine
        engine.checkpoint_engine = _fsync_engine(original)
        measure("ds_torch_engine_fsync", "durable",
                lambda tag: engine.save_checkpoint(root, tag=tag), stock_load)
        engine.checkpoint_engine = original
    if wanted("ds_fast_engine"):
        fast, why = _deepspeed_fast_engine(engine, args)
        if fast is None:
            say(f"ds_fast_engine -- skipped: DeepSpeed cannot build its FastCheckpointEngine "
                f"here: {why}", flush=True)
        else:
            original = engine.checkpoint_engine
            engine.checkpoint_engine = fast
            measure("ds_fast_engine", "not durable",
                    lambda tag: engine.save_checkpoint(root, tag=tag), stock_load)
            engine.checkpoint_engine = original

    import fastpersist.deepspeed as fds

    knobs = {"io_buffer_mb": args.io_buffer_mb, "single_io_buffer": args.single_io_buffer}
    def ours_load(tag: str) -> Any:
        return fds.load_checkpoint(engine, root, tag, validate=False)

    if wanted("fastpersist"):
        fds.install(engine, **knobs)

        def validated_load(tag: str) -> None:
            stats = fds.installed(engine).save_stats
            say(f"fastpersist -- of the {stats.get('bytes', 0) / _GB:.2f} GB rank 0 saved, "
                f"{stats.get('borrowed_bytes', 0) / _GB:.2f} GB were written from the tensors' "
                f"own memory and {stats.get('copied_bytes', 0) / _GB:.2f} GB copied", flush=True)
            _evict(os.path.join(root, tag))
            dist.barrier()
            t = time.perf_counter()
            fds.load_checkpoint(engine, root, tag, validate=True)
            dist.barrier()
            results[-1]["validated_load"] = time.perf_counter() - t
            say(f"fastpersist -- load_checkpoint with validate=True "
                f"{results[-1]['validated_load']:.2f} secs (cold files)", flush=True)

        measure("fastpersist", "durable", lambda tag: engine.save_checkpoint(root, tag=tag),
                ours_load, after_save=validated_load)
    if wanted("fastpersist_async"):
        fds.install(engine, async_save=True, **knobs)
        timing: Dict[str, float] = {}

        def async_save(tag: str) -> None:
            t = time.perf_counter()
            engine.save_checkpoint(root, tag=tag)
            timing["blocked"] = time.perf_counter() - t
            t = time.perf_counter()
            step()  # commits the tag before it changes the weights
            timing["step"] = time.perf_counter() - t

        measure("fastpersist_async", "durable at the next step", async_save, ours_load,
                after_save=lambda tag: say(
                    f"fastpersist_async -- written from the tensors' own memory: "
                    f"{fds.installed(engine).save_stats.get('borrowed_bytes', 0) / _GB:.2f} GB, "
                    f"copied: {fds.installed(engine).save_stats.get('copied_bytes', 0) / _GB:.2f} GB",
                    flush=True))
        say(f"fastpersist_async -- save_checkpoint blocked {timing['blocked']:.2f} secs; the next "
            f"step took {timing['step']:.2f} secs (a step alone: {base_step:.2f}), so training "
            f"paid {timing['blocked'] + max(0.0, timing['step'] - base_step):.2f} secs", flush=True)
        results[-1]["blocked"] = timing["blocked"]
        results[-1]["step_paid"] = max(0.0, timing["step"] - base_step)
        # The row's save time is what training paid (the line above has the time to commit).
        results[-1]["save"] = timing["blocked"] + results[-1]["step_paid"]
    if wanted("fastpersist_zstd"):  # a split tag: storages compressed on every core
        fds.install(engine, compression="zstd", **knobs)
        measure("fastpersist_zstd", "durable", lambda tag: engine.save_checkpoint(root, tag=tag),
                ours_load, after_save=lambda tag: say(
                    f"fastpersist_zstd -- {fds.installed(engine).save_stats.get('bytes', 0) / _GB:.2f}"
                    f" GB of files stored in {fds.installed(engine).save_stats.get('written_bytes', 0) / _GB:.2f}"
                    " GB on rank 0", flush=True))
    if wanted("fastpersist_incremental"):  # unchanged weights (frozen): references to a base
        fds.install(engine, incremental=True, **knobs)
        engine.save_checkpoint(root, tag="incremental_base")  # untimed: the full base
        measure("fastpersist_incremental", "durable", lambda tag: engine.save_checkpoint(root, tag=tag),
                ours_load, after_save=lambda tag: say(
                    f"fastpersist_incremental -- with no step since the base, "
                    f"{fds.installed(engine).save_stats.get('referenced_bytes', 0) / _GB:.2f} GB of rank 0's "
                    "storages were recorded as references to it, not written", flush=True))
        if rank == 0:
            shutil.rmtree(os.path.join(root, "incremental_base"), ignore_errors=True)
    if rank == 0 and results:
        _table(results, _fio_bound(args, root, results) if args.fio else None)
    if hasattr(engine, "_fastpersist_checkpoint_engine"):
        engine._fastpersist_checkpoint_engine.close()
    dist.barrier()


def _engine(deepspeed: Any, model: Any, args: argparse.Namespace) -> Any:
    config: Dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": args.zero_stage},
        "bf16": {"enabled": bool(args.half)},
        "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "torch_adam": True}},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    return engine


def _trainer(engine: Any) -> Any:
    batch = models.sample_input(engine.module)

    def step() -> None:
        out = engine(**batch)
        engine.backward(out.logits.float().mean())
        engine.step()

    return step


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _fsync_engine(stock: Any) -> Any:
    """DeepSpeed's TorchCheckpointEngine, made durable: every file is fsynced after torch.save,
    and the tag folder at commit (what a user adds to trust the stock engine after a crash)."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine  # type: ignore[import-not-found, import-untyped, unused-ignore]

    class FsyncTorchCheckpointEngine(TorchCheckpointEngine):
        def save(self, state_dict: Any, path: str) -> None:
            with open(path, "wb") as f:
                torch.save(state_dict, f)
                f.flush()
                os.fsync(f.fileno())
            self._dirs.add(os.path.dirname(path))

        def commit(self, info: Any) -> bool:
            for d in sorted(self._dirs) + [os.fspath(info.save_dir)]:
                fd = os.open(d, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            self._dirs.clear()
            return True

    engine = FsyncTorchCheckpointEngine(None)
    engine._dirs = set()
    return engine


def _deepspeed_fast_engine(engine: Any, args: argparse.Namespace) -> Any:
    """(DeepSpeed's FastCheckpointEngine for this engine, None) or (None, why not)."""
    try:
        from deepspeed.runtime.checkpoint_engine.utils import create_checkpoint_engine  # type: ignore[import-not-found, import-untyped, unused-ignore]
        from deepspeed.runtime.config import DeepSpeedConfig  # type: ignore[import-not-found, import-untyped, unused-ignore]
        from deepspeed.utils import groups  # type: ignore[import-not-found, import-untyped, unused-ignore]

        config = dict(engine._config._param_dict)
        config["checkpoint"] = {"writer": {"type": "fast", "io_buffer_size": args.io_buffer_mb << 20,
                                           "io_buffer_double": not args.single_io_buffer,
                                           "show_statistics": False, "data_parallel": "socket"}}
        ds_config = DeepSpeedConfig(config)
        fast = create_checkpoint_engine(ds_config, groups, args.zero_stage, False,
                                        not engine.zero_optimization_partition_weights())
        return fast, ""
    except Exception as e:  # noqa: BLE001 (reported as the skip reason)
        return None, f"{type(e).__name__}: {e}"


def _count_reading(engine: Any) -> None:
    """Starts timing the checkpoint engine's load() calls (DeepSpeed's and ours alike)."""
    ours = getattr(engine, "_fastpersist_checkpoint_engine", None)
    if ours is not None and engine.checkpoint_engine is ours:
        ours.load_stats = {"files": 0, "bytes": 0, "seconds": 0.0}
        return
    ce = engine.checkpoint_engine
    original = getattr(ce, "_bench_original_load", None) or ce.load
    ce._bench_original_load = original
    ce._bench_seconds = 0.0

    def timed(path: str, map_location: Any = None) -> Any:
        t = time.perf_counter()
        try:
            return original(path, map_location=map_location)
        finally:
            ce._bench_seconds += time.perf_counter() - t

    ce.load = timed


def _reading_seconds(engine: Any) -> float:
    ours = getattr(engine, "_fastpersist_checkpoint_engine", None)
    if ours is not None and engine.checkpoint_engine is ours:
        return float(ours.load_stats["seconds"])
    return float(getattr(engine.checkpoint_engine, "_bench_seconds", 0.0))


class _PeakRss:
    """The most resident memory this process added while the block ran (sampled every 5 ms)."""

    def __enter__(self) -> "_PeakRss":
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())
        self.added = self.peak - self.start


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _folder_bytes(folder: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for name in files:
            total += os.path.getsize(os.path.join(dirpath, name))
    return total


def _evict(folder: str) -> None:
    from .loaders import evict

    for dirpath, _, files in os.walk(folder):
        for name in files:
            evict(os.path.join(dirpath, name))


def _fio_bound(args: argparse.Namespace, root: str, results: List[Dict[str, Any]]) -> Optional[float]:
    path = fio_bench.find()
    if path is None:
        print("# fio not installed: no O_DIRECT bound", flush=True)
        return None
    size = max(r["bytes"] for r in results)
    if size < 64 << 20:
        print("# no fio bound: the checkpoint is under 64 MiB", flush=True)
        return None
    target = os.path.join(args.folder, "ds_fio.bin")
    try:
        best_write, best_read = fio_bench.best(path, target, size, fio_bench.candidates())
        run = fio_bench.run(path, "write", target, size, best_write)
        read = fio_bench.run(path, "read", target, size, best_read)
        buffered = _buffered_cold_read(target)
    finally:
        if os.path.exists(target):
            os.unlink(target)
    gbs = run.nbytes / run.seconds / _GB
    print(f"fio -- {run.nbytes / _GB:.2f} GB, {run.seconds:.2f} secs, {gbs:.2f} GB/s "
          f"[O_DIRECT write + fsync, {best_write.label()}]", flush=True)
    print(f"fio -- read {read.nbytes / _GB:.2f} GB in {read.seconds:.2f} secs, "
          f"{read.nbytes / _GB / read.seconds:.2f} GB/s [O_DIRECT read, {best_read.label()}]; "
          f"a buffered read of the same cold file: {buffered:.2f} secs, "
          f"{size / _GB / buffered:.2f} GB/s (the bound of a cold load)", flush=True)
    return gbs


def _buffered_cold_read(path: str) -> float:
    """Seconds to read the file once through the page cache, evicted first, 8 MiB at a time."""
    from .loaders import evict

    evict(path)
    chunk = bytearray(8 << 20)
    view = memoryview(chunk)
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(view):
            pass
    return time.perf_counter() - t


def _table(results: List[Dict[str, Any]], fio_gbs: Optional[float]) -> None:
    from .table import aligned

    base = next((r for r in results if r["tag"] == "ds_torch_engine_fsync"), None)
    rows = []
    for r in results:
        save_gbs = r["bytes"] / _GB / r["save"]
        rows.append([r["tag"], r["durable"], f"{r['bytes'] / _GB:.2f}", f"{r['save']:.2f}",
                     f"{save_gbs:.2f}",
                     "-" if base is None else f"{base['save'] / r['save']:.2f}x",
                     "-" if fio_gbs is None else f"{save_gbs / fio_gbs:.2f}x",
                     f"{r['load']:.2f}",
                     "-" if base is None else f"{base['load'] / r['load']:.2f}x",
                     f"{r['validated_load']:.2f}" if "validated_load" in r else "-",
                     f"{r['blocked']:.2f}" if "blocked" in r else "-",
                     f"{r['save_rss'] / _GB:.2f}", f"{r['load_rss'] / _GB:.2f}"])
    print(aligned(["tag", "durable", "GB", "save s", "save GB/s", "vs torch+fsync", "vs fio",
                   "load s (cold)", "load vs torch", "validated load s", "blocked s", "save +GB",
                   "load +GB"], rows), flush=True)
    print("(save s: for fastpersist_async, what training paid: save_checkpoint's blocking plus "
          "the next step's time over a step alone. +GB: resident memory added at the peak.)",
          flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
