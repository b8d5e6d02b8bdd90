# SPDX-License-Identifier: Apache-2.0
"""Interpreter exit with a ``save_async`` in flight (docs/commit_protocol.md, Async saves).

A real child Python opens a ``CheckpointManager``, starts ``save_async`` of a few-MB state and
then ends without ``wait()`` or ``close()``: by reaching the end of its script, or by raising an
uncaught exception. The atexit hook of ``fastpersist.checkpoint`` closes open managers, which
finishes the save. The parent then checks the root as a restarted job sees it: the checkpoint
is committed, listed, verifies and loads equal (plain exit), or is either that or absent, never
partial (exception).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import torch

import fastpersist
from _checkpoint_models import assert_state_equal

HERE = Path(__file__).resolve().parent
STEP = 7
TAG = f"step-{STEP:08d}"

# argv: ROOT HOW. Prints whether the save was still running when the script ended.
CHILD = f"""
import sys
import fastpersist
from test_checkpoint_exit import make_state

root, how = sys.argv[1], sys.argv[2]
mgr = fastpersist.CheckpointManager(root)
handle = mgr.save_async({STEP}, make_state())
print("in flight at exit:", not handle.done(), flush=True)
if how == "raise":
    raise RuntimeError("the training loop crashed")
"""


def make_state() -> Dict[str, Any]:
    """About 8 MiB of tensors plus objects, the same in the child and the parent."""
    g = torch.Generator().manual_seed(STEP)
    return {
        "model": {"embed.weight": torch.randn(1024, 1024, generator=g),
                  "lm_head.bias": torch.randn(1024, generator=g).to(torch.bfloat16)},
        "optimizer": {"exp_avg": torch.randn(1024, 1024, generator=g),
                      "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999)}]},
        "step": STEP,
    }


def run_child(root: Path, how: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", CHILD, str(root), how], capture_output=True,
                          text=True, timeout=300, env=env, check=False)


def assert_committed_intact(root: Path) -> None:
    with fastpersist.CheckpointManager(root) as mgr:
        assert mgr.list() == [TAG]
        assert mgr.latest() == TAG
        assert mgr.verify(TAG) == []
        assert_state_equal(mgr.load(TAG), make_state())


def leftovers(root: Path) -> list:
    return sorted(p.name for p in root.iterdir() if p.name.startswith((".tmp-", ".trash-")))


def test_plain_exit_finishes_the_save(tmp_path):
    root = tmp_path / "ckpts"
    proc = run_child(root, "exit")
    assert proc.returncode == 0, proc.stderr
    # Otherwise the test proves nothing: the save must still have been running at the end.
    assert "in flight at exit: True" in proc.stdout, proc.stdout
    assert "failed at exit" not in proc.stderr, proc.stderr
    assert leftovers(root) == []  # the child itself finished: no debris for the next opener
    assert_committed_intact(root)


def test_uncaught_exception_leaves_the_save_committed_or_absent(tmp_path):
    root = tmp_path / "ckpts"
    proc = run_child(root, "raise")
    assert proc.returncode != 0
    assert "RuntimeError: the training loop crashed" in proc.stderr, proc.stderr
    assert "in flight at exit: True" in proc.stdout, proc.stdout
    if (root / TAG).exists():
        assert_committed_intact(root)
    else:
        with fastpersist.CheckpointManager(root) as mgr:  # opening removes any debris
            assert mgr.list() == [] and mgr.latest() is None
        assert leftovers(root) == []
