# SPDX-License-Identifier: Apache-2.0
"""Warm restore, ``resume(optimizer="background")`` (issue 13): a real training loop (an MLP with
AdamW and a learning-rate schedule, real files) resumed warm trains bit-identically to one
resumed normally; the optimizer's first step() waits for its state; finish_restore(); a damaged
optimizer state raises at step() (every time) and the foreground resume then skips that
checkpoint; saves are refused until the state is in place; misuse is refused clearly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest
import torch
from torch import nn

import fastpersist
from fastpersist import BackgroundState, CheckpointCorruptError


def make(seed: int = 0) -> Tuple[nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 256), nn.LayerNorm(256), nn.GELU(), nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return model, opt, sched


def train(model: nn.Module, opt: torch.optim.Optimizer, sched: Any, steps: range) -> None:
    for step in steps:
        g = torch.Generator().manual_seed(step)
        x = torch.randn(32, 64, generator=g)
        loss = (model(x) - x.flip(1)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def snapshot(model: nn.Module, opt: torch.optim.Optimizer, sched: Any, step: int) -> Dict[str, Any]:
    return {"model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "step": step}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A root with checkpoints after 5 and 8 real training steps."""
    model, opt, sched = make()
    with fastpersist.CheckpointManager(tmp_path / "ckpts", durable=False) as mgr:
        train(model, opt, sched, range(5))
        mgr.save(5, snapshot(model, opt, sched, 5))
        train(model, opt, sched, range(5, 8))
        mgr.save(8, snapshot(model, opt, sched, 8))
    return tmp_path / "ckpts"


def assert_same_training_state(a: Tuple[nn.Module, torch.optim.Optimizer, Any],
                               b: Tuple[nn.Module, torch.optim.Optimizer, Any]) -> None:
    for (name, pa), pb in zip(a[0].state_dict().items(), b[0].state_dict().values()):
        assert torch.equal(pa.view(torch.uint8), pb.view(torch.uint8)), name
    sa, sb = a[1].state_dict(), b[1].state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys() and len(sa["state"]) == 6
    for idx, per_param in sa["state"].items():
        for k, v in per_param.items():
            assert torch.equal(v, sb["state"][idx][k]), (idx, k)
    assert a[2].state_dict() == b[2].state_dict()


def test_warm_restore_trains_bit_identically_to_a_normal_resume(root: Path) -> None:
    normal = make(seed=1)
    with fastpersist.CheckpointManager(root) as mgr:
        tag, state = mgr.resume()
        normal[0].load_state_dict(state["model"])
        normal[1].load_state_dict(state["optimizer"])
        normal[2].load_state_dict(state["scheduler"])
    train(*normal, range(8, 14))

    warm = make(seed=2)
    with fastpersist.CheckpointManager(root) as mgr:
        mgr.hook_optimizer(warm[1])
        warm_tag, state = mgr.resume(optimizer="background")
        assert warm_tag == tag == "step-00000008" and state["step"] == 8
        assert isinstance(state["optimizer"], BackgroundState)
        assert state["optimizer"].tag == tag and state["optimizer"].key == "optimizer"
        assert warm[1].state_dict()["state"] == {}  # not in place before the first step
        warm[0].load_state_dict(state["model"])
        warm[2].load_state_dict(state["scheduler"])
        train(*warm, range(8, 14))
        # The state a warm restore loaded is the whole optimizer entry, tensors and all.
        loaded = state["optimizer"].result()
        assert set(loaded) == {"state", "param_groups"} and len(loaded["state"]) == 6
        assert all("exp_avg_sq" in s for s in loaded["state"].values())
        mgr.save(14, snapshot(*warm, 14))  # in place now: saves go on
    assert_same_training_state(normal, warm)


def test_finish_restore_applies_the_state_without_a_step(root: Path) -> None:
    model, opt, sched = make(seed=3)
    with fastpersist.CheckpointManager(root) as mgr:
        mgr.hook_optimizer(opt)
        _, state = mgr.resume(optimizer="background", map_location="cpu")
        with pytest.raises(RuntimeError, match="finish_restore"):
            mgr.save(9, {"model": model.state_dict(), "optimizer": opt.state_dict()})
        assert mgr.list() == ["step-00000005", "step-00000008"]  # nothing was saved
        mgr.finish_restore(timeout=60)
        assert state["optimizer"].done()
        assert opt.state_dict()["state"][0]["step"] == 8
        mgr.save(9, {"model": model.state_dict(), "optimizer": opt.state_dict()})
        assert mgr.list()[-1] == "step-00000009"


