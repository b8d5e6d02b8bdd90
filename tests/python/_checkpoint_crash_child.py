# SPDX-License-Identifier: Apache-2.0
"""Child side of tests/python/test_checkpoint_crash.py: a "training loop" that checkpoints with
``CheckpointManager`` until it is killed with SIGKILL.

Two ways to run it:

- ``python _checkpoint_crash_child.py run ROOT SEED [TIER]``: a fresh interpreter opens the
  manager, builds the first state, prints ``started`` just before its first save, then saves in
  a loop, printing ``committed TAG`` for every save it knows is committed (flushed at once),
  preceded by ``retention-failed TAG`` when removing older checkpoints after it failed (the
  soak's injected fsync EIO: the save is committed, the old ones stay until the next pass).
  With TIER, the manager drains every committed checkpoint into that directory (a tier keeping
  its newest TIER_KEEP_LAST), and after some saves waits for the drains, printing
  ``drained TAG`` (every checkpoint committed up to TAG is in the tier).
- ``python _checkpoint_crash_child.py serve``: a fork server. Importing torch costs seconds on a
  small machine, so the test starts this once; it imports torch and fastpersist (and runs no
  tensor op, so no thread pool exists yet) and then, for each ``fork ROOT SEED [TIER]`` line on stdin,
  forks a child that runs the same loop as ``run``. Every line on stdout is ``<pid> <text>``:
  the server's own lines carry its pid (``forked CHILD_PID``, ``reaped CHILD_PID STATUS``), a
  child's lines carry the child's pid. Each line is one write() below PIPE_BUF, so lines of the
  server and of a child never interleave. ``reap PID`` waits for that child and reports its
  raw wait status.

The state saved at each step is :func:`make_state` (a small model's state_dict, Adam-like
optimizer state, an int step and a string), with every value derived from the step, so the
parent can check a loaded checkpoint's content from its tag alone (:func:`expected_state`).
"""

from __future__ import annotations

import os
import random
import sys
import traceback
from typing import Any, Dict, List, Tuple

import torch

import fastpersist
import fastpersist.checkpoint  # noqa: F401 - the lazy import happens before any fork

KEEP_LAST = 3
TIER_KEEP_LAST = 4

# A small MLP's state_dict layout (what nn.Sequential(Linear(256, 512), ReLU(), Linear(512,
# 256), LayerNorm(256)).state_dict() holds), ~1 MB of float32; the optimizer state doubles it.
MODEL_LAYOUT: List[Tuple[str, Tuple[int, ...]]] = [
    ("0.weight", (512, 256)),
    ("0.bias", (512,)),
    ("2.weight", (256, 512)),
    ("2.bias", (256,)),
    ("3.weight", (256,)),
    ("3.bias", (256,)),
]


_BASES: Dict[Tuple[Tuple[int, ...], torch.dtype], torch.Tensor] = {}


