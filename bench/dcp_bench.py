#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""torch.distributed.checkpoint (DCP): fastpersist's storage plug-in against DCP's own
``FileSystemWriter`` / ``FileSystemReader``, on real ranks (gloo, spawned processes).

The state, about ``--size_gb`` in total whatever the world size: a few dozen float32 and
bfloat16 tensors of ``--tensor_mib`` MiB, as DTensors on a CPU device mesh, sharded by rows
(``Shard(0)``) over the ranks, every fifth one replicated (``Replicate()``, written once), and two
non-tensor values. Each round, for each world size of ``--ranks`` (a fresh group of processes;
one rank is a one-rank group), every variant runs once, in an order that rotates from round to
round:

- ``save fastpersist``: ``dcp.save`` with ``FastPersistWriter(path)`` (defaults; a new writer per
  save, as a training loop makes one per checkpoint tag). Every process first makes one such save,
  timed apart as ``first in process``: it pins the staging memory that later saves reuse;
- ``save fastpersist 256MiB``: the same with ``staging_budget="256MiB"`` (no warm-up of its own);
- ``save fs tN``: ``dcp.save`` with ``FileSystemWriter(path, sync_files=True, thread_count=N)``
  (N = 1 is DCP's default);
- ``load fastpersist`` / ``load fs``: ``dcp.load`` with ``FastPersistReader`` /
  ``FileSystemReader`` of the checkpoint its own writer (``save fastpersist`` / ``save fs t1``)
  has just written, into preallocated DTensors, the files evicted from the page cache first
  (fsync + ``posix_fadvise(DONTNEED)``, checked with ``mincore``);
- ``fio read``: fio's O_DIRECT read (io_uring, 8 MiB blocks, queue depth 32, one job per file)
  of the data files ``save fastpersist`` wrote, evicted, as the disk's reference (``--no_fio``);
- ``fio write``: fio's O_DIRECT write (io_uring, 8 MiB blocks, queue depth 32, one job per file,
  an fsync at the end of each) of files of the same sizes as those data files, into a folder
  of its own: the most any writer can get out of this disk, the bound of the save targets;
- ``async_save fastpersist``: ``dcp.async_save`` (thread mode) with ``FastPersistWriter`` and one
  DCP ``DefaultStager`` for the whole process, as the multi-rank ``CheckpointManager`` does: how
  long the caller is blocked (the slowest rank), and the time until the save is committed. The
  stager keeps its host copy of the state from save to save; the process's first async save,
  which allocates and first touches that copy, is timed apart as ``first in process``.

A save or load is timed on rank 0 between two barriers (so the slowest rank bounds it); GB/s =
all the state's bytes / time. Before every save all earlier outputs are deleted and synced (not
timed). Every load is checked bit for bit against the state (not timed). The table gives, per
world size, the best and the median GB/s over the rounds; the targets compare medians within
the run (best-of in brackets). Run with the package installed in .venv:

    .venv/bin/python bench/dcp_bench.py --folder /work/fpbench/dcp --ranks 1,2,4 --rounds 3
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import spawn as _spawn
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, AsyncSaveResponse
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

import fastpersist
from fastpersist.bench.loaders import evict
from fastpersist.dcp import FastPersistReader, FastPersistWriter

COLUMNS = 2048  # every tensor is (rows, 2048): rows stay divisible by 1, 2 and 4 ranks
FS_LOADED = "t1"  # the FileSystemWriter variant whose checkpoint `load fs` reads
FIO = "fio read of the fastpersist files"
FIO_WRITE = "fio write of files of the same sizes"
BUDGET = "256MiB"  # the bounded staging budget of `save fastpersist 256MiB`


@dataclasses.dataclass(frozen=True)
class Spec:
    """One tensor of the state: its name, global shape and dtype, sharded or replicated."""
    name: str
    rows: int
    dtype: torch.dtype
    replicated: bool

    @property
    def nbytes(self) -> int:
        return self.rows * COLUMNS * torch.empty((), dtype=self.dtype).element_size()


def tensor_specs(size_bytes: int, sizes_mib: Sequence[int]) -> List[Spec]:
    """Tensors cycling through `sizes_mib`, float32 and bfloat16 in turn, every fifth one
    replicated, until they hold at least `size_bytes`."""
    specs: List[Spec] = []
    total = 0
    while total < size_bytes:
        i = len(specs)
        dtype = torch.float32 if i % 2 == 0 else torch.bfloat16
        rows = sizes_mib[i % len(sizes_mib)] * (1 << 20) // (COLUMNS * (4 if i % 2 == 0 else 2))
        spec = Spec(f"layers.{i}.weight", rows, dtype, replicated=i % 5 == 4)
        specs.append(spec)
        total += spec.nbytes
    return specs


