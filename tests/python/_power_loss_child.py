# SPDX-License-Identifier: Apache-2.0
"""Programs recorded by tests/python/test_power_loss.py, one per path that commits.

``python _power_loss_child.py SCENARIO ROOT [durable]``, run with the recorder preloaded
(``_crashsim.record``). After each save returns (the moment the caller may rely on it), the
program marks ``ack <what> <step>`` through the recorder, so the checker knows what was
acknowledged before each simulated power cut. Every value saved derives from its step
(:func:`_checkpoint_crash_child.make_state`), so a checker can tell any state's bytes apart.
"""

from __future__ import annotations

import ctypes
import os
import sys

import torch

import fastpersist
from fastpersist.checkpoint import tag_for
from _checkpoint_crash_child import make_state

KEEP_LAST = 2
STEPS = (1, 2, 3, 4)
WRITER_FILE = "model.pt"


def mark(text: str) -> None:
    """An acknowledgement, recorded as an event (the recorder is preloaded in this process)."""
    fn = ctypes.CDLL(None).fp_crashsim_mark
    fn.argtypes = [ctypes.c_char_p]
    fn(text.encode())


def small_state(step: int) -> dict:
    """A few tensors of several kinds, values from the step (a DCP state: no non-tensor leaves
    besides the step)."""
    full = make_state(step)
    return {"model": full["model"], "rng": full["rng"], "step": torch.tensor(step)}


def manager(root: str, durable: bool, compression: str | None = None, incremental: bool = False) -> None:
    mgr = fastpersist.CheckpointManager(root, keep_last=KEEP_LAST, durable=durable, compression=compression,
                                        incremental=incremental, full_every=3)
    for i, step in enumerate(STEPS):
        state = make_state(step)
        if i % 2 == 0:
            tag = mgr.save(step, state)
        else:
            tag = mgr.save_async(step, state).wait()
        mark(f"ack {tag} {step}")
    mgr.close()


def writer(root: str, durable: bool) -> None:
    path = os.path.join(root, WRITER_FILE)
    for step in STEPS[:3]:
        fastpersist.save(small_state(step), path, durable=durable)
        mark(f"ack {WRITER_FILE} {step}")


def dcp(root: str, durable: bool) -> None:
    import torch.distributed.checkpoint as dist_cp

    from fastpersist.dcp import FastPersistWriter

    for step in STEPS[:2]:
        tag = tag_for(step)
        writer = FastPersistWriter(os.path.join(root, tag), step=step, durable=durable)
        dist_cp.save(small_state(step), storage_writer=writer)
        mark(f"ack {tag} {step}")


def _join_ranks() -> int:
    """The default process group of the ranks that ``_crashsim.record_ranks`` started; returns
    this process's rank."""
    import datetime

    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"file://{os.environ['FP_CRASHSIM_STORE']}",
                            rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=120))
    return rank


def ranks_state(step: int) -> dict:
    """The state of a sharded training job at ``step``, as each rank holds it (DTensors sharded
    over the ranks, a replicated one, plain values; every value from the step)."""
    import torch.distributed as dist
    from _dcp_workers import sharded_state

    state = sharded_state(dist.get_world_size(), seed=step)
    state["step"] = step
    return state


def full_ranks_state(step: int) -> dict:
    """What a single process loading a checkpoint of :func:`ranks_state` gets: whole tensors."""
    from _dcp_workers import full_state

    full = full_state(step)
    return {"model": {"w": full["model.w"], "b": full["model.b"]},
            "opt": {"m": full["opt.m"], "steps": full["opt.steps"]},
            "step": step, "note": {"text": "hello", "lr": 0.5}}


