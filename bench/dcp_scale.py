#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What grows with the number of ranks in a distributed checkpoint (docs/scale.md): DCP's own
planning code and fastpersist's own writer, commit and reader, driven for N simulated ranks in
one process.

A job of N ranks saves a transformer's state the way FSDP2 holds it: every parameter and its two
Adam moments sharded by rows over all N ranks (``Shard(0)``: N blocks per tensor), one scalar
``step`` per parameter (replicated: DCP assigns it to one rank), the optimizer's param groups
and one RNG state per rank (non-tensor items). Only the number of items matters here, so every
block holds a few bytes. For each N:

1. every rank's local ``SavePlan`` is built as DCP's ``create_local_plan`` builds it for a
   DTensor (one ``WriteItem`` per local block) and pickled, which is what ``gather_object``
   sends to the coordinator;
2. the coordinator runs DCP's ``DefaultSavePlanner.create_global_plan`` (deduplication, the
   metadata, its checks), then ``FastPersistWriter.prepare_global_plan`` (the root's lock and the
   temporary directory); the central plans are pickled (``scatter_object_list``);
3. every rank runs ``FastPersistWriter.write_data`` (the C++ ShardWriter writes its blocks into
   its data file, non-durable: the data path is not what is measured) and its ``WriteResult``s
   are pickled (the second gather);
4. the coordinator runs ``FastPersistWriter.finish``: DCP's metadata pickled and written, then
   the C++ commit (every file checked, manifest.json written and synced, the directory synced,
   renamed, ``latest``): the commit latency;
5. loading: ``FastPersistReader.read_metadata`` (the manifest decoded and DCP's metadata
   unpickled), which every rank of a load runs, and ``CheckpointManager(root).list()``.

Gathers are not timed here: their payloads are, and the gloo cost per byte and per message of
a real gather (``--gather_ranks`` real processes, when given) turns them into time.

    .venv/bin/python bench/dcp_scale.py --folder /work/fpbench/scale --ranks 1,16,128,512,1024
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import io
import os
import pickle
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (
    BytesIOWriteData,
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.multiprocessing.spawn import spawn as _spawn

import fastpersist
from fastpersist.dcp import FastPersistReader, FastPersistWriter

COLUMNS = 4  # every block is (1, COLUMNS) float32: 16 bytes; the item count is what matters
PER_LAYER = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
             "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
             "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"]


def parameter_names(layers: int) -> List[str]:
    """A Llama-style decoder's parameters: 9 per layer, plus embeddings, final norm, head."""
    names = ["model.embed_tokens.weight"]
    for i in range(layers):
        names += [f"model.layers.{i}.{p}" for p in PER_LAYER]
    return names + ["model.norm.weight", "lm_head.weight"]


def sharded_item(fqn: str, rank: int, world_size: int) -> WriteItem:
    """The WriteItem DCP makes for rank `rank`'s block of a DTensor sharded by rows."""
    offsets = torch.Size([rank, 0])
    return WriteItem(index=MetadataIndex(fqn, offsets), type=WriteItemType.SHARD,
                     tensor_data=TensorWriteData(
                         chunk=ChunkStorageMetadata(offsets=offsets, sizes=torch.Size([1, COLUMNS])),
                         properties=TensorProperties(dtype=torch.float32),
                         size=torch.Size([world_size, COLUMNS])))


def whole_item(fqn: str) -> WriteItem:
    """The WriteItem of a plain (replicated) scalar tensor, which every rank plans."""
    offsets = torch.Size([])
    return WriteItem(index=MetadataIndex(fqn, offsets), type=WriteItemType.TENSOR,
                     tensor_data=TensorWriteData(
                         chunk=ChunkStorageMetadata(offsets=offsets, sizes=torch.Size([])),
                         properties=TensorProperties(dtype=torch.float32), size=torch.Size([])))


def bytes_item(fqn: str) -> WriteItem:
    return WriteItem(index=MetadataIndex(fqn), type=WriteItemType.BYTE_IO,
                     bytes_io_data=BytesIOWriteData(nbytes=0))


def local_plan(params: List[str], rank: int, world_size: int) -> SavePlan:
    """What DCP's DefaultSavePlanner.create_local_plan returns on one rank (flattened keys)."""
    items: List[WriteItem] = []
    mapping: Dict[str, Tuple[str, ...]] = {}
    for p in params:
        for fqn in (f"model.{p}", f"optim.state.{p}.exp_avg", f"optim.state.{p}.exp_avg_sq"):
            items.append(sharded_item(fqn, rank, world_size))
            mapping[fqn] = tuple(fqn.split(".", 1)) if fqn.startswith("model.") else \
                ("optim", "state", p, fqn.rsplit(".", 1)[1])
        items.append(whole_item(f"optim.state.{p}.step"))
        mapping[f"optim.state.{p}.step"] = ("optim", "state", p, "step")
    items.append(bytes_item("optim.param_groups"))
    mapping["optim.param_groups"] = ("optim", "param_groups")
    items.append(bytes_item(f"rng.rank{rank}"))
    mapping[f"rng.rank{rank}"] = ("rng", f"rank{rank}")
    return SavePlan(items, planner_data=mapping)


