# SPDX-License-Identifier: Apache-2.0
"""What each rank runs in the multi-rank CheckpointManager tests
(tests/python/test_distributed_manager.py)."""

from __future__ import annotations

import json
import os
import signal
from typing import Any, Dict, List

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

import fastpersist
from _dcp_workers import check_loaded, empty_like_state, sharded_state


def _same_everywhere(value: Any) -> None:
    """`value` is the same on every rank."""
    values: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    assert all(v == values[0] for v in values), values


def _bump(state: Dict[str, Any]) -> None:
    """What a training step does to the state: modify every tensor in place."""
    with torch.no_grad():
        for part in ("model", "opt"):
            for value in state[part].values():
                local = value.to_local() if isinstance(value, DTensor) else value
                local.add_(1)


def save_load_retain(rank: int, world_size: int, root: str) -> None:
    """Saves, async saves overlapping "training", retention, latest, list, verify, load and
    resume: all agree across ranks and the loaded bytes are the saved ones."""
    with fastpersist.CheckpointManager(root, keep_last=3, timeout=60) as mgr:
        for step in (1, 2):
            state = sharded_state(world_size, seed=step)
            state["step"] = 11
            mgr.save(step, state, metadata={"step": step})
        state = sharded_state(world_size, seed=3)
        handle = mgr.save_async(3, state)
        _bump(state)  # training goes on: the checkpoint keeps the values at save_async
        assert handle.snapshot_done()
        assert handle.wait() == "step-00000003"
        assert handle.bytes > 0 and handle.total_seconds >= handle.snapshot_seconds >= 0
        assert mgr.list() == ["step-00000001", "step-00000002", "step-00000003"], mgr.list()
        _same_everywhere(mgr.list())
        assert mgr.latest() == "step-00000003"
        _same_everywhere(mgr.latest())
        assert mgr.verify() == []
        loaded = mgr.load(into=empty_like_state(sharded_state(world_size)))
        check_loaded(loaded, seed=3)
        tag, resumed = mgr.resume(into=empty_like_state(sharded_state(world_size)))
        assert tag == "step-00000003"
        check_loaded(resumed, seed=3)
        infos = mgr.checkpoints()
        assert [i.step for i in infos] == [1, 2, 3]
        assert mgr.staging_bytes > 0
    with fastpersist.CheckpointManager(root + "-zero", timeout=60) as mgr:
        # ZeRO-style partitioned optimizer state: each rank holds one flat slice of a padded
        # flat buffer (a DTensor sharded along its only dimension).
        mesh = init_device_mesh("cpu", (world_size,))
        flat = torch.arange(8 * world_size, dtype=torch.float32)
        part = flat.chunk(world_size)[rank].clone()
        zero = {"fp32_flat": DTensor.from_local(part, mesh, [Shard(0)], run_check=False)}
        mgr.save("zero", zero)
        back = {"fp32_flat": DTensor.from_local(torch.zeros_like(part), mesh, [Shard(0)], run_check=False)}
        mgr.load("zero", into=back)
        assert torch.equal(back["fp32_flat"].to_local(), part)
        assert torch.equal(back["fp32_flat"].full_tensor(), flat)