def dcp_ranks(root: str, durable: bool) -> None:
    """``dcp.save`` with ``FastPersistWriter`` on every rank: each rank writes its shards, the
    coordinator (rank 0) commits. Rank 0 marks each save once ``dcp.save`` returned."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dist_cp

    from fastpersist.dcp import FastPersistWriter

    rank = _join_ranks()
    for step in STEPS[:2]:
        tag = tag_for(step)
        writer = FastPersistWriter(os.path.join(root, tag), step=step, durable=durable)
        dist_cp.save(ranks_state(step), storage_writer=writer)
        if rank == 0:
            mark(f"ack {tag} {step}")
    dist.barrier()


def manager_ranks(root: str, durable: bool) -> None:
    """A ``CheckpointManager`` on every rank (``keep_last=2``): ``save`` and ``save_async`` +
    ``wait`` alternating, retention removing the oldest. Rank 0 marks each acknowledged save."""
    import torch.distributed as dist

    rank = _join_ranks()
    mgr = fastpersist.CheckpointManager(root, keep_last=KEEP_LAST, durable=durable, timeout=120)
    for i, step in enumerate(STEPS):
        state = ranks_state(step)
        tag = mgr.save(step, state) if i % 2 == 0 else mgr.save_async(step, state).wait()
        if rank == 0:
            mark(f"ack {tag} {step}")
    mgr.close()
    dist.barrier()


def manager_ranks_tier(root: str, durable: bool) -> None:
    """A manager on every rank saving into ROOT/local, rank 0's draining each checkpoint (every
    rank's files) into the tier ROOT/tier; after each save, ``wait()`` returns once the tier has
    it. Rank 0 marks ``ack`` and ``drained``."""
    import torch.distributed as dist

    rank = _join_ranks()
    mgr = fastpersist.CheckpointManager(os.path.join(root, "local"), keep_last=KEEP_LAST, durable=durable,
                                        timeout=120, tiers=[fastpersist.Tier(os.path.join(root, "tier"),
                                                                             keep_last=KEEP_LAST)])
    for step in STEPS:
        tag = mgr.save(step, ranks_state(step))
        if rank == 0:
            mark(f"ack {tag} {step}")
        mgr.wait()
        if rank == 0:
            mark(f"drained {tag} {step}")
    mgr.close()
    dist.barrier()


PULLED_STEPS = (1, 2)


def pull_setup(root: str, durable: bool) -> None:
    """Run unrecorded before ``pull``: a tier ROOT/tier holding the checkpoints of PULLED_STEPS,
    drained from a local root that is then lost."""
    import shutil

    local = os.path.join(root, "lost")
    mgr = fastpersist.CheckpointManager(local, durable=durable,
                                        tiers=[fastpersist.Tier(os.path.join(root, "tier"))])
    for step in PULLED_STEPS:
        mgr.save(step, make_state(step))
    mgr.wait()
    mgr.close()
    shutil.rmtree(local)


def pull(root: str, durable: bool) -> None:
    """A new local root ROOT/local filled back from the tier: ``pull`` of the oldest, then
    ``resume()`` (which pulls the newest). Each is marked ``ack <tag> <step>`` once it returned."""
    mgr = fastpersist.CheckpointManager(os.path.join(root, "local"), durable=durable,
                                        tiers=[fastpersist.Tier(os.path.join(root, "tier"))])
    first = tag_for(PULLED_STEPS[0])
    assert mgr.pull(first) > 0
    mark(f"ack {first} {PULLED_STEPS[0]}")
    tag, _ = mgr.resume()
    assert tag == tag_for(PULLED_STEPS[-1]), tag
    mark(f"ack {tag} {PULLED_STEPS[-1]}")
    mgr.close()


def manager_zstd(root: str, durable: bool) -> None:
    """The manager writing compressed data files (their header is written after the data)."""
    manager(root, durable, compression="zstd")


def manager_incremental(root: str, durable: bool) -> None:
    """Incremental saves: the frozen part of the state is a reference into the base, which
    retention (keep_last) must keep while a kept checkpoint references it."""
    manager(root, durable, incremental=True)


def manager_tier(root: str, durable: bool) -> None:
    """Saves into ROOT/local drained into the tier ROOT/tier; after each save, ``wait()``
    returns once the tier has it: marked ``drained <tag> <step>``."""
    mgr = fastpersist.CheckpointManager(os.path.join(root, "local"), keep_last=KEEP_LAST, durable=durable,
                                        tiers=[fastpersist.Tier(os.path.join(root, "tier"),
                                                                keep_last=KEEP_LAST)])
    for step in STEPS:
        tag = mgr.save(step, make_state(step))
        mark(f"ack {tag} {step}")
        mgr.wait()
        mark(f"drained {tag} {step}")
    mgr.close()


SCENARIOS = {"manager": manager, "manager-zstd": manager_zstd, "manager-incremental": manager_incremental,
             "manager-tier": manager_tier, "writer": writer, "dcp": dcp, "dcp-ranks": dcp_ranks,
             "manager-ranks": manager_ranks, "manager-ranks-tier": manager_ranks_tier,
             "pull-setup": pull_setup, "pull": pull}

if __name__ == "__main__":
    scenario, root = sys.argv[1], sys.argv[2]
    durable = len(sys.argv) < 4 or sys.argv[3] != "not-durable"
    SCENARIOS[scenario](root, durable)
    if not scenario.endswith("-setup"):  # setups run unrecorded
        mark("end")
    if "RANK" in os.environ:
        # Without interpreter finalization: torch's gloo threads can outlive the process group
        # and abort a finalizing interpreter (see _distributed.py).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
