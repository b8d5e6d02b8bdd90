# SPDX-License-Identifier: Apache-2.0
"""fastpersist.lightning.FastPersistCheckpointIO with real Lightning, training a real model on
the CPU: ModelCheckpoint rotation, a resume that is bit-identical to an uninterrupted run, async
saves that hold each step's state while training goes on, Fabric, SIGKILL in the middle of a
save, and bad input refused without touching the disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

L = pytest.importorskip("lightning")

from lightning.pytorch.callbacks import Callback, ModelCheckpoint  # noqa: E402
from lightning.pytorch.plugins.io import TorchCheckpointIO  # noqa: E402

from fastpersist.lightning import FastPersistCheckpointIO  # noqa: E402

from _lightning_models import TinyNet, loader, trainer, weights_and_moments  # noqa: E402
from _test_support import assert_same_state  # noqa: E402
from test_async_files import hold_snapshots_until_a_step_begins  # noqa: E402

HERE = Path(__file__).resolve().parent


def _fit(tmp: Path, max_steps: int, io, ckpt_path=None, **checkpoint_kwargs):
    torch.manual_seed(0)
    model = TinyNet()
    cb = ModelCheckpoint(dirpath=tmp, **checkpoint_kwargs)
    t = trainer(max_steps, callbacks=[cb], plugins=[io])
    t.fit(model, loader(), ckpt_path=ckpt_path)
    return t, model, cb


def test_model_checkpoint_rotation_keeps_the_top_k(tmp_path):
    t, _, cb = _fit(tmp_path, 8, FastPersistCheckpointIO(), every_n_train_steps=2,
                    save_top_k=2, monitor="step", mode="max", filename="{step}")
    assert sorted(os.listdir(tmp_path)) == ["step=6.ckpt", "step=8.ckpt"]
    for step in (6, 8):
        ckpt = torch.load(tmp_path / f"step={step}.ckpt", weights_only=False)
        assert ckpt["global_step"] == step
        assert "pytorch-lightning_version" in ckpt
    assert Path(cb.best_model_path).name == "step=8.ckpt"


@pytest.mark.parametrize("async_save", [False, True])
def test_resume_from_last_is_bit_identical_to_an_uninterrupted_run(tmp_path, async_save):
    # The reference: 8 steps in one go, saved by Lightning's own TorchCheckpointIO.
    t_ref, model_ref, _ = _fit(tmp_path / "ref", 8, TorchCheckpointIO(), save_last=True)
    want = weights_and_moments(model_ref, t_ref.optimizers[0])
    # 4 steps, saved by fastpersist; then a new process-like start resumes from "last".
    io = FastPersistCheckpointIO(async_save=async_save)
    _fit(tmp_path / "fp", 4, io, save_last=True, every_n_train_steps=2)
    t, model, cb = _fit(tmp_path / "fp", 8, FastPersistCheckpointIO(async_save=async_save),
                        ckpt_path="last", save_last=True, every_n_train_steps=2)
    assert t.global_step == 8
    assert_same_state(weights_and_moments(model, t.optimizers[0]), want)
    # The callbacks' state came back too: the checkpoint callback knows its last file.
    assert Path(cb.last_model_path).name == "last.ckpt"
    last = torch.load(tmp_path / "fp" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 8
    assert any("ModelCheckpoint" in k for k in last["callbacks"])


class _RecordEveryStep(Callback):
    """The module's state at the end of each step, as ModelCheckpoint then saves it."""

    def __init__(self) -> None:
        self.states = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.states[trainer.global_step] = {k: v.clone()
                                            for k, v in pl_module.state_dict().items()}


class _LetSnapshotsGo(Callback):
    def __init__(self, held) -> None:
        self.held = held

    def on_train_end(self, trainer, pl_module) -> None:
        self.held.remove()  # no step follows the last save


