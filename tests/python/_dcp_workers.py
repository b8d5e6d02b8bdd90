# SPDX-License-Identifier: Apache-2.0
"""What each rank runs in the DCP tests (tests/python/test_dcp.py): saves and loads of sharded
DTensor state through fastpersist's storage writer and reader, on a CPU device mesh."""

from __future__ import annotations

import gc
import os
from typing import Any, Dict

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from fastpersist.dcp import FastPersistReader, FastPersistWriter

ROWS = 12  # divisible by 1, 2, 3 and 4 ranks


def full_state(seed: int = 0) -> Dict[str, torch.Tensor]:
    """The whole (unsharded) tensors every test saves, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return {
        "model.w": torch.randn(ROWS, 10, generator=g),
        "model.b": torch.randn(7, generator=g),
        "opt.m": torch.randn(ROWS, 6, generator=g).to(torch.bfloat16),
        "opt.steps": torch.arange(ROWS * 3, dtype=torch.int64).reshape(ROWS, 3),
    }


def sharded_state(world_size: int, seed: int = 0, layout: str = "rows") -> Dict[str, Any]:
    """The state as a training job holds it: DTensors sharded over the ranks (by rows or by
    columns), a replicated one, and plain values."""
    mesh = init_device_mesh("cpu", (world_size,))
    full = full_state(seed)
    shard = Shard(0) if layout == "rows" else Shard(1)
    return {
        "model": {"w": distribute_tensor(full["model.w"], mesh, [shard]),
                  "b": distribute_tensor(full["model.b"], mesh, [Replicate()])},
        "opt": {"m": distribute_tensor(full["opt.m"], mesh, [shard]),
                "steps": distribute_tensor(full["opt.steps"], mesh, [Shard(0)])},
        "step": 11,
        "note": {"text": "hello", "lr": 0.5},
    }


def empty_like_state(state: Dict[str, Any]) -> Dict[str, Any]:
    """The same structure with zeroed tensors and blank values, to load into."""
    def blank(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: blank(v) for k, v in x.items()}
        if isinstance(x, torch.Tensor):
            return torch.zeros_like(x)
        return type(x)() if isinstance(x, (int, float, str)) else None
    return blank(state)


def check_loaded(state: Dict[str, Any], seed: int = 0) -> None:
    """The loaded state equals what was saved, bit for bit."""
    full = full_state(seed)
    got = {"model.w": state["model"]["w"], "model.b": state["model"]["b"],
           "opt.m": state["opt"]["m"], "opt.steps": state["opt"]["steps"]}
    for name, value in got.items():
        whole = value.full_tensor() if isinstance(value, DTensor) else value
        assert whole.dtype == full[name].dtype, name
        assert torch.equal(whole, full[name]), f"{name} differs after the load"
    assert state["step"] == 11
    assert state["note"] == {"text": "hello", "lr": 0.5}


def save(rank: int, world_size: int, path: str, seed: int = 0, layout: str = "rows") -> None:
    dcp.save(sharded_state(world_size, seed, layout), storage_writer=FastPersistWriter(path, step=11))


def load(rank: int, world_size: int, path: str, seed: int = 0, layout: str = "rows") -> None:
    target = empty_like_state(sharded_state(world_size, seed + 1, layout))
    dcp.load(target, storage_reader=FastPersistReader(path))
    check_loaded(target, seed)


def async_save(rank: int, world_size: int, path: str, mode: str) -> None:
    kind = AsyncCheckpointerType.PROCESS if mode == "process" else AsyncCheckpointerType.THREAD
    state = sharded_state(world_size)
    response = dcp.async_save(state, storage_writer=FastPersistWriter(path, step=11),
                              async_checkpointer_type=kind)
    future = getattr(response, "upload_completion", response)
    future.result()
    dist.barrier()
    load(rank, world_size, path)


class _FailingPlanner(DefaultSavePlanner):
    """Fault injection: rank `bad` fails while its items are resolved (mid-write)."""

    def __init__(self, bad: int) -> None:
        super().__init__()
        self.bad = bad

    def resolve_data(self, write_item: Any) -> Any:
        if dist.get_rank() == self.bad:
            raise RuntimeError(f"injected failure on rank {self.bad}")
        return super().resolve_data(write_item)


def save_fails(rank: int, world_size: int, root: str, good_tag: str, bad_tag: str) -> None:
    """A committed checkpoint, then a save that rank 1 fails: every rank gets the error, nothing
    is committed, the temporary directory and the lock go with the writer, and the earlier
    checkpoint is still the latest and loads."""
    save(rank, world_size, os.path.join(root, good_tag))
    writer = FastPersistWriter(os.path.join(root, bad_tag))
    try:
        dcp.save(sharded_state(world_size, seed=5), storage_writer=writer, planner=_FailingPlanner(1))
    except CheckpointException as e:  # a BaseException: DCP wraps every rank's failure in it
        assert "injected failure on rank 1" in str(e), str(e)
    else:
        raise AssertionError("the save succeeded although rank 1 failed")
    del writer
    gc.collect()
    dist.barrier()
    names = sorted(os.listdir(root))
    assert bad_tag not in names, names
    assert not [n for n in names if n.startswith(".tmp-")], names
    with open(os.path.join(root, "latest")) as f:
        assert f.read().strip() == good_tag
    load(rank, world_size, root)  # the root: its latest checkpoint


def save_replicated(rank: int, world_size: int, path: str) -> None:
    """Plain tensors every rank holds (replicated): DCP writes each once, spread over ranks."""
    state = {f"rep{i}": torch.full((1000 * (i + 1),), float(i)) for i in range(8)}
    dcp.save(state, storage_writer=FastPersistWriter(path))