def _local_values(state: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """A copy of this rank's tensors (local shards of DTensors)."""
    out = {}
    for part in ("model", "opt"):
        for key, value in state[part].items():
            local = value.to_local() if isinstance(value, DTensor) else value
            out[f"{part}.{key}"] = local.detach().clone()
    return out


def repeated_async_saves(rank: int, world_size: int, root: str) -> None:
    """A training loop: the same tensors saved again and again with save_async and modified in
    place right after each call, while the write runs. The manager reuses its host copy of
    the state from save to save: each checkpoint must hold the values of its own save_async
    call, neither an earlier save's (a stale copy) nor a later step's (a copy overwritten while
    it was written)."""
    state = sharded_state(world_size, seed=5)
    expected = []
    with fastpersist.CheckpointManager(root, timeout=60) as mgr:
        for step in range(1, 5):
            expected.append(_local_values(state))
            handle = mgr.save_async(step, state)
            _bump(state)
            _bump(state)
            if step % 2 == 0:
                handle.wait()  # odd steps: the next save_async waits for it
        mgr.wait()
        for step, values in enumerate(expected, start=1):
            into = empty_like_state(sharded_state(world_size))
            mgr.load(f"step-{step:08d}", into=into)
            got = _local_values(into)
            for name, value in values.items():
                assert torch.equal(got[name], value), f"step {step}, {name} differs from its save"


def resume_elastic(rank: int, world_size: int, root: str, tag: str, seed: int) -> None:
    """After a restart with another world size: the newest checkpoint that verifies, resharded."""
    with fastpersist.CheckpointManager(root, timeout=60) as mgr:
        found, state = mgr.resume(into=empty_like_state(sharded_state(world_size)))
        assert found == tag, found
        check_loaded(state, seed=seed)


def failing_rank(rank: int, world_size: int, root: str) -> None:
    """Rank 1 fails mid-save: every rank gets the same error naming rank 1, nothing is
    committed, and the manager goes on saving afterwards."""
    with fastpersist.CheckpointManager(root, timeout=60) as mgr:
        mgr.save(1, sharded_state(world_size, seed=1))
        state = sharded_state(world_size, seed=2)
        # A value only rank 1 holds, and cannot serialize (torch.save of a lambda).
        state[f"extra{rank}"] = (lambda: 0) if rank == 1 else 0
        try:
            mgr.save(2, state)
        except fastpersist.DistributedCheckpointError as e:
            message = str(e)
            assert "rank 1" in message and "not saved" in message, message
            assert set(e.failures) == {1}, e.failures
        else:
            raise AssertionError("the save succeeded although rank 1 failed")
        _same_everywhere(message)
        assert mgr.list() == ["step-00000001"]
        names = os.listdir(root)
        assert not [n for n in names if n.startswith(".tmp-")], names
        assert mgr.latest() == "step-00000001"
        mgr.save(3, sharded_state(world_size, seed=3))
        assert mgr.list() == ["step-00000001", "step-00000003"]


class _Bomb:
    """Kills its process when pickled on rank 1 (a rank dying in the middle of a save)."""

    def __reduce__(self) -> Any:
        if dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return (int, (0,))


def killed_rank(rank: int, world_size: int, root: str, report: str) -> None:
    """Rank 1 is SIGKILLed mid-save: rank 0 fails within the timeout naming rank 1, commits
    nothing, and writes what it saw to `report`."""
    mgr = fastpersist.CheckpointManager(root, timeout=20)
    mgr.save(1, sharded_state(world_size, seed=1))
    state = sharded_state(world_size, seed=2)
    state[f"bomb{rank}"] = _Bomb()
    try:
        mgr.save(2, state)
    except fastpersist.DistributedCheckpointError as e:
        with open(report, "w") as f:
            json.dump({"rank": rank, "message": str(e), "failures": {str(k): v for k, v in e.failures.items()},
                       "listing": sorted(os.listdir(root))}, f)
    os._exit(0)  # the job's process group is broken: leave without tearing it down


def per_rank_rng(rank: int, world_size: int, root: str, saved_world: int) -> None:
    """Each rank's RNG state under a key of its own: restored on the same world size; on a
    larger one (strict=False) the ranks the checkpoint has no state for keep theirs."""
    torch.manual_seed(100 + rank)
    with fastpersist.CheckpointManager(root, timeout=60) as mgr:
        if saved_world == world_size and not mgr.list():
            mgr.save(1, {"rng": {f"rank{rank}": torch.get_rng_state()}, "step": 1})
            expected = torch.get_rng_state()
            torch.rand(100)  # the training run moves on
            state = mgr.load(into={"rng": {f"rank{rank}": torch.empty_like(expected)}, "step": 0})
            torch.set_rng_state(state["rng"][f"rank{rank}"])
            assert torch.equal(torch.get_rng_state(), expected)
            return
        mine = torch.get_rng_state()
        state = mgr.load(into={"rng": {f"rank{rank}": mine.clone()}, "step": 0}, strict=False)
        restored = state["rng"][f"rank{rank}"]
        if rank < saved_world:
            torch.manual_seed(100 + rank)
            assert torch.equal(restored, torch.get_rng_state()), "the rank's saved state"
        else:
            assert torch.equal(restored, mine), "no saved state: left as it was"
        assert state["step"] == 1


def _fsdp_model(world_size: int, seed: int) -> Any:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def fsdp2_save(rank: int, world_size: int, root: str, report: str) -> None:
    """FSDP2 (fully_shard) on the CPU: model and Adam state after a step, saved sharded."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = _fsdp_model(world_size, seed=0)
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 16)).sum().backward()
    optim.step()
    msd, osd = get_state_dict(model, optim)
    with fastpersist.CheckpointManager(root, timeout=60) as mgr:
        mgr.save(1, {"model": msd, "optim": osd})
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    if rank == 0:
        torch.save(full, report)


def fsdp2_resume(rank: int, world_size: int, root: str, report: str) -> None:
    """Another world size: a fresh FSDP2 model and optimizer resume the saved ones."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = _fsdp_model(world_size, seed=1)  # other initial values
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 16)).sum().backward()
    optim.step()  # creates the optimizer state to load into
    msd, osd = get_state_dict(model, optim)
    with fastpersist.CheckpointManager(root, timeout=60) as mgr:
        tag, state = mgr.resume(into={"model": msd, "optim": osd})
    assert tag == "step-00000001"
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    expected = torch.load(report)
    for name, value in model.state_dict().items():
        assert torch.equal(value.full_tensor(), expected[name]), name