def _pattern(step: int, k: int, shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Position-dependent values unique to (step, k): torn, stale or mixed bytes all show.

    A fresh tensor each call (one add onto a cached base); every value stays below 2**24, so
    float32 holds it exactly."""
    key = (shape, dtype)
    if key not in _BASES:
        n = 1
        for d in shape:
            n *= d
        _BASES[key] = torch.arange(n, dtype=torch.int64).remainder_(1009).to(dtype).reshape(shape)
    return _BASES[key] + (step * 2048 + k * 1013) % (1 << 20)


# A frozen part (an embedding a fine-tune does not train): the same bytes at every step, larger
# than everything that changes, so incremental saves store it as a reference to their base.
FROZEN_SHAPE = (1024, 1024)


def make_state(step: int) -> Dict[str, Any]:
    model = {name: _pattern(step, k, shape, torch.float32)
             for k, (name, shape) in enumerate(MODEL_LAYOUT)}
    model["frozen.embed"] = _pattern(0, 97, FROZEN_SHAPE, torch.float32)
    n = len(MODEL_LAYOUT)
    optim_state = {
        i: {"step": torch.tensor(float(step)),
            "exp_avg": _pattern(step, n + 2 * i, shape, torch.float32),
            "exp_avg_sq": _pattern(step, n + 2 * i + 1, shape, torch.float32)}
        for i, (_, shape) in enumerate(MODEL_LAYOUT)
    }
    return {
        "model": model,
        "optimizer": {"state": optim_state,
                      "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999),
                                        "params": list(range(n))}]},
        "rng": _pattern(step, 3 * n, (64,), torch.int64),
        "step": step,
        "note": f"state of step {step}",
    }


expected_state = make_state


def metadata(step: int) -> Dict[str, Any]:
    return {"step": step, "writer_pid": os.getpid()}


def run(root: str, seed: int, emit, tier: str = "") -> None:
    """Opens the root, builds the first state, says ``started``, then saves until killed."""
    rng = random.Random(seed)
    # A third of the children write compressed checkpoints: kills land in their pipeline too,
    # and a root holds both kinds, as after a run changed its setting.
    compression = (None, "zstd", "lz4")[seed % 3]
    # Half of them save incrementally (seeds 3..5 mod 6 meet every codec): a kill can land
    # between a base and the saves that reference it, and retention must keep the base.
    incremental = seed % 6 >= 3
    # One in six also takes XOR deltas of the changed floats against the base (seed 4 mod 6,
    # with zstd): their encoding is chosen chunk by chunk while a kill may land.
    xor_deltas = seed % 6 == 4
    tiers = [fastpersist.Tier(tier, keep_last=TIER_KEEP_LAST)] if tier else None
    mgr = fastpersist.CheckpointManager(root, keep_last=KEEP_LAST, compression=compression,
                                        incremental=incremental, full_every=4, xor_deltas=xor_deltas,
                                        tiers=tiers)
    steps = [c.step for c in mgr.checkpoints() if c.step is not None]
    # Continue after the newest step on disk, plus a gap: a step that was in flight when the
    # previous child died is never reused (its tag may be on disk only after a commit).
    step = (max(steps) if steps else 0) + 10
    pending: List[Any] = []
    started = False

    newest = ""

    def committed(handle: Any) -> str:
        tag = handle.wait()
        if handle.retention_error:
            emit(f"retention-failed {tag}")
        emit(f"committed {tag}")
        return tag

    def collect(block: bool) -> None:
        nonlocal newest
        while pending and (block or pending[0].done()):
            newest = committed(pending.pop(0))

    while True:
        step += 1
        state = make_state(step)
        mode = rng.choice(("save", "async_wait", "async_later"))
        if not started:
            # The manager is open and the first state is built: the saves begin now.
            emit("started")
            started = True
        if mode == "save":
            collect(block=True)
            newest = committed(mgr.save_async(step, state, metadata=metadata(step)))  # = save()
        else:
            pending.append(mgr.save_async(step, state, metadata=metadata(step)))
            if mode == "async_wait":
                collect(block=True)
            else:
                collect(block=False)
        if tier and rng.random() < 0.25:
            collect(block=True)
            mgr.wait(timeout=120)  # the saves, then their drains; raises a drain's failure
            emit(f"drained {newest}")


def _stdout_emitter(prefix: str):
    def emit(text: str) -> None:
        os.write(1, f"{prefix}{text}\n".encode())  # one write(): never torn, never buffered
    return emit


def _child_main(root: str, seed: int, prefix: str, tier: str = "") -> None:
    emit = _stdout_emitter(prefix)
    try:
        run(root, seed, emit, tier)
    except BaseException as e:  # noqa: BLE001 - the parent reads this line and stderr
        traceback.print_exc()
        sys.stderr.flush()
        emit(f"failed {type(e).__name__}: {e}".replace("\n", " ")[:2000])
        os._exit(3)


def serve() -> None:
    me = os.getpid()
    emit = _stdout_emitter(f"{me} ")
    emit("ready")
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "fork":
            root, seed = words[1], int(words[2])
            tier = words[3] if len(words) > 3 else ""
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.close(devnull)
                _child_main(root, seed, f"{os.getpid()} ", tier)
                os._exit(4)  # run() never returns
            emit(f"forked {pid}")
        elif words[0] == "reap":
            pid = int(words[1])
            _, status = os.waitpid(pid, 0)
            emit(f"reaped {pid} {status}")
        elif words[0] == "exit":
            return
        else:
            emit(f"error unknown command {line.strip()!r}")


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    elif sys.argv[1] == "run":
        _child_main(sys.argv[2], int(sys.argv[3]), "", sys.argv[4] if len(sys.argv) > 4 else "")
    else:
        raise SystemExit(f"usage: {sys.argv[0]} serve | run ROOT SEED [TIER]")