def sharded_state(specs: List[Spec], mesh: DeviceMesh, rank: int, world_size: int) -> Dict[str, Any]:
    """The state as each rank holds it: DTensors built from their local pieces (no rank ever
    holds a whole sharded tensor), each filled with a value of its own."""
    model: Dict[str, DTensor] = {}
    for i, s in enumerate(specs):
        rows = s.rows if s.replicated else s.rows // world_size
        local = torch.empty(rows, COLUMNS, dtype=s.dtype).fill_(float(i % 97 + 1))
        local[0].fill_(float(rank + 100))  # each rank's piece differs from the others'
        if s.replicated:
            local[0].fill_(100.0)
        placement = Replicate() if s.replicated else Shard(0)
        model[s.name] = DTensor.from_local(local, mesh, [placement], run_check=False,
                                           shape=torch.Size([s.rows, COLUMNS]), stride=(COLUMNS, 1))
    return {"model": model, "step": 1000, "config": {"lr": 0.1, "note": "dcp_bench"}}


def blank_like(state: Dict[str, Any]) -> Dict[str, Any]:
    """Preallocated destinations: zeroed DTensors of the same layout (pages already touched)."""
    model = {k: DTensor.from_local(torch.zeros_like(v.to_local()), v.device_mesh, v.placements,
                                   run_check=False, shape=v.shape, stride=v.stride())
             for k, v in state["model"].items()}
    return {"model": model, "step": 0, "config": {"lr": 0.0, "note": ""}}


def check_equal(loaded: Dict[str, Any], state: Dict[str, Any], what: str) -> None:
    for name, value in state["model"].items():
        if not torch.equal(loaded["model"][name].to_local(), value.to_local()):
            raise AssertionError(f"{what}: {name} differs from what was saved")
    if loaded["step"] != state["step"] or loaded["config"] != state["config"]:
        raise AssertionError(f"{what}: the non-tensor values differ")


# ------------------------------------------------------------------ one round on each rank
@dataclasses.dataclass(frozen=True)
class RoundArgs:
    folder: str
    size_gb: float
    tensor_mib: Tuple[int, ...]
    threads: Tuple[int, ...]
    order_shift: int
    results: str    # rank 0 writes its timings here (JSON)
    store: str      # the process group's file store
    drop_caches: bool
    fio: bool       # also time fio reading the fastpersist checkpoint's files


def variants(threads: Sequence[int]) -> List[str]:
    return ["fastpersist", "budget", *[f"t{t}" for t in threads], "async"]


def timed(fn: Callable[[], Any]) -> float:
    """Wall time of fn on this rank between two barriers: the slowest rank bounds it."""
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def clear_outputs(folder: str, rank: int) -> None:
    if rank == 0:
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        os.sync()
    dist.barrier()


def evict_tree(path: str, rank: int, drop_caches: bool) -> float:
    """Rank 0 evicts every file under `path`; the largest fraction of a file left cached."""
    left = 0.0
    if rank == 0:
        for parent, _, files in os.walk(path):
            for name in files:
                left = max(left, evict(os.path.join(parent, name), drop_caches))
    dist.barrier()
    return left


