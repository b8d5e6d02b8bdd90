# SPDX-License-Identifier: Apache-2.0
"""Running a function on N real processes with a gloo process group (the distributed tests).

`run_ranks(fn, world_size, *args)` spawns `world_size` processes (torch.multiprocessing, spawn),
each initializing the default process group over a file store, calls `fn(rank, world_size,
*args)` in each, and raises if any process failed or the whole run took longer than `timeout`
seconds (a hang fails the test instead of stalling the suite). `fn` must be a module-level
function of an importable module (tests/python is on sys.path in the children).
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import sys
import tempfile
import traceback
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))


def _child(rank: int, world_size: int, store: str, fn: Callable[..., Any], args: tuple,
           errors: Any, pg_timeout: float) -> None:
    sys.path.insert(0, HERE)
    faulthandler.enable()  # a native crash or abort prints every thread's Python stack
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                                world_size=world_size,
                                timeout=datetime.timedelta(seconds=pg_timeout))
        try:
            fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
    except BaseException:
        errors.put((rank, traceback.format_exc()))
        raise


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 240,
              pg_timeout: float = 60, expect_failure: bool = False) -> Dict[int, str]:
    """Runs `fn` on `world_size` ranks; returns {rank: traceback} of the ranks that failed
    (which must be none unless `expect_failure`)."""
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs: List[Any] = []
        for rank in range(world_size):
            p = ctx.Process(target=_child, args=(rank, world_size, store, fn, args, errors, pg_timeout))
            p.start()
            procs.append(p)
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout)
        hung: Optional[int] = None
        for rank, p in enumerate(procs):
            left = (deadline - datetime.datetime.now()).total_seconds()
            p.join(max(left, 0.1))
            if p.is_alive():
                hung = rank
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    failed: Dict[int, str] = {}
    while not errors.empty():
        rank, text = errors.get()
        failed[rank] = text
    if hung is not None:
        raise AssertionError(f"rank {hung} still ran after {timeout} s (a hang); failures: {failed}")
    exits = {rank: p.exitcode for rank, p in enumerate(procs)}
    if not expect_failure and (failed or any(code != 0 for code in exits.values())):
        raise AssertionError(f"{fn.__name__} on {world_size} ranks failed (exit codes {exits}):\n" +
                             "\n".join(f"--- rank {r}:\n{t}" for r, t in sorted(failed.items())))
    for rank, code in exits.items():
        if code != 0 and rank not in failed:
            failed[rank] = f"exit code {code}"
    return failed
