# SPDX-License-Identifier: Apache-2.0
"""CheckpointManager(on_commit=...): called once per commit, in commit order, after the commit
(save() returns after it ran; close() after all of them); a failing callback never fails a
save; a failed save calls nothing and its error still reaches the caller."""

from __future__ import annotations

import os
import threading

import pytest
import torch

import fastpersist

from _test_support import loop_ext4


def _state(step: int, n: int = 1000):
    return {"w": torch.full((n,), float(step)), "step": step}


def test_called_after_each_commit_in_order(tmp_path):
    seen = []
    threads = set()

    def hook(c):
        assert os.path.isfile(os.path.join(c.path, "manifest.json"))  # committed already
        threads.add(threading.get_ident())
        seen.append((c.root, c.tag, c.step, c.info.num_tensors))

    with fastpersist.CheckpointManager(tmp_path, max_in_flight=3, on_commit=hook) as mgr:
        mgr.save(1, _state(1))
        assert [s[1] for s in seen] == ["step-00000001"]  # save() returned after the hook
        for step in (2, 3, 4):
            mgr.save_async(step, _state(step))
        mgr.save("named", _state(5))
    # close() returned after every callback.
    assert seen == [(str(tmp_path), f"step-0000000{i}", i, 1) for i in (1, 2, 3, 4)] + \
        [(str(tmp_path), "named", 5, 1)]
    assert threading.get_ident() not in threads  # the manager's own thread


def test_a_failing_callback_is_warned_about_and_saves_go_on(tmp_path):
    calls = []

    def hook(c):
        calls.append(c.tag)
        if c.step == 1:
            raise RuntimeError("the tracking server is down")

    with fastpersist.CheckpointManager(tmp_path, on_commit=hook) as mgr:
        with pytest.warns(RuntimeWarning, match="on_commit callback raised.*tracking server"):
            assert mgr.save(1, _state(1)) == "step-00000001"
        mgr.save(2, _state(2))
        assert mgr.list() == ["step-00000001", "step-00000002"]
    assert calls == ["step-00000001", "step-00000002"]


def test_a_failed_save_calls_nothing_and_still_reports_its_error(tmp_path):
    with loop_ext4(tmp_path, "24M") as mnt:
        seen = []
        mgr = fastpersist.CheckpointManager(mnt / "ckpts", on_commit=lambda c: seen.append(c.tag))
        mgr.save(1, _state(1))
        handle = mgr.save_async(2, _state(2, 10 << 20))  # 40 MB: more than the filesystem
        with pytest.raises(OSError):
            handle.wait()
        mgr.save(3, _state(3))
        mgr.close()
        assert seen == ["step-00000001", "step-00000003"]


def test_an_uncollected_failure_still_reaches_the_next_save(tmp_path):
    with loop_ext4(tmp_path, "24M") as mnt:
        seen = []
        mgr = fastpersist.CheckpointManager(mnt / "ckpts", on_commit=lambda c: seen.append(c.tag))
        mgr.save_async(1, _state(1, 10 << 20))  # fails; nobody waits for it
        with pytest.raises(OSError):
            mgr.wait()  # the hook watched it, and did not take the failure
        mgr.close()
        assert seen == []


def test_not_callable_is_refused(tmp_path):
    with pytest.raises(TypeError, match="on_commit must be callable"):
        fastpersist.CheckpointManager(tmp_path, on_commit="log")
    with fastpersist.CheckpointManager(tmp_path) as mgr:  # the root is not locked
        assert mgr.list() == []