def test_a_damaged_optimizer_state_raises_at_step_and_is_skipped_by_a_normal_resume(root: Path) -> None:
    ckpt = root / "step-00000008"
    tensors = json.loads((ckpt / "manifest.json").read_text())["tensors"]
    victim = next(t for t in tensors if t["name"] == "optimizer.state.2.exp_avg")
    path = ckpt / victim["file"]
    data = bytearray(path.read_bytes())
    data[victim["offset"] + victim["length"] // 2] ^= 0x40
    path.write_bytes(bytes(data))

    model, opt, sched = make(seed=4)
    with fastpersist.CheckpointManager(root) as mgr:
        mgr.hook_optimizer(opt)
        tag, state = mgr.resume(optimizer="background")  # the model's bytes are intact
        assert tag == "step-00000008"
        model.load_state_dict(state["model"])
        for _ in range(2):  # never steps without its state: each step raises again
            with pytest.raises(CheckpointCorruptError, match=r"warm restore.*optimizer\.state\.2\.exp_avg"):
                train(model, opt, sched, range(8, 9))
        assert opt.state_dict()["state"] == {}
        with pytest.warns(UserWarning, match="skipping damaged checkpoint step-00000008"):
            tag, state = mgr.resume()
        assert tag == "step-00000005"


def test_into_fills_the_model_in_place_and_strict_checks_only_its_part(root: Path) -> None:
    model, opt, _ = make(seed=7)
    addresses = {k: t.data_ptr() for k, t in model.state_dict().items()}
    with fastpersist.CheckpointManager(root) as mgr:
        mgr.hook_optimizer(opt)
        _, state = mgr.resume(into={"model": model.state_dict()}, optimizer="background")
        assert {k: t.data_ptr() for k, t in state["model"].items()} == addresses  # in place
        mgr.finish_restore(timeout=60)
        assert opt.state_dict()["state"][0]["step"] == 8
        # The model's part is still checked: a destination the checkpoint lacks is refused.
        with pytest.raises(ValueError, match="extra"):
            mgr.resume(into={"model": {**model.state_dict(), "extra": torch.zeros(3)}},
                       optimizer="background")


def test_keys_and_map_location_apply_to_both_parts(root: Path) -> None:
    model, opt, _ = make(seed=5)
    with fastpersist.CheckpointManager(root) as mgr:
        mgr.hook_optimizer(opt)
        _, state = mgr.resume(optimizer="background",
                              keys=lambda n: not n.endswith("exp_avg_sq"), dtype=torch.float64)
        assert state["model"]["0.weight"].dtype == torch.float64
        loaded = state["optimizer"].result(timeout=60)
        assert all("exp_avg_sq" not in s and s["exp_avg"].dtype == torch.float64
                   for s in loaded["state"].values())


def test_misuse_is_refused_clearly(root: Path) -> None:
    model, opt, _ = make(seed=6)
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    with fastpersist.CheckpointManager(root) as mgr:
        with pytest.raises(ValueError, match="hook_optimizer"):
            mgr.resume(optimizer="background")
        with pytest.raises(ValueError, match="'foreground' or 'background'"):
            mgr.resume(optimizer="later")
        with pytest.raises(TypeError, match="key"):
            mgr.hook_optimizer(opt, key="")
        mgr.hook_optimizer(opt)
        mgr.hook_optimizer(other)
        with pytest.raises(ValueError, match="share the key 'optimizer'"):
            mgr.resume(optimizer="background")
    with fastpersist.CheckpointManager(root) as mgr:
        mgr.hook_optimizer(opt, key="optim")
        with pytest.raises(ValueError, match=r"no entry 'optim'.*'model', 'optimizer'"):
            mgr.resume(optimizer="background")
    with fastpersist.CheckpointManager(root) as mgr:
        mgr.hook_optimizer(opt)
        _, state = mgr.resume(optimizer="background")
        with pytest.raises(TypeError, match="still loading in the background"):
            opt.load_state_dict(state["optimizer"])
        assert "optimizer" in repr(state["optimizer"])
    # close() waited for the load and removed the hook: stepping now needs no state.
    assert state["optimizer"].done()
    opt.step()
