# SPDX-License-Identifier: Apache-2.0
"""Saves racing with readers in another process (issue 15, "Concurrency and load"): a child
process saves a stream of checkpoints with retention (keep_last 2: each save removes an older
one), incremental with XOR deltas on one run, while this process lists the root, verifies it
with the CLI, prunes it with the CLI and loads whatever it lists. Every result must be right: a listed checkpoint loads
bit-identical to the state of its step, or is gone (removed since it was listed), never
damaged, never garbage; `verify ROOT` never calls a checkpoint being removed DAMAGED; `prune`
refuses cleanly while the saving manager holds the root (removing nothing, the saves going on);
nothing crashes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict

import pytest
import torch

import fastpersist
from fastpersist import _core

from _test_support import find_cli

SAVES = 24

CHILD = textwrap.dedent("""
    import sys, torch, fastpersist
    root, saves, incremental, closing = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[5]
    sys.path.insert(0, sys.argv[4])
    from test_cross_process_races import state_of
    with fastpersist.CheckpointManager(root, keep_last=2, incremental=incremental, xor_deltas=incremental,
                                       full_every=4, durable=False) as mgr:
        for step in range(1, saves + 1):
            mgr.save_async(step, state_of(step)).wait()
            print(step, flush=True)
        # Written before the manager lets go of the root: a prune that succeeds finds it.
        open(closing, "w").close()
""")


def state_of(step: int) -> Dict[str, torch.Tensor]:
    """The state saved at `step`: a frozen part (referenced by incremental saves), weights that
    drift a little each step (XOR deltas), and a counter."""
    g = torch.Generator().manual_seed(7)
    frozen = torch.randn(1 << 18, generator=g)
    base = torch.randn(1 << 18, generator=g) * 0.02
    drift = torch.randn(1 << 18, generator=g) * 1e-5
    return {"frozen": frozen, "weights": base + step * drift, "step": torch.tensor(step)}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def _listed(root: Path) -> list:
    """(tag, step) of every committed checkpoint, oldest first (what `fastpersist list` reads)."""
    if not root.exists():
        return []
    return [(c.tag, c.step) for c in _core.list_checkpoints(str(root)).committed]


@pytest.mark.parametrize("incremental", [False, True], ids=["full", "incremental-xor"])
def test_saves_race_with_list_verify_and_load_from_another_process(tmp_path: Path, incremental: bool) -> None:
    cli = find_cli()
    root = tmp_path / "root"
    here = os.path.dirname(os.path.abspath(__file__))
    closing = tmp_path / "closing"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(SAVES), "1" if incremental else "0", here,
                              str(closing)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    loaded, gone, verified, refused = 0, 0, 0, 0
    pruned_after_close = False
    try:
        while child.poll() is None:
            listed = _listed(root)
            for tag, step in listed:
                try:
                    state = fastpersist.load_checkpoint(root / tag)
                except (FileNotFoundError, fastpersist.CheckpointCorruptError) as e:
                    # Removed between the listing and the load: the message says which file is
                    # gone. A damaged byte would be a CheckpointCorruptError naming a checksum.
                    assert "checksum" not in str(e), e
                    assert not (root / tag / "manifest.json").exists() or not _still_listed(root, tag), e
                    gone += 1
                    continue
                want = state_of(step)
                for name, tensor in want.items():
                    assert _same(state[name], tensor), (tag, name)
                loaded += 1
            if cli is not None and listed and verified < 4:
                r = subprocess.run([cli, "verify", str(root)], capture_output=True, text=True)
                assert "DAMAGED" not in r.stdout, r.stdout
                assert "Traceback" not in r.stderr and r.returncode in (0, 1), r.stdout + r.stderr
                verified += 1
            if cli is not None and listed and refused < 3 and not pruned_after_close:
                before = _listed(root)
                r = subprocess.run([cli, "prune", str(root), "--keep-last", "1"], capture_output=True,
                                   text=True)
                if r.returncode == 0:
                    # Only once the saver has let go of the root: its saves are over (the child
                    # may still be exiting), and the prune keeps the newest one.
                    assert closing.exists(), "prune succeeded while the saver held the root: " + r.stdout
                    pruned_after_close = True
                else:
                    # The saving manager holds the root: one clean line, and nothing removed
                    # beyond the saver's own retention (it keeps the newest two it committed).
                    assert r.returncode == 1, r.stdout + r.stderr
                    assert "in use by another CheckpointManager" in r.stderr, r.stderr
                    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
                    after = _listed(root)
                    newest_two = sorted(set(before) | set(after), key=lambda c: c[1])[-2:]
                    assert all(c in after for c in newest_two), (before, after)
                    refused += 1
            time.sleep(0.01)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert out.split() == [str(s) for s in range(1, SAVES + 1)]
    assert loaded > 0, "no load overlapped the saves"
    if cli is not None:
        assert refused > 0, "no prune overlapped the saves"
    # What is left: the newest two (and, incremental, the base they reference), all intact; the
    # newest one alone (and its base) where a prune came after the saver let go of the root.
    final = _listed(root)
    newest = [SAVES] if pruned_after_close else [SAVES - 1, SAVES]
    assert [s for _, s in final][-len(newest):] == newest, final
    for tag, step in final:
        state = fastpersist.load_checkpoint(root / tag)
        assert _same(state["weights"], state_of(step)["weights"]), tag


def _still_listed(root: Path, tag: str) -> bool:
    return any(t == tag for t, _ in _listed(root))
