# SPDX-License-Identifier: Apache-2.0
"""CheckpointManager with torch.distributed initialized (real processes, gloo): saves of sharded
state committed once by rank 0, async saves overlapping training, retention, list / latest /
verify / resume agreeing across ranks, elastic restore on another world size (and in one
process, and through `fastpersist convert`), a rank that fails and a rank that is killed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fastpersist

import _dcp_workers as dcp_workers
import _manager_workers as workers
from _distributed import run_ranks
from _test_support import find_cli


def test_multi_rank_save_load_and_retention(tmp_path: Path) -> None:
    run_ranks(workers.save_load_retain, 2, str(tmp_path))
    with fastpersist.CheckpointManager(tmp_path) as mgr:
        assert mgr.list() == ["step-00000001", "step-00000002", "step-00000003"]
        assert mgr.verify("step-00000003") == []


def test_repeated_async_saves_of_a_state_modified_in_place(tmp_path: Path) -> None:
    run_ranks(workers.repeated_async_saves, 2, str(tmp_path))


@pytest.mark.parametrize("saved,resumed", [(4, 2), (2, 3)])
def test_resume_on_another_world_size(tmp_path: Path, saved: int, resumed: int) -> None:
    run_ranks(workers.save_load_retain, saved, str(tmp_path), timeout=400)
    run_ranks(workers.resume_elastic, resumed, str(tmp_path), "step-00000003", 3, timeout=300)
    # The newest checkpoint damaged: resume skips it, on every rank alike.
    newest = str(tmp_path / "step-00000003")
    manifest = fastpersist._core.CheckpointReader(newest, fastpersist._core.EngineOptions()).manifest
    block = next(t for t in manifest.tensors if t.name.startswith("model.w"))
    with open(os.path.join(newest, block.file), "r+b") as f:
        f.seek(block.offset)
        first = f.read(1)
        f.seek(block.offset)
        f.write(bytes([first[0] ^ 1]))
    run_ranks(workers.resume_elastic, resumed, str(tmp_path), "step-00000002", 2, timeout=300)


def test_one_process_loads_and_converts_a_multi_rank_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "root"
    run_ranks(workers.save_load_retain, 2, str(root))
    full = dcp_workers.full_state(3)
    with fastpersist.CheckpointManager(root) as mgr:
        state = mgr.load("step-00000003")  # no into=: whole tensors, every rank's blocks joined
        tag, resumed = mgr.resume()
    assert tag == "step-00000003"
    for loaded in (state, resumed):
        assert torch.equal(loaded["model"]["w"], full["model.w"])
        assert torch.equal(loaded["opt"]["m"], full["opt.m"])
        assert loaded["step"] == 11 and loaded["note"] == {"text": "hello", "lr": 0.5}
    # The inference user's way out: one safetensors file (as zero_to_fp32 is used).
    out = tmp_path / "model.safetensors"
    cli = find_cli()
    cmd = [cli, "convert"] if cli else [sys.executable, "-m", "fastpersist.convert"]
    r = subprocess.run(cmd + [str(root / "step-00000003"), str(out), "--prefix", "model."],
                       capture_output=True, text=True, check=False,
                       env={**os.environ, "FASTPERSIST_PYTHON": sys.executable})
    assert r.returncode == 0, r.stdout + r.stderr
    tensors = fastpersist.load_safetensors(out)
    assert sorted(tensors) == ["b", "w"]  # --prefix keeps the model's tensors, stripped
    assert torch.equal(tensors["w"], full["model.w"])
    assert torch.equal(tensors["b"], full["model.b"])


def test_a_failing_rank_fails_the_save_on_every_rank(tmp_path: Path) -> None:
    run_ranks(workers.failing_rank, 2, str(tmp_path))


def test_a_killed_rank_fails_the_save_without_a_hang(tmp_path: Path) -> None:
    root = tmp_path / "root"
    report = tmp_path / "report.json"
    failed = run_ranks(workers.killed_rank, 2, str(root), str(report), timeout=180, expect_failure=True)
    assert 1 in failed, failed
    seen = json.loads(report.read_text())
    assert "rank 1" in seen["message"] and "not saved" in seen["message"], seen
    assert set(seen["failures"]) == {"1"}, seen
    assert "step-00000002" not in seen["listing"]
    assert not [n for n in seen["listing"] if n.startswith(".tmp-")]
    # The previous checkpoint is intact and still the latest; the root is not left locked.
    with fastpersist.CheckpointManager(root) as mgr:
        assert mgr.latest() == "step-00000001"
        state = mgr.load()
    assert torch.equal(state["model"]["w"], dcp_workers.full_state(1)["model.w"])
    assert not os.path.exists(root / "step-00000002")


def test_per_rank_rng_state(tmp_path: Path) -> None:
    run_ranks(workers.per_rank_rng, 2, str(tmp_path), 2)
    run_ranks(workers.per_rank_rng, 3, str(tmp_path), 2)


def test_fsdp2_fully_shard_state_resumes_on_another_world_size(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed.fsdp")
    report = str(tmp_path / "expected.pt")
    run_ranks(workers.fsdp2_save, 2, str(tmp_path / "root"), report)
    run_ranks(workers.fsdp2_resume, 3, str(tmp_path / "root"), report)


def test_compressed_multi_rank_saves_resume_on_another_world_size(tmp_path: Path) -> None:
    """Every rank's ShardWriter compresses its blocks (compression="zstd"); a job of another
    size, and a single process, read them back bit-identical."""
    root = tmp_path / "root"
    run_ranks(workers.compressed_save, 2, str(root))
    run_ranks(workers.compressed_resume, 3, str(root), timeout=300)
    with fastpersist.CheckpointManager(root) as mgr:
        loaded = mgr.load()
    g = torch.Generator().manual_seed(21)  # the values _compressible_state shards
    w = (torch.randn(1200, 2048, generator=g) * 0.02).to(torch.bfloat16)
    assert torch.equal(loaded["model"]["w"].view(torch.int16), w.view(torch.int16))
    assert torch.equal(loaded["opt"]["steps"], torch.arange(600 * 512, dtype=torch.int64).reshape(600, 512))


def test_a_multi_rank_manager_drains_into_a_tier_and_resumes_from_it(tmp_path: Path) -> None:
    run_ranks(workers.tiered, 2, str(tmp_path / "root"), str(tmp_path / "tier"), timeout=300)
    tier = fastpersist.CheckpointManager(tmp_path / "tier")
    try:
        assert tier.list() == ["step-00000002", "step-00000003"]
        assert tier.verify("step-00000003") == []
    finally:
        tier.close()


def test_on_commit_runs_on_rank_zero_after_each_commit(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    run_ranks(workers.on_commit_hook, 2, str(tmp_path / "root"), str(report))
    seen = json.loads(report.read_text())
    assert [s[:2] for s in seen] == [["step-00000001", 1], ["step-00000002", 2],
                                     ["step-00000003", 3]]
    assert all(s[2] == str(tmp_path / "root" / s[0]) and s[3] > 0 for s in seen)