def fio_read_rate(files: List[str]) -> float:
    """fio's O_DIRECT read of `files`, one job per file, all at once: bytes per second."""
    args = ["fio", "--output-format=json", "--group_reporting", "--rw=read", "--direct=1",
            "--ioengine=io_uring", "--bs=8M", "--iodepth=32"]
    for i, f in enumerate(files):
        args += [f"--name=f{i}", f"--filename={f}"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    read: Dict[str, float] = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    return float(read["io_bytes"]) / (float(read["runtime"]) / 1e3)


def fio_write_rate(folder: str, sizes: List[int]) -> float:
    """fio's O_DIRECT write of one new file per size in `folder`, all at once, each fsynced at
    its end: bytes per second (the files are removed afterwards)."""
    args = ["fio", "--output-format=json", "--group_reporting", "--rw=write", "--direct=1",
            "--ioengine=io_uring", "--bs=8M", "--iodepth=32", "--end_fsync=1"]
    for i, size in enumerate(sizes):
        args += [f"--name=w{i}", f"--filename={os.path.join(folder, f'w{i}')}",
                 f"--size={size - size % 4096}"]
    start = time.perf_counter()
    subprocess.run(args, capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - start  # with the fsyncs, which fio's runtime leaves out
    shutil.rmtree(folder)
    os.sync()
    return sum(size - size % 4096 for size in sizes) / seconds


class Round:
    """One process's share of a round: every variant once, in the order given."""

    def __init__(self, rank: int, world_size: int, a: RoundArgs) -> None:
        self.rank, self.a = rank, a
        mesh = init_device_mesh("cpu", (world_size,))
        self.specs = tensor_specs(int(a.size_gb * 1e9), a.tensor_mib)
        self.state = sharded_state(self.specs, mesh, rank, world_size)
        self.seconds: Dict[str, float] = {}
        self.cached = 0.0  # the largest fraction of a file still cached before a load
        self.async_warm = False
        self.fp_path = os.path.join(a.folder, "fp", "step-1000")
        # One stager for the process (as the multi-rank CheckpointManager keeps one): it
        # reuses its host copy of the state from one async save to the next.
        self.stager = DefaultStager(StagingOptions(False, False, False, False))

    def save(self, op: str, writer: Any) -> None:
        clear_outputs(self.a.folder, self.rank)
        self.seconds[op] = timed(lambda: dcp_save(self.state, storage_writer=writer))

    def load(self, op: str, path: str, reader: Any) -> None:
        target = blank_like(self.state)
        self.cached = max(self.cached, evict_tree(path, self.rank, self.a.drop_caches))
        self.seconds[op] = timed(lambda: dcp_load(target, storage_reader=reader))
        check_equal(target, self.state, op)

    def fio_read(self, path: str) -> None:
        """The disk's reference: fio reads the checkpoint's data files (evicted) as fast as it
        can, at once; recorded as the time it would take for the state's bytes."""
        seconds = torch.zeros(1, dtype=torch.float64)
        evict_tree(path, self.rank, self.a.drop_caches)
        if self.rank == 0:
            files = [os.path.join(path, n) for n in sorted(os.listdir(path))
                     if os.path.getsize(os.path.join(path, n)) >= 1 << 20]
            seconds[0] = sum(s.nbytes for s in self.specs) / fio_read_rate(files)
        dist.broadcast(seconds, 0)
        self.seconds[FIO] = float(seconds[0])

    def fio_write(self, path: str) -> None:
        """The disk's write reference: fio writes files of the sizes of the checkpoint's data
        files, O_DIRECT and fsynced, as fast as it can; recorded as the time for the state's
        bytes (process start included: an upper bound of the time, a lower one of the rate)."""
        seconds = torch.zeros(1, dtype=torch.float64)
        if self.rank == 0:
            sizes = [os.path.getsize(os.path.join(path, n)) for n in sorted(os.listdir(path))
                     if os.path.getsize(os.path.join(path, n)) >= 1 << 20]
            folder = os.path.join(self.a.folder, "fio-write")
            os.makedirs(folder)
            seconds[0] = sum(s.nbytes for s in self.specs) / fio_write_rate(folder, sizes)
        dist.broadcast(seconds, 0)
        self.seconds[FIO_WRITE] = float(seconds[0])

    def async_save(self, op: str) -> None:
        clear_outputs(self.a.folder, self.rank)
        blocked = torch.zeros(1, dtype=torch.float64)

        def save() -> None:
            start = time.perf_counter()
            response = dcp_async_save(self.state, storage_writer=FastPersistWriter(self.fp_path),
                                      async_checkpointer_type=AsyncCheckpointerType.THREAD,
                                      async_stager=self.stager)
            blocked[0] = time.perf_counter() - start
            if isinstance(response, AsyncSaveResponse):
                response.upload_completion.result()
            else:
                response.result()

        self.seconds[f"{op}: committed"] = timed(save)
        dist.all_reduce(blocked, op=dist.ReduceOp.MAX)  # after the save: its collectives are done
        self.seconds[f"{op}: blocked"] = float(blocked[0])

    def run(self, order: List[str]) -> None:
        # A training loop saves many times per process; its first save pins the staging memory
        # that later saves reuse (timed apart).
        self.save("save fastpersist: first in process", FastPersistWriter(self.fp_path))
        for v in order:
            if v == "fastpersist":
                self.save("save fastpersist", FastPersistWriter(self.fp_path))
                self.load("load fastpersist", self.fp_path, FastPersistReader(self.fp_path))
                if self.a.fio:
                    self.fio_read(self.fp_path)
                    self.fio_write(self.fp_path)
            elif v == "budget":
                self.save(f"save fastpersist {BUDGET}",
                          FastPersistWriter(self.fp_path, staging_budget=BUDGET))
            elif v == "async":
                if not self.async_warm:
                    self.async_save("async_save fastpersist: first in process")
                    self.async_warm = True
                self.async_save("async_save fastpersist")
            else:
                fs_path = os.path.join(self.a.folder, "fs", v)
                self.save(f"save fs {v}", FileSystemWriter(fs_path, sync_files=True,
                                                               thread_count=int(v[1:])))
                if v == FS_LOADED:
                    self.load("load fs", fs_path, FileSystemReader(fs_path))
        clear_outputs(self.a.folder, self.rank)
        self.stager.close()


def run_round(rank: int, world_size: int, a: RoundArgs) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{a.store}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=900))
    try:
        r = Round(rank, world_size, a)
        names = variants(a.threads)
        shift = a.order_shift % len(names)
        r.run(names[shift:] + names[:shift])
        if rank == 0:
            with open(a.results, "w") as f:
                json.dump({"seconds": r.seconds, "bytes": sum(s.nbytes for s in r.specs),
                           "cached_after_evict": r.cached}, f)
    finally:
        dist.destroy_process_group()
    # Done: end the process without interpreter finalization, where torch's gloo worker
    # threads may still free the last collective's tensors and abort the process
    # (tests/python/_distributed.py says more).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_round(world_size: int, a: RoundArgs) -> Dict[str, Any]:
    spawn: Callable[..., Any] = _spawn  # untyped in torch
    spawn(run_round, args=(world_size, a), nprocs=world_size, join=True)
    with open(a.results) as f:
        result: Dict[str, Any] = json.load(f)
    return result