def _compressible_state(world_size: int) -> Dict[str, Any]:
    """Weight-like bf16 values and integer counters, sharded over the ranks: large enough for
    4 MiB chunks and compressible, as real state is."""
    g = torch.Generator().manual_seed(21)
    mesh = init_device_mesh("cpu", (world_size,))
    full = {"w": (torch.randn(1200, 2048, generator=g) * 0.02).to(torch.bfloat16),
            "steps": torch.arange(600 * 512, dtype=torch.int64).reshape(600, 512)}
    return {"model": {"w": distribute_tensor(full["w"], mesh, [Shard(0)])},
            "opt": {"steps": distribute_tensor(full["steps"], mesh, [Shard(0)])}, "step": 3}


def compressed_save(rank: int, world_size: int, root: str) -> None:
    """compression="zstd" on every rank's writer: the blocks are stored compressed and load
    back bit-identical, here and on another world size (compressed_resume)."""
    state = _compressible_state(world_size)
    with fastpersist.CheckpointManager(root, compression="zstd", timeout=60) as mgr:
        mgr.save(1, state)
        assert mgr.verify() == []
        back = empty_like_state(_compressible_state(world_size))
        mgr.load(into=back)
        for part, key in (("model", "w"), ("opt", "steps")):
            assert torch.equal(back[part][key].to_local(), state[part][key].to_local()), key
        if rank == 0:
            with open(os.path.join(mgr.path(1), "manifest.json")) as f:
                manifest = json.load(f)
            encodings = {t["name"]: t["encoding"] for t in manifest["tensors"]}
            assert any(name.startswith("model.w") and e == "zstd" for name, e in encodings.items()), encodings
            assert manifest["world_size"] == world_size


def compressed_resume(rank: int, world_size: int, root: str) -> None:
    with fastpersist.CheckpointManager(root, timeout=60) as mgr:
        tag, state = mgr.resume(into=empty_like_state(_compressible_state(world_size)))
        assert tag == "step-00000001"
        want = _compressible_state(world_size)
        for part, key in (("model", "w"), ("opt", "steps")):
            assert torch.equal(state[part][key].to_local(), want[part][key].to_local()), key


def tiered(rank: int, world_size: int, root: str, tier: str) -> None:
    """A multi-rank manager with a tier: rank 0's manager drains each committed checkpoint (every
    rank's files) into the tier; wait(), tier_status() and locations() agree on every rank; the
    local root lost, resume() pulls the newest from the tier and every rank loads its shard."""
    with fastpersist.CheckpointManager(root, timeout=60,
                                       tiers=[fastpersist.Tier(tier, keep_last=2)]) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, sharded_state(world_size, seed=step))
        mgr.wait()
        status = mgr.tier_status()
        assert [t.path for t in status] == [tier] and status[0].last_error == "", status
        assert status[0].waiting == ()
        _same_everywhere([(t.path, t.last_drained, t.checkpoints_drained) for t in status])
        places = {p.tag: p.roots for p in mgr.locations()}
        assert places["step-00000003"] == (root, tier), places
        assert places["step-00000001"] == (root,), places  # the tier keeps the last 2
        _same_everywhere(sorted(places.items()))
    dist.barrier()
    if rank == 0:
        import shutil
        shutil.rmtree(root)  # the local disk is lost
    dist.barrier()
    with fastpersist.CheckpointManager(root, timeout=60, tiers=[fastpersist.Tier(tier)]) as mgr:
        tag, resumed = mgr.resume(into=empty_like_state(sharded_state(world_size)))
        assert tag == "step-00000003", tag
        check_loaded(resumed, seed=3)
        assert mgr.list() == ["step-00000003"], mgr.list()
        _same_everywhere(mgr.list())


def on_commit_hook(rank: int, world_size: int, root: str, report: str) -> None:
    """on_commit on a multi-rank manager: called on rank 0 only, once per commit, in order;
    save() returns after it ran."""
    seen: List[Any] = []
    with fastpersist.CheckpointManager(root, timeout=60, on_commit=seen.append) as mgr:
        mgr.save(1, sharded_state(world_size, seed=1))
        assert [c.tag for c in seen] == (["step-00000001"] if rank == 0 else [])
        state = sharded_state(world_size, seed=2)
        mgr.save_async(2, state)
        mgr.save_async(3, sharded_state(world_size, seed=3))
    # close() returned: every callback ran.
    if rank == 0:
        with open(report, "w") as f:
            json.dump([[c.tag, c.step, c.path, c.info.num_tensors] for c in seen], f)
    else:
        assert seen == []
