# SPDX-License-Identifier: Apache-2.0
"""tests/data/checkpoint-v1/: a real checkpoint root written by fastpersist 0.1.0 (manifest
format 1; see tests/data/make_checkpoint_v1.py). Every later fastpersist must keep loading and
verifying it value for value, through Python and the CLI.

The expected values are recomputed here from the generator's formulas, independently of it.
Tests only read the fixture in place; anything that writes (a CheckpointManager takes the root's
lock) works on a copy in a temporary directory, and a test checks that the fixture's bytes are
left exactly as committed.
"""
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import fastpersist
from _test_support import ROOT, find_cli

FIXTURE = ROOT / "tests" / "data" / "checkpoint-v1"
TAGS = ["step-00000010", "step-00000020"]
CLI = find_cli()
needs_cli = pytest.mark.skipif(CLI is None, reason="fastpersist CLI not built: set FASTPERSIST_CLI")


def expected_model(step: int) -> dict:
    embed = torch.arange(48, dtype=torch.float32).reshape(12, 4) / 8 + step
    return {
        "embed.weight": embed,
        "lm_head.weight": embed,
        "layer0.weight": (torch.arange(24, dtype=torch.float32).reshape(4, 6) / 4 - 3 + step)
        .to(torch.bfloat16),
        "layer0.bias": (torch.arange(6, dtype=torch.float32) / 2 - step).to(torch.float16),
        "position_ids": torch.arange(10, dtype=torch.int64) * step - 7,
        "mask": torch.arange(8) % 3 == 0,
        "token_bytes": (torch.arange(16) * 7 + step).to(torch.uint8),
        "scale": torch.tensor(2.5 * step, dtype=torch.float64),
        "empty": torch.zeros(0, 3, dtype=torch.float32),
    }


def expected_objects(step: int) -> dict:
    return {
        "step": step,
        "history": [1, 2, step],
        "name": "fixture-v1",
        "config": {"lr": 0.5, "betas": [0.9, 0.95], "schedule": {"kind": "cosine", "warmup": 3}},
    }


def assert_state(state: dict, step: int) -> None:
    model = state["model"]
    want = expected_model(step)
    assert sorted(model) == sorted(want)
    for name, tensor in want.items():
        got = model[name]
        assert got.dtype == tensor.dtype, name
        assert got.shape == tensor.shape, name
        assert torch.equal(got, tensor), name
    # Tied weights come back tied: one tensor under both names.
    assert model["lm_head.weight"].data_ptr() == model["embed.weight"].data_ptr()
    assert {k: v for k, v in state.items() if k != "model"} == expected_objects(step)


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def copy_of_fixture(tmp_path):
    root = tmp_path / "checkpoint-v1"
    shutil.copytree(FIXTURE, root)
    return root


def test_fixture_is_committed_small_and_complete():
    files = snapshot(FIXTURE)
    assert "latest" in files
    for tag in TAGS:
        assert f"{tag}/manifest.json" in files and f"{tag}/objects.pkl" in files
        manifest = json.loads((FIXTURE / tag / "manifest.json").read_text())
        assert manifest["format_version"] == 1
        assert "world_size" not in manifest and "encoding" not in manifest["tensors"][0]
    assert sum(p.stat().st_size for p in FIXTURE.rglob("*") if p.is_file()) < 200 * 1024
    if shutil.which("git") and (ROOT / ".git").exists():
        ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index",
                                  *[str(FIXTURE / name) for name in files]],
                                 capture_output=True, text=True, check=False)
        assert ignored.returncode == 1, f"ignored by .gitignore: {ignored.stdout}{ignored.stderr}"


@pytest.mark.parametrize("step", [10, 20])
def test_load_checkpoint_reads_every_value(step):
    before = snapshot(FIXTURE)
    assert_state(fastpersist.load_checkpoint(FIXTURE / f"step-{step:08d}"), step)
    assert snapshot(FIXTURE) == before


def test_manager_lists_loads_verifies_and_resumes(copy_of_fixture):
    with fastpersist.CheckpointManager(copy_of_fixture) as mgr:
        assert mgr.list() == TAGS
        assert mgr.latest() == "step-00000020"
        infos = mgr.checkpoints()
        assert [i.step for i in infos] == [10, 20]
        assert all(i.num_tensors == 8 for i in infos)
        for tag, step in zip(TAGS, (10, 20)):
            assert mgr.verify(tag) == []
            assert_state(mgr.load(tag), step)
        tag, state = mgr.resume()
        assert tag == "step-00000020"
        assert_state(state, 20)


def test_manager_loads_in_place_a_subset_and_converted(copy_of_fixture):
    with fastpersist.CheckpointManager(copy_of_fixture) as mgr:
        into = {"model": {k: torch.zeros_like(v) for k, v in expected_model(0).items()}}
        state = mgr.load(10, into=into)
        assert state["model"]["position_ids"] is into["model"]["position_ids"]
        assert torch.equal(into["model"]["position_ids"], expected_model(10)["position_ids"])
        assert torch.equal(into["model"]["layer0.weight"], expected_model(10)["layer0.weight"])
        part = mgr.load(20, keys=["model.layer0.bias"], dtype=torch.float32)
        assert sorted(part["model"]) == ["layer0.bias"]
        assert part["model"]["layer0.bias"].dtype == torch.float32
        assert torch.equal(part["model"]["layer0.bias"],
                           expected_model(20)["layer0.bias"].to(torch.float32))


def test_a_new_save_next_to_v1_checkpoints_is_format_2(copy_of_fixture):
    with fastpersist.CheckpointManager(copy_of_fixture) as mgr:
        mgr.save(30, {"w": torch.arange(4.0)})
        assert mgr.list() == TAGS + ["step-00000030"]
        assert mgr.latest() == "step-00000030"
        manifest = json.loads((copy_of_fixture / "step-00000030" / "manifest.json").read_text())
        assert manifest["format_version"] == 2 and manifest["world_size"] == 1
        assert manifest["tensors"][0]["encoding"] == "raw"
        assert mgr.verify("step-00000020") == [] and mgr.verify("step-00000030") == []
        # The commit sequence continues above the v1 checkpoints' own.
        sequences = {i.tag: i.sequence for i in mgr.checkpoints()}
        assert sequences["step-00000030"] > max(sequences[t] for t in TAGS)


def run_cli(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPERSIST_")}
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=120,
                          env=env)


@needs_cli
def test_cli_verifies_lists_and_inspects_the_fixture_in_place():
    before = snapshot(FIXTURE)
    proc = run_cli("verify", FIXTURE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for tag in TAGS:
        assert f"OK       {tag}" in proc.stdout
    listed = json.loads(run_cli("list", FIXTURE, "--json").stdout)
    assert [c["tag"] for c in listed["checkpoints"]] == TAGS
    proc = run_cli("inspect", FIXTURE / TAGS[1], "--json", "--tensors")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["format_version"] == 1 and info["world_size"] == 1
    assert info["metadata"] == {"run": "fixture-v1", "step": 20, "tags": ["a", "b"]}
    assert info["problems"] == []
    assert info["num_tensors"] == 8
    assert {t["encoding"] for t in info["tensors"]} == {"raw"}
    assert all(t["stored_bytes"] == t["bytes"] for t in info["tensors"])
    assert snapshot(FIXTURE) == before
