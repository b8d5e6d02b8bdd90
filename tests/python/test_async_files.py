# SPDX-License-Identifier: Apache-2.0
"""fastpersist.AsyncFileSaver: torch.save files written in the background. The file holds the
state as it was when its snapshot was taken, whatever the caller (or an optimizer step) does
afterwards; the previous file stays whole until the new one replaces it; failures surface."""

from __future__ import annotations

import errno
import os
import threading
from typing import Any, List

import pytest
import torch

import fastpersist
from fastpersist.async_files import AsyncFileSaver

from _test_support import loop_ext4


def _state(seed: int, n: int = 1 << 20):
    g = torch.Generator().manual_seed(seed)
    return {"big": torch.randn(n, generator=g), "small": torch.arange(10.0) + seed,
            "nested": [torch.randn(3 * n // 2, generator=g), {"step": seed}]}


def _equal(a, b) -> None:
    assert a.keys() == b.keys()
    assert torch.equal(a["big"], b["big"]) and torch.equal(a["small"], b["small"])
    assert torch.equal(a["nested"][0], b["nested"][0]) and a["nested"][1] == b["nested"][1]


def test_the_file_holds_the_state_as_it_was_at_the_snapshot(tmp_path):
    state = _state(1)
    want = {"big": state["big"].clone(), "small": state["small"].clone(),
            "nested": [state["nested"][0].clone(), {"step": 1}]}
    with AsyncFileSaver() as saver:
        handle = saver.save(state, tmp_path / "a.pt")
        state["small"].add_(100)  # copied by save() itself: it may change at once
        handle.wait_snapshot()
        assert handle.snapshot_done()
        state["big"].zero_()
        state["nested"][0].fill_(7)
        stats = handle.wait()
    assert handle.done()
    assert stats["snapshot_bytes"] == stats["borrowed_bytes"] > 0
    _equal(torch.load(tmp_path / "a.pt"), want)
    _equal(fastpersist.load(tmp_path / "a.pt"), want)


def test_an_optimizer_step_waits_for_the_snapshot(tmp_path, monkeypatch):
    model = torch.nn.Linear(1024, 1024)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # Fault injection: the snapshot starts only once a step waits for it or has finished, so a
    # step that did not wait would change the weights before they are copied.
    step_began = hold_snapshots_until_a_step_begins(monkeypatch)
    saver = AsyncFileSaver(lend_min_bytes=0)
    try:
        saver.guard_optimizer_steps()
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        saver.save(model.state_dict(), tmp_path / "m.pt")
        opt.step()  # changes every weight in place, only once the snapshot is taken
        saver.wait()
    finally:
        saver.close()
        step_began.remove()
    got = torch.load(tmp_path / "m.pt")
    for k, v in before.items():
        assert torch.equal(got[k], v), k
    assert not torch.equal(model.weight, before["weight"])
    # close() removed the guard: a later step does not wait on this saver.
    assert saver._guards == []


class _HeldSnapshots:
    """Counts finished optimizer steps and whether a step is waiting in the saver's guard."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.steps_done = 0
        self.guard_waiting = False
        self.released = False
        self.stamps: List[int] = []  # steps_done when each pending save was made, in order
        self.hook: Any = None

    def remove(self) -> None:
        if self.hook is not None:
            self.hook.remove()
        with self.cond:
            self.released = True
            self.cond.notify_all()


def hold_snapshots_until_a_step_begins(monkeypatch) -> _HeldSnapshots:
    """Fault injection: the snapshot of a save waits until a later optimizer step either waits
    for it (the saver's guard calls wait_snapshots: the right order) or finishes without
    waiting (a global step post-hook: the weights have changed already). remove() lets every
    snapshot go (when no step follows)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from fastpersist._captured_file import CapturedFile

    held = _HeldSnapshots()

    def step_done(*_: Any) -> None:
        with held.cond:
            held.steps_done += 1
            held.cond.notify_all()

    held.hook = register_optimizer_step_post_hook(step_done)
    real_save, real_snapshot = AsyncFileSaver.save, CapturedFile.snapshot
    real_wait = AsyncFileSaver.wait_snapshots

    def stamped_save(self, obj, path, **options):
        with held.cond:
            held.stamps.append(held.steps_done)
        return real_save(self, obj, path, **options)

    def late_snapshot(self, pool) -> None:
        with held.cond:
            stamp = held.stamps.pop(0)
            held.cond.wait_for(lambda: held.released or held.guard_waiting or
                               held.steps_done > stamp)
        real_snapshot(self, pool)

    def waiting(self) -> None:
        with held.cond:
            held.guard_waiting = True
            held.cond.notify_all()
        try:
            real_wait(self)
        finally:
            with held.cond:
                held.guard_waiting = False

    monkeypatch.setattr(AsyncFileSaver, "save", stamped_save)
    monkeypatch.setattr(CapturedFile, "snapshot", late_snapshot)
    monkeypatch.setattr(AsyncFileSaver, "wait_snapshots", waiting)
    return held


def test_a_file_saved_again_is_replaced_whole_in_order(tmp_path):
    path = tmp_path / "last.ckpt"
    with AsyncFileSaver(max_pending=3) as saver:
        for step in range(5):
            saver.save(_state(step), path)
            assert len(saver.pending()) <= 3
        saver.wait(path)
    _equal(torch.load(path), _state(4))
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]  # no temporary left behind


def test_max_pending_bounds_the_saves_not_yet_written(tmp_path):
    with AsyncFileSaver(max_pending=1) as saver:
        for i in range(3):
            saver.save(_state(i, 1 << 18), tmp_path / f"{i}.pt")
            assert len(saver.pending()) <= 1
    for i in range(3):
        _equal(torch.load(tmp_path / f"{i}.pt"), _state(i, 1 << 18))


def test_a_failed_write_raises_later_and_keeps_the_old_file(tmp_path):
    with loop_ext4(tmp_path, "24M") as mnt:
        path = mnt / "c.pt"
        small = _state(0, 1 << 10)
        torch.save(small, path)
        saver = AsyncFileSaver()
        handle = saver.save(_state(1, 8 << 20), path)  # 80 MiB: more than the filesystem holds
        with pytest.raises(OSError) as err:
            handle.wait()
        assert err.value.errno == errno.ENOSPC
        _equal(torch.load(path), small)
        assert sorted(os.listdir(mnt)) == ["c.pt", "lost+found"]
        saver.save(_state(2, 1 << 10), path).wait()  # the saver goes on working
        saver.close()
        _equal(torch.load(path), _state(2, 1 << 10))


def test_an_unreported_failure_raises_from_the_next_call(tmp_path):
    with loop_ext4(tmp_path, "24M") as mnt:
        saver = AsyncFileSaver()
        saver.save(_state(1, 8 << 20), mnt / "big.pt")
        with pytest.raises(OSError):
            saver.wait()
        saver.save(_state(1, 8 << 20), mnt / "big.pt")
        with pytest.raises(OSError):
            saver.close()
        assert "big.pt" not in os.listdir(mnt)


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(TypeError, match="unknown writer option.*'buffer_mb'"):
        AsyncFileSaver(buffer_mb=4)
    with pytest.raises(ValueError, match="max_pending"):
        AsyncFileSaver(max_pending=0)
    with pytest.raises(ValueError, match="io_buffer_mb"):
        AsyncFileSaver(io_buffer_mb=-1)
    with AsyncFileSaver() as saver:
        with pytest.raises(IsADirectoryError):
            saver.save(_state(0, 16), tmp_path)
        with pytest.raises(TypeError, match="unknown writer option"):
            saver.save(_state(0, 16), tmp_path / "x.pt", durabel=True)
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="closed"):
        saver.save(_state(0, 16), tmp_path / "y.pt")
