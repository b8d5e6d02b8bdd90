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
             "manager-tier": manager_tier, "writer": writer, "dcp": dcp}

if __name__ == "__main__":
    scenario, root = sys.argv[1], sys.argv[2]
    durable = len(sys.argv) < 4 or sys.argv[3] != "not-durable"
    SCENARIOS[scenario](root, durable)
    mark("end")
