# SPDX-License-Identifier: Apache-2.0
"""fastpersist.CheckpointManager with real components: a transformers GPT-2 with its AdamW
optimizer, LR scheduler and RNG states saved and restored exactly, async saves and their
handles, the optimizer hook, tags, retention, the root's lock, every dtype and the file and
staging settings."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest
import torch

import fastpersist
from fastpersist.checkpoint import tag_for
from fastpersist.checkpoint_state import DTYPE_TO_SAFETENSORS
from _checkpoint_models import (assert_state_equal, batch, clone_state, data_files,
                                every_dtype_state, logits, make_optimizer, manifest, tiny_gpt2,
                                train_step, trained_gpt2, training_state)
from _checkpoint_models import numpy_rng_state_allowed  # noqa: F401 - a fixture


def _manager(root, **kwargs) -> fastpersist.CheckpointManager:
    kwargs.setdefault("durable", False)
    return fastpersist.CheckpointManager(root, **kwargs)


def _state(n: int = 4, numel: int = 1000, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {f"w{i}": torch.randn(numel, generator=g) for i in range(n)}, "step": seed}


# ----------------------------------------------------------------------- GPT-2 round trip
@pytest.mark.usefixtures("numpy_rng_state_allowed")
def test_gpt2_training_state_round_trips_exactly(tmp_path):
    model, optimizer, scheduler = trained_gpt2(seed=0)
    state = training_state(model, optimizer, scheduler, step=1)
    expected = clone_state(state)
    ids = batch(seed=1)
    with fastpersist.CheckpointManager(tmp_path / "run") as mgr:  # durable, default backend
        tag = mgr.save(1, state, metadata={"loss": 2.5, "note": "first", "nested": {"a": [1, 2]}})
        assert tag == "step-00000001"
        assert mgr.list() == [tag] and mgr.latest() == tag
        assert mgr.verify(tag) == []
        loaded = mgr.load()
    assert_state_equal(loaded, expected)
    assert manifest(mgr.path(tag))["metadata"] == {"loss": 2.5, "note": "first",
                                                   "nested": {"a": [1, 2]}}

    # The tied weights come back as one tensor under both names.
    sd = loaded["model"]
    assert sd["lm_head.weight"] is sd["transformer.wte.weight"]

    # A fresh model (other weights) with the loaded state computes the same logits.
    restored = tiny_gpt2(seed=123)
    assert not torch.equal(logits(restored, ids), logits(model, ids))
    restored.load_state_dict(loaded["model"])
    assert torch.equal(logits(restored, ids), logits(model, ids))
    assert restored.lm_head.weight is restored.transformer.wte.weight

    # Optimizer and scheduler resume: the next step equals the one of the never-saved twin.
    r_opt, r_sched = make_optimizer(restored)
    r_opt.load_state_dict(loaded["optimizer"])
    r_sched.load_state_dict(loaded["scheduler"])
    assert r_sched.get_last_lr() == scheduler.get_last_lr()
    for _ in range(2):
        train_step(model, optimizer, ids, scheduler)
        train_step(restored, r_opt, ids, r_sched)
    for (name, p), (_, q) in zip(model.named_parameters(), restored.named_parameters()):
        assert torch.equal(p, q), name
    assert r_sched.get_last_lr() == scheduler.get_last_lr()

    # RNG states restore the same random streams.
    torch.set_rng_state(expected["rng"]["torch"])
    want_torch = torch.rand(4)
    # Like torch.load's, each loaded tensor starts its own storage (set_rng_state needs that).
    assert loaded["rng"]["torch"].storage_offset() == 0
    torch.set_rng_state(loaded["rng"]["torch"])
    assert torch.equal(torch.rand(4), want_torch)
    random.setstate(loaded["rng"]["python"])
    np.random.set_state(loaded["rng"]["numpy"])
    got = (random.random(), np.random.rand())
    random.setstate(expected["rng"]["python"])
    np.random.set_state(expected["rng"]["numpy"])
    assert got == (random.random(), np.random.rand())


def test_saving_leaves_the_callers_state_untouched(tmp_path):
    model, optimizer, scheduler = trained_gpt2(seed=2)
    state = training_state(model, optimizer, scheduler)
    before = clone_state(state)
    ptrs = {k: v.data_ptr() for k, v in state["model"].items()}
    with _manager(tmp_path) as mgr:
        mgr.save(3, state)
    assert_state_equal(state, before)
    assert {k: v.data_ptr() for k, v in state["model"].items()} == ptrs


@pytest.mark.parametrize("staging", [{}, {"staging_budget": "1MiB", "staging_window": "256KiB"}],
                         ids=["unbounded", "budget"])
def test_each_backend_round_trips(tmp_path, backend, staging):
    state = {"a": _state(numel=300_000), "b": every_dtype_state()}
    with fastpersist.CheckpointManager(tmp_path, backend=backend, durable=True, **staging) as mgr:
        mgr.save("t", state)
        assert_state_equal(mgr.load("t"), state)
        assert mgr.verify("t") == []


# ----------------------------------------------------------------------------- save_async
@pytest.mark.parametrize("staging", [{}, {"staging_budget": "1MiB", "staging_window": "256KiB"}],
                         ids=["unbounded", "budget"])
def test_save_async_handle_and_snapshot_semantics(tmp_path, staging):
    state = _state(n=6, numel=200_000)  # 4.8 MB: several staging windows
    expected = clone_state(state)
    with _manager(tmp_path, **staging) as mgr:
        h = mgr.save_async(7, state, metadata={"k": 1})
        assert isinstance(h, fastpersist.SaveHandle)
        assert h.tag == "step-00000007"
        h.wait_snapshot()
        assert h.snapshot_done()
        # The snapshot is taken: changing the tensors now must not reach the checkpoint.
        for t in state["model"].values():
            t.fill_(-1.0)
        assert h.wait() == "step-00000007"
        assert h.done() and h.snapshot_done()
        assert h.result() == "step-00000007"  # collecting twice is fine
        assert h.bytes >= sum(t.numel() * 4 for t in expected["model"].values())
        assert 0 <= h.snapshot_seconds <= h.total_seconds
        assert "done" in repr(h)
        loaded = mgr.load(7)
    assert_state_equal(loaded, expected)
    assert manifest(os.path.join(tmp_path, "step-00000007"))["metadata"] == {"k": 1}


@pytest.mark.parametrize("max_in_flight", [1, 2])
def test_max_in_flight_bounds_pending_saves(tmp_path, max_in_flight):
    states = [_state(numel=50_000, seed=i) for i in range(5)]
    with _manager(tmp_path, max_in_flight=max_in_flight) as mgr:
        handles = []
        for i, s in enumerate(states):
            handles.append(mgr.save_async(i, s))
            # Room for this save meant that all but max_in_flight - 1 earlier ones finished.
            finished_before = handles[:len(handles) - max_in_flight]
            assert all(h.done() for h in finished_before)
        mgr.wait()
        assert all(h.done() for h in handles)
        assert [h.wait() for h in handles] == [tag_for(i) for i in range(5)]
        assert mgr.list() == [tag_for(i) for i in range(5)]
        assert [c.sequence for c in mgr.checkpoints()] == [1, 2, 3, 4, 5]
        for i, s in enumerate(states):
            assert_state_equal(mgr.load(i), s)


def test_wait_snapshots_then_tensors_may_change(tmp_path):
    states = [_state(numel=100_000, seed=i) for i in range(2)]
    expected = clone_state(states)
    with _manager(tmp_path, max_in_flight=2, staging_budget="1MiB", staging_window="256KiB") as mgr:
        for i, s in enumerate(states):
            mgr.save_async(i, s)
        mgr.wait_snapshots()
        for s in states:
            for t in s["model"].values():
                t.zero_()
        mgr.wait()
        for i in range(2):
            assert_state_equal(mgr.load(i), expected[i])


def test_forward_right_after_save_async_does_not_change_the_snapshot(tmp_path):
    # BatchNorm updates its running statistics and batch counter in place during forward:
    # a training loop that runs its next forward pass while the snapshot is still streaming
    # (a small staging budget and a large weight keep it busy) must still save the values of
    # the moment save_async was called.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.BatchNorm1d(2048),
                                torch.nn.Linear(2048, 4096))
    model.train()
    x = torch.randn(16, 2048)
    model(x)
    with _manager(tmp_path, staging_budget="1MiB", staging_window="256KiB") as mgr:
        for step in range(3):
            state = model.state_dict()
            expected = clone_state(state)
            handle = mgr.save_async(step, state)
            forwards = 0
            while not handle.snapshot_done() or forwards == 0:
                model(x)  # changes 1.running_mean, 1.running_var, 1.num_batches_tracked
                forwards += 1
            handle.wait()
            assert_state_equal(mgr.load(step), expected)
            assert state["1.num_batches_tracked"].item() == expected["1.num_batches_tracked"].item() + forwards


@pytest.mark.parametrize("staging", [{}, {"staging_budget": "1MiB", "staging_window": "256KiB"}],
                         ids=["unbounded", "budget"])
def test_hooked_optimizer_step_waits_for_the_snapshot(tmp_path, staging):
    model, optimizer, scheduler = trained_gpt2(seed=3)
    ids = batch(seed=4)
    with _manager(tmp_path, **staging) as mgr:
        hook = mgr.hook_optimizer(optimizer)
        seen = []
        # Pre-hooks run in registration order: this one runs right after fastpersist's.
        mine = optimizer.register_step_pre_hook(
            lambda opt, args, kwargs: seen.append([h.snapshot_done() for h in pending]))
        pending = []
        for step in range(3):
            optimizer.zero_grad()
            model(ids, labels=ids).loss.backward()  # gradients do not change the saved state
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            expected = clone_state(state)
            pending.append(mgr.save_async(step, state))
            optimizer.step()  # immediately: must not change what is being saved
            pending[-1].wait()
            assert_state_equal(mgr.load(step), expected)
            assert not torch.equal(state["model"]["transformer.wpe.weight"],
                                   expected["model"]["transformer.wpe.weight"])
        assert seen == [[True], [True, True], [True, True, True]]
        mine.remove()
        hook.remove()


# -------------------------------------------------------------------------------- tags
def test_tags(tmp_path):
    assert tag_for(5) == "step-00000005"
    assert tag_for(0) == "step-00000000"
    assert tag_for(123456789) == "step-123456789"
    assert tag_for("best.v1_2-x") == "best.v1_2-x"
    with _manager(tmp_path) as mgr:
        assert mgr.save(5, {"x": torch.ones(1)}) == "step-00000005"
        assert mgr.save("best", {"step": 9, "x": torch.ones(1)}) == "best"
        assert mgr.save("A" * 200, {}) == "A" * 200
        for bad in ["", ".hidden", "latest", "a/b", "..", "sp ace", "é", "A" * 201, "tab\t"]:
            with pytest.raises(ValueError):
                mgr.save(bad, {"x": torch.ones(1)})
        for bad in [-1, 2 ** 63]:
            with pytest.raises(ValueError):
                mgr.save(bad, {})
        for bad in [True, 1.5, None, b"x"]:
            with pytest.raises(TypeError):
                mgr.save(bad, {})
        # A committed tag is never replaced, and the failed save leaves no debris.
        with pytest.raises(FileExistsError):
            mgr.save(5, {"x": torch.zeros(1)})
        with pytest.raises(FileExistsError):
            mgr.save_async("best", {"x": torch.zeros(1)})
        assert mgr.load(5)["x"].item() == 1.0
        assert [(c.tag, c.step) for c in mgr.checkpoints()] == [
            ("step-00000005", 5), ("best", 9), ("A" * 200, None)]
        mgr.save("flag", {"step": True})  # a bool is not a step
        assert mgr.checkpoints()[-1].step is None
        mgr.save(6, {})  # the manager still works
    assert sorted(os.listdir(tmp_path)) == sorted(
        [".lock", "latest", "step-00000005", "best", "A" * 200, "flag", "step-00000006"])


def test_duplicate_of_a_pending_save_is_refused(tmp_path):
    with _manager(tmp_path, max_in_flight=2, staging_budget="1MiB", staging_window="256KiB") as mgr:
        h = mgr.save_async("x", _state(n=8, numel=250_000))
        with pytest.raises(FileExistsError):
            mgr.save_async("x", {"y": torch.ones(1)})
        assert h.wait() == "x"
    assert sorted(mgr.load("x")["model"]) == [f"w{i}" for i in range(8)]


# ----------------------------------------------------------------------------- listing
def test_list_order_latest_and_infos(tmp_path):
    with _manager(tmp_path) as mgr:
        assert mgr.list() == [] and mgr.latest() is None and mgr.checkpoints() == []
        for tag in ["b", "a", "c"]:
            mgr.save(tag, {"w": torch.ones(10), "v": torch.zeros(2, dtype=torch.int64)})
        mgr.save(2, {})
        assert mgr.list() == ["b", "a", "c", "step-00000002"]
        assert mgr.latest() == "step-00000002"
        infos = mgr.checkpoints()
        assert [i.sequence for i in infos] == [1, 2, 3, 4]
        assert [i.step for i in infos] == [None, None, None, 2]
        assert infos[0].num_tensors == 2 and infos[0].tensor_bytes == 56
        assert infos[0].total_bytes > infos[0].tensor_bytes
        assert infos[3].num_tensors == 0 and infos[3].tensor_bytes == 0
        assert all(a.created_unix <= b.created_unix for a, b in zip(infos, infos[1:]))
        with open(os.path.join(tmp_path, "latest")) as f:
            assert f.read().strip() == "step-00000002"
        # Removing the newest: latest() falls back to the newest committed one.
        mgr.remove(2)
        assert mgr.latest() == "c"
        assert mgr.load()["w"].sum().item() == 10
    # A new manager continues the sequence after the committed ones.
    with _manager(tmp_path) as mgr:
        mgr.save("d", {})
        assert mgr.checkpoints()[-1].sequence > infos[2].sequence
        assert mgr.list() == ["b", "a", "c", "d"]
        assert mgr.latest() == "d"


def test_junk_in_the_root_is_not_listed_and_debris_is_removed(tmp_path):
    with _manager(tmp_path) as mgr:
        mgr.save(1, {"x": torch.ones(3)})
    os.mkdir(tmp_path / "not-a-checkpoint")  # no manifest
    (tmp_path / "some-file").write_text("x")
    os.mkdir(tmp_path / ".tmp-step-00000002-123-1-abc")  # a crashed save
    debris = tmp_path / ".tmp-step-00000002-123-1-abc"
    (debris / "tensors-00000-of-00001.safetensors").write_bytes(b"0")
    os.mkdir(tmp_path / ".trash-step-00000000-1-x")
    with _manager(tmp_path) as mgr:
        assert mgr.list() == ["step-00000001"]
        assert not any(n.startswith((".tmp-", ".trash-")) for n in os.listdir(tmp_path))
        assert os.path.isdir(tmp_path / "not-a-checkpoint")


# --------------------------------------------------------------------------- retention
def test_keep_last(tmp_path):
    with _manager(tmp_path, keep_last=2) as mgr:
        for step in range(1, 6):
            mgr.save(step, {"x": torch.full((4,), float(step))})
            assert mgr.list() == [tag_for(s) for s in range(max(1, step - 1), step + 1)]
        assert mgr.load()["x"][0].item() == 5.0
    assert not any(n.startswith(".trash-") for n in os.listdir(tmp_path))


def test_keep_last_with_keep_every(tmp_path):
    with _manager(tmp_path, keep_last=2, keep_every=3) as mgr:
        for step in range(1, 8):
            mgr.save(step, {"x": torch.ones(1)})
        assert mgr.list() == [tag_for(s) for s in (3, 6, 7)]
        mgr.save("best", {"step": 9, "x": torch.ones(1)})   # step 9 from the state: a multiple
        mgr.save("other", {"x": torch.ones(1)})             # no step: no milestone
        mgr.save(10, {})
        assert mgr.list() == [tag_for(3), tag_for(6), "best", "other", tag_for(10)]


def _chattr(path, flag):
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


def test_failed_retention_warns_and_does_not_fail_the_save(tmp_path):
    # An old checkpoint that cannot be removed (immutable: even root cannot rename it) makes
    # retention fail after the new checkpoint is committed: save() succeeds and warns.
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    with _manager(tmp_path, keep_last=1) as mgr:
        mgr.save(1, {"x": torch.ones(4)})
        if not _chattr(tmp_path / tag_for(1), "+i"):
            pytest.skip("cannot set the immutable flag here (needs root and ext4/xfs)")
        try:
            with pytest.warns(RuntimeWarning, match="is committed, but removing older ones failed"):
                assert mgr.save(2, {"x": torch.full((4,), 2.0)}) == tag_for(2)
            handle = mgr.save_async(3, {"x": torch.full((4,), 3.0)})
            with pytest.warns(RuntimeWarning, match=tag_for(3)):
                handle.wait()
            assert handle.retention_error is not None and tag_for(1) in handle.retention_error
            assert mgr.list() == [tag_for(1), tag_for(3)]
            assert mgr.load()["x"][0].item() == 3.0
        finally:
            _chattr(tmp_path / tag_for(1), "-i")
        handle = mgr.save_async(4, {"x": torch.full((4,), 4.0)})
        handle.wait()
        assert handle.retention_error is None
        assert mgr.list() == [tag_for(4)]


def test_verified_prune_keeps_the_newest_intact_checkpoint(tmp_path):
    with _manager(tmp_path) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, {"x": torch.full((4096,), float(step))})
        newest = tmp_path / tag_for(3)
        entry = json.loads((newest / "manifest.json").read_text())["tensors"][0]
        with open(newest / entry["file"], "r+b") as f:
            f.seek(entry["offset"] + 100)
            f.write(b"\x7f")
        with pytest.warns(UserWarning, match=f"damaged checkpoint .*{tag_for(3)}: .*'x'"):
            assert mgr.prune(keep_last=1, verify=True) == [tag_for(1)]
        assert mgr.list() == [tag_for(2), tag_for(3)]
        with pytest.warns(UserWarning, match=f"skipping damaged checkpoint {tag_for(3)}"):
            assert mgr.resume()[0] == tag_for(2)


def test_keep_every_alone_keeps_everything(tmp_path):
    with _manager(tmp_path, keep_every=2) as mgr:
        for step in range(4):
            mgr.save(step, {})
        assert len(mgr.list()) == 4


def test_prune_and_remove(tmp_path):
    with _manager(tmp_path) as mgr:
        for step in range(1, 7):
            mgr.save(step, {"x": torch.ones(2)})
        assert mgr.prune() == []
        assert mgr.prune(keep_last=3, keep_every=2) == [tag_for(1), tag_for(3)]
        assert mgr.list() == [tag_for(s) for s in (2, 4, 5, 6)]
        assert mgr.prune(keep_last=2) == [tag_for(2), tag_for(4)]
        assert mgr.prune(keep_last=1) == [tag_for(5)]
        assert mgr.prune(keep_last=1) == []
        assert mgr.list() == [tag_for(6)]
        mgr.save("x", {})
        mgr.remove("step-00000006")
        assert mgr.list() == ["x"]
        with pytest.raises(FileNotFoundError):
            mgr.remove(6)
        with pytest.raises(ValueError):
            mgr.remove("latest")
        mgr.remove("x")
        assert mgr.list() == [] and mgr.latest() is None
        with pytest.raises(FileNotFoundError):
            mgr.load()
        mgr.save("x", {"again": torch.ones(1)})  # a removed tag can be reused
        assert list(mgr.load("x")) == ["again"]
    assert sorted(n for n in os.listdir(tmp_path) if not n.startswith(".lock")) == ["latest", "x"]


# Regression (issue 10): removing the newest checkpoint left `latest` naming the deleted
# directory until the next open.
def test_removing_the_newest_points_latest_at_the_newest_remaining(tmp_path):
    pointer = tmp_path / "latest"
    with _manager(tmp_path) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, {"x": torch.full((2,), float(step))})
        mgr.remove(3)
        assert pointer.read_text() == tag_for(2) + "\n"
        mgr.remove(1)  # not the one `latest` names: the pointer stays
        assert pointer.read_text() == tag_for(2) + "\n"
        assert torch.equal(mgr.load()["x"], torch.full((2,), 2.0))
        mgr.remove(2)
        assert not pointer.exists() and mgr.latest() is None
        mgr.save(4, {"x": torch.ones(1)})
        assert pointer.read_text() == tag_for(4) + "\n"


def test_bad_policies_are_refused(tmp_path):
    for kwargs in [{"keep_last": 0}, {"keep_every": 0}, {"max_in_flight": 0},
                   {"staging_window": "1000"}]:
        with pytest.raises(ValueError):
            fastpersist.CheckpointManager(tmp_path / "r", **kwargs)
    # A refused manager did not keep the root locked.
    with _manager(tmp_path / "r") as mgr:
        mgr.save(1, {})


# ------------------------------------------------------------------------ lock / close
def test_one_manager_per_root(tmp_path):
    mgr = _manager(tmp_path)
    mgr.save(1, {"x": torch.ones(2)})
    with pytest.raises(fastpersist.CheckpointLockedError, match=str(os.getpid())) as info:
        _manager(tmp_path)
    assert isinstance(info.value, RuntimeError)
    # Reading needs no lock.
    assert fastpersist.load_checkpoint(tmp_path / "step-00000001")["x"].tolist() == [1.0, 1.0]
    mgr.close()
    with _manager(tmp_path) as again:
        again.save(2, {})
        assert again.list() == ["step-00000001", "step-00000002"]
    with _manager(tmp_path):  # the context manager released it too
        pass


def test_closed_manager_refuses_writes(tmp_path):
    mgr = _manager(tmp_path)
    h = mgr.save_async(1, _state())
    mgr.close()
    assert h.done()  # close finished it
    mgr.close()  # idempotent
    assert "closed" in repr(mgr)
    for call in [lambda: mgr.save(2, {}), lambda: mgr.save_async(2, {}), mgr.wait,
                 mgr.wait_snapshots, lambda: mgr.remove(1), lambda: mgr.prune(keep_last=1)]:
        with pytest.raises(ValueError, match="closed"):
            call()
    # What is committed can still be read.
    assert mgr.list() == ["step-00000001"]
    assert_state_equal(mgr.load(1), _state())


def test_context_manager_closes_on_error(tmp_path):
    with pytest.raises(KeyError):
        with _manager(tmp_path) as mgr:
            mgr.save_async(1, _state())
            raise KeyError("boom")
    assert mgr.list() == ["step-00000001"]
    with _manager(tmp_path):
        pass


def test_optimizer_hook_is_removed_by_close(tmp_path):
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mgr = _manager(tmp_path)
    mgr.hook_optimizer(opt)
    assert len(opt._optimizer_step_pre_hooks) == 1
    mgr.close()
    assert len(opt._optimizer_step_pre_hooks) == 0
    model(torch.ones(1, 4)).sum().backward()
    opt.step()


# ------------------------------------------------------------------------------ metadata
def test_metadata_must_be_a_json_object(tmp_path):
    with _manager(tmp_path) as mgr:
        for bad in [[1, 2], "text", 3, {"x": object()}, {"t": torch.ones(1)}]:
            with pytest.raises(TypeError):
                mgr.save(1, {}, metadata=bad)
        with pytest.raises(ValueError):  # NaN is not JSON
            mgr.save(1, {}, metadata={"loss": float("nan")})
        assert mgr.list() == []
        meta = {"loss": 1.25, "tags": ["a", "b"], "cfg": {"lr": 1e-3, "none": None}, "ok": True,
                "unicode": "é✓"}
        mgr.save(1, {}, metadata=meta)
        mgr.save(2, {})
        assert manifest(mgr.path(tag_for(1)))["metadata"] == meta
        assert manifest(mgr.path(tag_for(2)))["metadata"] == {}


# ---------------------------------------------------------------------------- contents
def test_every_dtype_and_layout_round_trips(tmp_path):
    state = every_dtype_state(seed=5)
    with _manager(tmp_path) as mgr:
        mgr.save(1, state)
        loaded = mgr.load(1)
        m = manifest(mgr.path(tag_for(1)))
    assert_state_equal(loaded, state)
    for t in loaded.values():
        assert t.is_contiguous()
    dtypes = {t["name"]: t["dtype"] for t in m["tensors"]}
    for name, t in state.items():
        assert dtypes[name] == DTYPE_TO_SAFETENSORS[t.dtype]
    assert {"BOOL", "BF16", "U8", "F16", "F64", "I64"} <= set(dtypes.values())
    assert m["aliases"] == {}


def test_shapes_sharing_and_state_forms(tmp_path):
    base = torch.arange(12, dtype=torch.float32)
    shared = torch.randn(3, 3)
    states = {
        "bare": torch.arange(6).reshape(2, 3),
        "empty_state": {},
        "no_tensors": {"a": 1, "b": "two", "c": [None, 3.5], "d": {"e": (1, 2)}},
        "nested": {"list": [torch.ones(2), {"x": torch.zeros(1)}], "tuple": (torch.ones(1), 5),
                   0: torch.full((2,), 7.0)},
        "views": {"whole": base, "head": base[:4], "tail": base[8:], "t": base.view(3, 4).t()},
        "aliases": {"a": shared, "b": shared, "deep": {"c": shared}},
        "zero_dim": {"s": torch.tensor(3.5), "i": torch.tensor(7), "b": torch.tensor(True)},
        "empty": {"e0": torch.empty(0), "e1": torch.empty(3, 0, 2, dtype=torch.int8)},
    }
    with _manager(tmp_path) as mgr:
        for tag, s in states.items():
            mgr.save(tag, s)
        for tag, s in states.items():
            assert_state_equal(mgr.load(tag), s, tag)
        loaded = mgr.load("aliases")
        assert loaded["a"] is loaded["b"] is loaded["deep"]["c"]
        assert manifest(mgr.path("aliases"))["aliases"] == {"b": "a", "deep.c": "a"}
        assert mgr.checkpoints()[list(states).index("aliases")].num_tensors == 1
        for tag in ("no_tensors", "empty_state"):
            m = manifest(mgr.path(tag))
            assert m["tensors"] == [] and m["aliases"] == {}
            assert mgr.verify(tag) == []


def test_many_small_files_round_trip(tmp_path):
    state = _state(n=24, numel=8192)  # 24 x 32 KiB
    state["small"] = every_dtype_state()
    with _manager(tmp_path, target_file_size="128KiB", max_parallel_files=3) as mgr:
        tag = mgr.save(1, state)
        files = data_files(mgr.path(tag))
        assert len(files) >= 6
        n = len(files)
        assert files == [f"tensors-{i:05d}-of-{n:05d}.safetensors" for i in range(n)]
        assert_state_equal(mgr.load(tag), state)
        assert_state_equal(mgr.load(tag, max_memory="64KiB"), state)
        assert mgr.verify(tag) == []
        m = manifest(mgr.path(tag))
        assert {t["file"] for t in m["tensors"]} == set(files)


def test_small_staging_budget_round_trips(tmp_path):
    # Tensors larger than both the window and the budget, and many small ones.
    state = {"big": torch.randn(1_000_000), "mid": torch.randn(300, 1000).t(),
             "small": _state(n=50, numel=100), "dtypes": every_dtype_state(seed=9)}
    with _manager(tmp_path, staging_budget="1MiB", staging_window="256KiB",
                  target_file_size="2MiB", max_in_flight=2) as mgr:
        handles = [mgr.save_async(i, state) for i in range(3)]
        assert [h.wait() for h in handles] == [tag_for(i) for i in range(3)]
        for i in range(3):
            assert_state_equal(mgr.load(i), state)
            assert mgr.verify(i) == []


def test_staging_budget_is_a_cap_even_below_one_window(tmp_path):
    state = {"big": torch.randn(1_000_000), "small": _state(n=5, numel=100)}
    with _manager(tmp_path / "a" / "b", staging_budget="1MiB") as mgr:  # 64 MiB windows
        mgr.save(1, state)
        assert 0 < mgr.staging_bytes <= 1 << 20
        assert_state_equal(mgr.load(), state)
    with _manager(tmp_path / "c") as mgr:  # unbounded: as much as the checkpoint needs
        mgr.save(1, state)
        assert mgr.staging_bytes >= 4_000_000
    with pytest.raises(ValueError, match="staging_budget"):
        _manager(tmp_path / "d", staging_budget=100)


def test_save_from_a_thread_and_load_elsewhere(tmp_path):
    state = _state()
    errors = []

    def worker():
        try:
            with _manager(tmp_path) as mgr:
                mgr.save(1, state)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    th = threading.Thread(target=worker)
    th.start()
    th.join()
    assert errors == []
    assert_state_equal(fastpersist.load_checkpoint(tmp_path / tag_for(1)), state)
    assert (tmp_path / "latest").read_text().strip() == tag_for(1)


# ---------------------------------------------------------------------------- failures
def test_a_failed_save_is_reported_until_collected(tmp_path):
    root = tmp_path / "root"
    mgr = _manager(root)
    shutil.rmtree(root)  # the background save cannot create its directory
    h = mgr.save_async(1, _state())
    deadline = time.monotonic() + 30
    while not h.done() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert h.done() and h.snapshot_done()
    # Nobody waited on it: the next save raises it (and is not queued).
    with pytest.raises(FileNotFoundError):
        mgr.save_async(2, _state())
    with pytest.raises(FileNotFoundError):  # the handle still tells
        h.wait()
    os.mkdir(root)
    assert mgr.save(3, _state()) == tag_for(3)
    assert mgr.list() == [tag_for(3)]
    shutil.rmtree(root)
    h = mgr.save_async(4, {})
    with pytest.raises(OSError):
        mgr.close()  # close raises what nobody collected, and still closes
    with pytest.raises(ValueError, match="closed"):
        mgr.save(5, {})