class RankPlanner:
    """Stands in for one rank's SavePlanner: resolve_data gives the item's (tiny) value."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def resolve_data(self, item: WriteItem) -> Any:
        if item.type == WriteItemType.BYTE_IO:
            out = io.BytesIO()
            torch.save({"rank": self.rank, "state": torch.zeros(4)}, out)
            out.seek(0)
            return out
        assert item.tensor_data is not None
        return torch.full(tuple(item.tensor_data.chunk.sizes), float(self.rank))


@dataclasses.dataclass
class Measured:
    world_size: int
    blocks: int = 0                 # tensor blocks in the manifest
    files: int = 0                  # entries in the checkpoint directory
    plan_bytes: int = 0             # one rank's pickled local plan (the largest)
    central_bytes: int = 0          # one rank's pickled central plan (the largest)
    results_bytes: int = 0          # one rank's pickled WriteResults (the largest)
    metadata_bytes: int = 0         # dcp-metadata.pt
    manifest_bytes: int = 0         # manifest.json
    seconds: Dict[str, float] = dataclasses.field(default_factory=dict)


def timed(seconds: Dict[str, float], what: str, fn: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    out = fn()
    seconds[what] = seconds.get(what, 0.0) + time.perf_counter() - start
    return out


def simulate(folder: str, layers: int, world_size: int) -> Measured:
    m = Measured(world_size)
    s = m.seconds
    root = os.path.join(folder, f"n{world_size}")
    os.makedirs(root)
    params = parameter_names(layers)
    path = os.path.join(root, "step-100")
    plans = [local_plan(params, r, world_size) for r in range(world_size)]
    # Every rank pickles its own plan (at once, in parallel: one rank's time is what counts);
    # the coordinator unpickles all of them.
    sent = timed(s, "every rank: pickle its plan (sum over ranks)",
                 lambda: [pickle.dumps(p) for p in plans])
    m.plan_bytes = max(len(x) for x in sent)
    gathered = timed(s, "coordinator: unpickle every plan", lambda: [pickle.loads(x) for x in sent])
    central, metadata = timed(s, "coordinator: DCP's global planning (dedup, metadata, checks)",
                              lambda: DefaultSavePlanner().create_global_plan(gathered))
    coordinator = FastPersistWriter(path, step=100, durable=False)
    coordinator.set_up_storage_writer(True)
    central = timed(s, "coordinator: FastPersistWriter.prepare_global_plan",
                    lambda: coordinator.prepare_global_plan(central))
    m.central_bytes = max(len(pickle.dumps(p)) for p in central)
    results: List[bytes] = []
    for r, plan in enumerate(central):
        writer = coordinator if r == 0 else FastPersistWriter(path, step=100, durable=False)
        try:
            future = timed(s, "every rank: FastPersistWriter.write_data (sum)",
                           lambda: writer.write_data(plan, RankPlanner(r)))  # type: ignore[arg-type]
            rank_results = future.value()
        finally:
            if writer is not coordinator:
                writer.close()
        packed = timed(s, "every rank: pickle its WriteResults (sum over ranks)",
                       lambda: pickle.dumps(rank_results))
        m.results_bytes = max(m.results_bytes, len(packed))
        results.append(packed)
    gathered_results = timed(s, "coordinator: unpickle every rank's WriteResults",
                             lambda: [pickle.loads(x) for x in results])
    try:
        timed(s, "coordinator: FastPersistWriter.finish (commit)",
              lambda: coordinator.finish(metadata, gathered_results))
    finally:
        coordinator.close()
    # finish() pickles the metadata itself; timed apart to show its share
    timed(s, "  of which: pickle DCP's Metadata", lambda: pickle.dumps(metadata))
    names = os.listdir(path)
    m.files = len(names)
    m.metadata_bytes = os.path.getsize(os.path.join(path, fastpersist._core.layout.DCP_METADATA_FILE_NAME))
    m.manifest_bytes = os.path.getsize(os.path.join(path, fastpersist._core.layout.MANIFEST_FILE_NAME))
    reader = FastPersistReader(path)
    loaded = timed(s, "every rank of a load: FastPersistReader.read_metadata",
                   reader.read_metadata)
    m.blocks = len(reader._open().manifest.tensors)
    if len(loaded.state_dict_metadata) != len(metadata.state_dict_metadata):
        raise AssertionError("the metadata read back differs from the one written")
    timed(s, "CheckpointManager(root).list()",
          lambda: fastpersist.CheckpointManager(root).list())
    shutil.rmtree(root)
    return m


# ------------------------------------------------------------------ a real gather (gloo)
def gather_rank(rank: int, world_size: int, store: str, sizes: List[int], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=300))
    try:
        rows = []
        for size in sizes:
            payload = bytes(size)
            times = []
            for _ in range(5):
                box: List[Any] = [None] * world_size if rank == 0 else []
                dist.barrier()
                start = time.perf_counter()
                dist.gather_object(payload, box if rank == 0 else None, dst=0)
                times.append(time.perf_counter() - start)
            rows.append((size, statistics.median(times)))
        if rank == 0:
            with open(out, "w") as f:
                f.write(repr(rows))
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no interpreter finalization (torch's gloo teardown, tests/python/_distributed.py)


def real_gathers(world_sizes: List[int], sizes: List[int]) -> Dict[int, List[Tuple[int, float]]]:
    spawn: Callable[..., Any] = _spawn
    out: Dict[int, List[Tuple[int, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in world_sizes:
            result = os.path.join(tmp, f"g{w}")
            spawn(gather_rank, args=(w, os.path.join(tmp, f"store{w}"), sizes, result),
                  nprocs=w, join=True)
            with open(result) as f:
                out[w] = eval(f.read())  # noqa: S307 (our own repr of a list of tuples)
    return out


# ------------------------------------------------------------------ report
def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def report(rows: List[Measured]) -> None:
    head = "| | " + " | ".join(f"{m.world_size} rank{'s' if m.world_size > 1 else ''}" for m in rows) + " |"
    print(head)
    print("|---|" + "---:|" * len(rows))
    for label, get in [("tensor blocks in the manifest", lambda m: f"{m.blocks:,}"),
                       ("files in the checkpoint directory", lambda m: f"{m.files:,}"),
                       ("a rank's local plan (gathered)", lambda m: human(m.plan_bytes)),
                       ("a rank's central plan (scattered)", lambda m: human(m.central_bytes)),
                       ("a rank's WriteResults (gathered)", lambda m: human(m.results_bytes)),
                       ("all gathered by the coordinator",
                        lambda m: human((m.plan_bytes + m.results_bytes) * m.world_size)),
                       ("dcp-metadata.pt", lambda m: human(m.metadata_bytes)),
                       ("manifest.json", lambda m: human(m.manifest_bytes)),
                       ("manifest.json per block", lambda m: f"{m.manifest_bytes / m.blocks:.0f} B")]:
        print(f"| {label} | " + " | ".join(get(m) for m in rows) + " |")
    for what in rows[0].seconds:
        print(f"| {what} (s) | " + " | ".join(f"{m.seconds[what]:.3f}" for m in rows) + " |")
    per_block = [m.seconds["coordinator: FastPersistWriter.finish (commit)"] / m.blocks * 1e6 for m in rows]
    print("| commit per block (µs) | " + " | ".join(f"{x:.2f}" for x in per_block) + " |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--folder", default="/work/fpbench/scale",
                        help="where the simulated checkpoints go (emptied afterwards)")
    parser.add_argument("--ranks", default="1,16,128,512,1024", help="simulated world sizes")
    parser.add_argument("--layers", type=int, default=32, help="decoder layers (9 tensors each)")
    parser.add_argument("--gc_threshold", default="",
                        help="run with gc.set_threshold(...) (e.g. 100000,50,1000), as a job "
                             "at hundreds of ranks would on its coordinator")
    parser.add_argument("--gather_ranks", default="",
                        help="also time real gloo gathers on these world sizes (e.g. 2,4,8)")
    args = parser.parse_args(argv)
    os.makedirs(args.folder, exist_ok=True)
    if os.listdir(args.folder):
        parser.error(f"{args.folder} is not empty (the benchmark deletes everything in it)")
    command = [sys.executable, sys.argv[0], *(sys.argv[1:] if argv is None else argv)]
    print("command: " + " ".join(shlex.quote(x) for x in command))
    if args.gc_threshold:
        gc.set_threshold(*(int(x) for x in args.gc_threshold.split(",")))
    params = parameter_names(args.layers)
    print(f"fastpersist {fastpersist.__version__}, torch {torch.__version__}; {len(params)} "
          f"parameters, {4 * len(params)} state tensors ({3 * len(params)} sharded over every "
          f"rank), 2 + N non-tensor items; gc thresholds {gc.get_threshold()}\n")
    rows = []
    for w in [int(x) for x in args.ranks.split(",")]:
        print(f"simulating {w} rank(s) ...", file=sys.stderr, flush=True)
        rows.append(simulate(args.folder, args.layers, w))
    report(rows)
    if args.gather_ranks:
        sizes = sorted({1 << 10, 1 << 16, rows[-1].plan_bytes, rows[-1].results_bytes, 1 << 22})
        gathers = real_gathers([int(x) for x in args.gather_ranks.split(",")], sizes)
        print("\nReal gloo gather_object to rank 0 on this machine (median of 5, seconds):\n")
        print("| payload per rank | " + " | ".join(f"{w} ranks" for w in gathers) + " |")
        print("|---|" + "---:|" * len(gathers))
        for i, size in enumerate(sizes):
            print(f"| {human(size)} | " + " | ".join(f"{gathers[w][i][1]:.4f}" for w in gathers) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