def test_async_saves_hold_each_steps_state_while_training_goes_on(tmp_path, monkeypatch):
    record = _RecordEveryStep()
    # Fault injection: each snapshot starts only once the next optimizer step waits for it or
    # has finished, so a step that did not wait would change the weights before the copy.
    held = hold_snapshots_until_a_step_begins(monkeypatch)
    io = FastPersistCheckpointIO(async_save=True, max_pending=2)
    torch.manual_seed(0)
    model = TinyNet(width=2048, inputs=256)  # 2 MiB weights: lent, snapshotted in the background
    cb = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1,
                         filename="{step}")
    t = trainer(6, callbacks=[record, _LetSnapshotsGo(held), cb], plugins=[io])
    try:
        t.fit(model, loader(inputs=256))  # the strategy's teardown waits for the saves
    finally:
        held.remove()
    assert io._saver is None
    for step in range(1, 7):
        saved = torch.load(tmp_path / f"step={step}.ckpt", weights_only=False)
        assert saved["global_step"] == step
        for k, v in record.states[step].items():
            assert torch.equal(saved["state_dict"][k], v), (step, k)


def test_storage_options_apply_to_one_save(tmp_path):
    torch.manual_seed(0)
    model = TinyNet()
    io = FastPersistCheckpointIO()
    t = trainer(2, plugins=[io], default_root_dir=tmp_path)
    t.fit(model, loader())
    t.save_checkpoint(tmp_path / "a.ckpt", storage_options={"async_save": True, "durable": False,
                                                            "io_buffer_mb": 1})
    assert io._saver is not None
    loaded = io.load_checkpoint(tmp_path / "a.ckpt")  # waits for the async save first
    assert loaded["global_step"] == 2
    for k, v in model.state_dict().items():
        assert torch.equal(loaded["state_dict"][k], v)
    io.teardown()
    with pytest.raises(TypeError, match="unknown option.*'compresion'"):
        t.save_checkpoint(tmp_path / "b.ckpt", storage_options={"compresion": "zstd"})
    with pytest.raises(TypeError, match="storage_options must be a dict"):
        t.save_checkpoint(tmp_path / "b.ckpt", storage_options=["durable"])
    assert not (tmp_path / "b.ckpt").exists()


def test_fabric_saves_and_loads_through_the_plugin(tmp_path):
    fabric = L.Fabric(accelerator="cpu", devices=1, plugins=[FastPersistCheckpointIO()])
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = fabric.setup(model, optimizer)
    model(torch.randn(4, 256)).sum().backward()
    optimizer.step()
    fabric.save(tmp_path / "f.ckpt", {"model": model, "optimizer": optimizer, "step": 1})
    torch.manual_seed(1)
    model2 = torch.nn.Linear(256, 256)
    optimizer2 = torch.optim.AdamW(model2.parameters())
    model2, optimizer2 = fabric.setup(model2, optimizer2)
    state = {"model": model2, "optimizer": optimizer2}
    rest = fabric.load(tmp_path / "f.ckpt", state)
    assert rest == {"step": 1}
    assert torch.equal(model2.weight, model.weight)
    assert torch.equal(optimizer2.state_dict()["state"][0]["exp_avg"],
                       optimizer.state_dict()["state"][0]["exp_avg"])