# ------------------------------------------------------------------ the report
def gbps(nbytes: int, seconds: List[float]) -> Tuple[float, float]:
    """(best, median) GB/s."""
    rates = [nbytes / s / 1e9 for s in seconds]
    return max(rates), statistics.median(rates)


def report(runs: Dict[int, List[Dict[str, Any]]], threads: Sequence[int]) -> None:
    ranks = sorted(runs)
    nbytes = runs[ranks[0]][0]["bytes"]

    def times(w: int, op: str) -> List[float]:
        return [r["seconds"][op] for r in runs[w]]

    def best_t(w: int) -> int:
        return max(threads, key=lambda t: gbps(nbytes, times(w, f"save fs t{t}"))[1])

    print("| operation | " + " | ".join(f"{w} rank{'s' if w > 1 else ''}: best | median"
                                         for w in ranks) + " |")
    print("|---|" + "---:|---:|" * len(ranks))
    ops = (["save fastpersist", "save fastpersist: first in process", f"save fastpersist {BUDGET}"]
           + [f"save fs t{t}" for t in threads] + ["load fastpersist", "load fs"])
    if FIO in runs[ranks[0]][0]["seconds"]:
        ops += [FIO, FIO_WRITE]
    for op in ops:
        cells = [gbps(nbytes, times(w, op)) for w in ranks]
        print(f"| {op} (GB/s) | " + " | ".join(f"{b:.2f} | {m:.2f}" for b, m in cells) + " |")
    for op in ("async_save fastpersist: blocked", "async_save fastpersist: committed",
               "async_save fastpersist: first in process: blocked"):
        cells = [(min(times(w, op)), statistics.median(times(w, op))) for w in ranks]
        print(f"| {op} (s) | " + " | ".join(f"{b:.2f} | {m:.2f}" for b, m in cells) + " |")
    print()
    print("| target (ratio of medians, best-of in brackets) | "
          + " | ".join(f"{w} rank{'s' if w > 1 else ''}" for w in ranks) + " |")
    print("|---|" + "---|" * len(ranks))

    def ratio_row(label: str, ours: Union[str, Callable[[int], str]],
                  theirs: Callable[[int], str], wanted: Optional[float] = None) -> None:
        cells = []
        for w in ranks:
            op = ours(w) if callable(ours) else ours
            (ob, om), (tb, tm) = gbps(nbytes, times(w, op)), gbps(nbytes, times(w, theirs(w)))
            verdict = "" if wanted is None else " yes" if om / tm >= wanted else " NO"
            cells.append(f"{om / tm:.2f} ({ob / tb:.2f}){verdict}")
        print(f"| {label}{'' if wanted is None else f' ≥ {wanted}'} | " + " | ".join(cells) + " |")

    ratio_row("save fastpersist / fs t1", "save fastpersist", lambda w: "save fs t1", 3.0)
    ratio_row("save fastpersist / fs best thread_count", "save fastpersist",
              lambda w: f"save fs t{best_t(w)}", 1.3)
    ratio_row("load fastpersist / fs", "load fastpersist", lambda w: "load fs", 1.5)
    ratio_row("first save in a process / fs t1", "save fastpersist: first in process",
              lambda w: "save fs t1")
    ratio_row(f"save fastpersist {BUDGET} / fs t1", f"save fastpersist {BUDGET}",
              lambda w: "save fs t1")
    if FIO in runs[ranks[0]][0]["seconds"]:
        ratio_row("load fastpersist / fio read", "load fastpersist", lambda w: FIO)
        ratio_row("load fs / fio read", "load fs", lambda w: FIO)
        ratio_row("save fastpersist / fio write", "save fastpersist", lambda w: FIO_WRITE)
        ratio_row("save fs best thread_count / fio write", lambda w: f"save fs t{best_t(w)}",
                  lambda w: FIO_WRITE)
    blocked = [statistics.median(times(w, "async_save fastpersist: blocked"))
               / statistics.median(times(w, "save fastpersist")) for w in ranks]
    print("| async_save blocked / save fastpersist (time, medians) | "
          + " | ".join(f"{b:.2f}" for b in blocked) + " |")
    first = [statistics.median(times(w, "async_save fastpersist: first in process: blocked"))
             / statistics.median(times(w, "save fastpersist")) for w in ranks]
    print("| first async_save in a process: blocked / save fastpersist (time, medians) | "
          + " | ".join(f"{b:.2f}" for b in first) + " |")
    print("| best thread_count (median) | " + " | ".join(f"{best_t(w)}" for w in ranks) + " |")
    print()
    for w in ranks:
        cached = max(r["cached_after_evict"] for r in runs[w])
        print(f"{w} rank(s), seconds per round (largest fraction of a file still cached before a "
              f"load: {cached:.3f}):")
        for op in runs[w][0]["seconds"]:
            print(f"  {op}: " + " ".join(f"{s:.2f}" for s in times(w, op)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--folder", default="/work/fpbench/dcp",
                        help="where the checkpoints go (on the disk under test, not tmpfs)")
    parser.add_argument("--ranks", default="1,2,4", help="comma-separated world sizes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size_gb", type=float, default=4.0, help="the state, all ranks together")
    parser.add_argument("--tensor_mib", default="256,128,64,32,16",
                        help="tensor sizes (MiB), cycled")
    parser.add_argument("--threads", default="1,2,4,8",
                        help="FileSystemWriter thread_count values (1 is DCP's default)")
    parser.add_argument("--drop_caches", action="store_true",
                        help="also echo 1 > /proc/sys/vm/drop_caches before each load (root)")
    parser.add_argument("--no_fio", action="store_true",
                        help="skip the reference read by fio (also skipped without fio)")
    args = parser.parse_args(argv)
    ranks = [int(w) for w in args.ranks.split(",")]
    threads = tuple(int(t) for t in args.threads.split(","))
    if 1 not in threads:
        parser.error("--threads must include 1 (DCP's default, the first target's reference)")
    fio = not args.no_fio and shutil.which("fio") is not None
    os.makedirs(args.folder, exist_ok=True)
    if os.listdir(args.folder):
        parser.error(f"{args.folder} is not empty (the benchmark deletes everything in it)")
    command = [sys.executable, sys.argv[0], *(sys.argv[1:] if argv is None else argv)]
    print("command: " + " ".join(shlex.quote(x) for x in command))
    specs = tensor_specs(int(args.size_gb * 1e9), [int(m) for m in args.tensor_mib.split(",")])
    print(f"fastpersist {fastpersist.__version__}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"folder {args.folder}; state {sum(s.nbytes for s in specs) / 1e9:.2f} GB in "
          f"{len(specs)} tensors ({sum(s.replicated for s in specs)} replicated)\n")
    runs: Dict[int, List[Dict[str, Any]]] = {w: [] for w in ranks}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, w in enumerate(ranks[r % len(ranks):] + ranks[:r % len(ranks)]):
                print(f"round {r + 1}/{args.rounds}: {w} rank(s) ...", file=sys.stderr, flush=True)
                a = RoundArgs(args.folder, args.size_gb, tuple(int(m) for m in args.tensor_mib.split(",")),
                              threads, r + i, os.path.join(tmp, f"r{r}-w{w}.json"),
                              os.path.join(tmp, f"store-r{r}-w{w}"), args.drop_caches,
                              fio)
                runs[w].append(spawn_round(w, a))
    report(runs, threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
