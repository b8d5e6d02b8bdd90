# SPDX-License-Identifier: Apache-2.0
"""fastpersist.hf.FastPersistTrainer with real transformers: a tiny GPT-2 from its config
trained a few steps on bytes of this repository's docs, in child processes. A resume is
bit-identical to an uninterrupted run; SIGKILL in the middle of a save leaves no checkpoint-N
folder and resume takes the previous one; save_total_limit rotates; a sealed folder that
changed is skipped; folders the stock Trainer wrote still resume; the weights load with
from_pretrained."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from fastpersist import _core  # noqa: E402
from fastpersist.errors import CheckpointCorruptError  # noqa: E402
from fastpersist.hf import last_sealed_checkpoint  # noqa: E402

from _test_support import assert_same_state  # noqa: E402

CHILD = Path(__file__).resolve().parent / "_hf_trainer_child.py"


def _run(mode: str, out: Path, steps: int = 8) -> dict:
    proc = subprocess.run([sys.executable, str(CHILD), mode, str(out), str(steps)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return torch.load(out / f"result-{mode}.pt", weights_only=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The stock Trainer, 8 steps straight."""
    return _run("stock", tmp_path_factory.mktemp("stock"))


def test_a_resume_is_bit_identical_and_checkpoints_are_sealed(tmp_path, reference):
    _run("fp", tmp_path, steps=4)
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("checkpoint")) == \
        ["checkpoint-2", "checkpoint-4"]
    for name in ("checkpoint-2", "checkpoint-4"):
        assert _core.check_sealed_folder(str(tmp_path / name), True) == ("sealed", "")
    resumed = _run("fp-resume", tmp_path, steps=8)
    assert resumed["step"] == 8
    assert_same_state(resumed["state"], reference["state"])
    # The weights are what from_pretrained loads.
    from transformers import GPT2LMHeadModel

    loaded = GPT2LMHeadModel.from_pretrained(tmp_path / "checkpoint-8")
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, resumed["state"][f"model.{k}"]), k


def test_sigkill_in_the_middle_of_a_save_leaves_the_previous_checkpoint(tmp_path, reference):
    child = subprocess.Popen([sys.executable, str(CHILD), "kill", str(tmp_path), "8"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert child.stdout is not None
        for line in child.stdout:  # the child stops inside the save of step 4
            if line.strip() == "saving":
                break
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    names = sorted(os.listdir(tmp_path))
    assert "checkpoint-2" in names and "checkpoint-4" not in names
    assert ".checkpoint-4.fp-staging" in names  # what the killed save left, hidden
    assert last_sealed_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")
    resumed = _run("fp-resume", tmp_path, steps=8)  # from checkpoint-2, on to step 8
    assert_same_state(resumed["state"], reference["state"])
    assert ".checkpoint-4.fp-staging" not in os.listdir(tmp_path)  # step 4's save redid it


def test_save_total_limit_rotates_after_the_commit(tmp_path):
    _run("rotate", tmp_path, steps=8)
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("checkpoint")) == \
        ["checkpoint-6", "checkpoint-8"]
    assert not any(n.startswith(".") for n in os.listdir(tmp_path))


def test_a_changed_checkpoint_is_skipped_and_stock_folders_still_resume(tmp_path, reference):
    _run("fp", tmp_path, steps=4)
    with open(tmp_path / "checkpoint-4" / "optimizer.pt", "r+b") as f:  # one byte flipped
        f.seek(1000)
        b = f.read(1)
        f.seek(1000)
        f.write(bytes([b[0] ^ 0xFF]))
    assert last_sealed_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")  # sizes only
    assert last_sealed_checkpoint(tmp_path, verify=True) == str(tmp_path / "checkpoint-2")
    state, problem = _core.check_sealed_folder(str(tmp_path / "checkpoint-4"), True)
    assert state == "damaged" and "optimizer.pt differs" in problem
    os.remove(tmp_path / "checkpoint-2" / "rng_state.pth")
    with pytest.raises(CheckpointCorruptError, match="checkpoint-2: rng_state.pth"):
        last_sealed_checkpoint(tmp_path, verify=True)
    # A run the stock Trainer wrote (no seals): FastPersistTrainer resumes it as the stock one.
    stock = tmp_path / "stock"
    _run("stock", stock, steps=4)
    assert last_sealed_checkpoint(stock) is None
    resumed = _run("fp-resume", stock, steps=8)
    assert_same_state(resumed["state"], reference["state"])


def test_the_trainer_benchmark_prints_its_table(tmp_path):
    bench = Path(__file__).resolve().parents[2] / "bench" / "hf_trainer_bench.py"
    out = subprocess.run([sys.executable, str(bench), "--model", "tiny-t5", "--folder",
                          str(tmp_path), "--rounds", "1"],
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in out.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| case")]
    assert rows == ["trainer", "trainer+fsync", "fastpersist"]
    assert not (tmp_path / "hf-trainer").exists()