def test_bad_input_is_refused_and_changes_nothing(tmp_path):
    with pytest.raises(TypeError, match="unknown option.*'asnyc_save'"):
        FastPersistCheckpointIO(asnyc_save=True)
    with pytest.raises(ValueError, match="io_buffer_mb"):
        FastPersistCheckpointIO(io_buffer_mb=0)
    with pytest.raises(ValueError, match="max_pending"):
        FastPersistCheckpointIO(async_save=True, max_pending=0)
    io = FastPersistCheckpointIO()
    state = {"state_dict": {"w": torch.ones(3)}}
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        io.save_checkpoint(state, tmp_path / "folder")
    with pytest.raises(NotADirectoryError, match="is a file"):
        io.save_checkpoint(state, tmp_path / "file" / "a.ckpt")
    with pytest.raises(ValueError, match="not URLs"):
        io.save_checkpoint(state, "s3://bucket/a.ckpt")
    with pytest.raises(FileNotFoundError, match="Checkpoint file not found"):
        io.load_checkpoint(tmp_path / "missing.ckpt")
    with pytest.raises(IsADirectoryError, match="another framework"):
        io.load_checkpoint(tmp_path / "folder")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    safetensors_torch.save_file({"w": torch.ones(3)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(Exception, match="not a torch checkpoint"):
        io.load_checkpoint(tmp_path / "model.safetensors")
    assert sorted(os.listdir(tmp_path)) == ["file", "folder", "model.safetensors"]
    assert os.listdir(tmp_path / "folder") == []
    # Loads stay safe by default: a pickled class outside torch's allow-list is refused.
    io.save_checkpoint({"obj": _Custom()}, tmp_path / "custom.ckpt")
    with pytest.raises(Exception, match="weights_only"):
        io.load_checkpoint(tmp_path / "custom.ckpt")
    assert isinstance(io.load_checkpoint(tmp_path / "custom.ckpt", weights_only=False)["obj"],
                      _Custom)


class _Custom:
    pass


def test_remove_checkpoint_waits_for_its_save_and_removes_it(tmp_path):
    io = FastPersistCheckpointIO(async_save=True)
    io.save_checkpoint({"w": torch.randn(1 << 20)}, tmp_path / "a.ckpt")
    io.remove_checkpoint(tmp_path / "a.ckpt")  # never races the write that creates it
    assert os.listdir(tmp_path) == []
    io.remove_checkpoint(tmp_path / "a.ckpt")  # gone already: nothing to do
    io.teardown()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigkill_in_the_middle_of_a_save_leaves_the_previous_ckpt_whole(tmp_path, mode):
    child = subprocess.Popen([sys.executable, str(HERE / "_lightning_models.py"), str(tmp_path),
                              mode], stdout=subprocess.PIPE, text=True, cwd=HERE)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # the first save is whole
        assert line.startswith("saved "), line
        # Kill it while a later save's temporary file exists: in the middle of writing.
        while not any(".fp-tmp-" in n for n in os.listdir(tmp_path)):
            assert child.poll() is None, "the child stopped saving"
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    ckpt = torch.load(tmp_path / "last.ckpt", weights_only=False)  # whole, and one of the saves
    n = ckpt["state_dict"]["net.0.weight"][0, 0].item()
    assert n >= 1
    for name, value in ckpt["state_dict"].items():
        if "running" not in name and "num_batches" not in name:
            assert torch.all(value == n), name
    # What the killed save left is a stale temporary, which clean_stale_temp_files removes.
    import fastpersist

    fastpersist.clean_stale_temp_files(tmp_path)
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith("ckpt")) == ["last.ckpt"]
    assert not any(".fp-tmp-" in n for n in os.listdir(tmp_path))


def test_the_example_trains_and_resumes(tmp_path):
    example = HERE.parents[1] / "examples" / "python" / "lightning_train.py"
    out = subprocess.run([sys.executable, str(example), str(tmp_path)], capture_output=True,
                         text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "resumed at step 32 and trained to step 48" in out.stdout
    assert sorted(os.listdir(tmp_path)) == ["epoch=4-step=40.ckpt", "epoch=5-step=48.ckpt",
                                            "last.ckpt"]


def test_the_integrations_benchmark_prints_its_table(tmp_path):
    bench = HERE.parents[1] / "bench" / "integrations_bench.py"
    out = subprocess.run([sys.executable, str(bench), "--folder", str(tmp_path), "--rounds", "1",
                          "--width", "256", "--layers", "1", "--steps", "2",
                          "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in out.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| case")]
    assert rows == ["lightning", "lightning-async", "fastpersist", "fastpersist-async"]
    import json

    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert results["fastpersist-async"][0]["save_s"] > 0
    assert not (tmp_path / "integrations").exists()  # the benchmark cleans up
