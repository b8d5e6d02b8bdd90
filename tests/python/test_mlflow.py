# SPDX-License-Identifier: Apache-2.0
"""fastpersist.mlflow against a real MLflow tracking store (sqlite, local artifacts): a small
model trained for a few steps, each committed checkpoint recorded in the run through
CheckpointManager(on_commit=...), read back through MLflow's client, and pointing at a
checkpoint that verifies; copies on request; bad input refused with nothing logged."""

from __future__ import annotations

import json

import pytest
import torch

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("sqlalchemy")

import fastpersist  # noqa: E402
import fastpersist.mlflow as fp_mlflow  # noqa: E402
from fastpersist import _core  # noqa: E402


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = mlflow.create_experiment("fp", artifact_location=str(tmp_path / "artifacts"))
    try:
        yield experiment
    finally:
        if mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(previous)


def _train(model, optimizer, steps: int) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=g)
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def _artifact(run_id: str, path: str):
    return json.loads(open(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path)).read())


def test_each_commit_is_recorded_in_the_run(tmp_path, tracking):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters())
    root = tmp_path / "ckpts"
    with mlflow.start_run(experiment_id=tracking) as run:
        with fastpersist.CheckpointManager(root, on_commit=fp_mlflow.on_commit()) as mgr:
            for step in (2, 4):
                _train(model, optimizer, 2)
                mgr.save(step, {"model": model.state_dict(), "optim": optimizer.state_dict()})
    client = mlflow.tracking.MlflowClient()
    data = client.get_run(run.info.run_id).data
    newest = root / "step-00000004"
    assert data.tags["fastpersist.checkpoint"] == f"file://{newest}"
    assert data.tags["fastpersist.checkpoint.step"] == "4"
    history = client.get_metric_history(run.info.run_id, "fastpersist.checkpoint_bytes")
    assert sorted(m.step for m in history) == [2, 4]
    for step in (2, 4):
        tag = f"step-{step:08d}"
        record = _artifact(run.info.run_id, f"fastpersist/checkpoints/{tag}.json")
        manifest = _core.CheckpointReader(str(root / tag), _core.EngineOptions()).manifest
        assert record["uri"] == f"file://{root / tag}" and record["step"] == step
        assert record["content_hash"] == manifest.content_hash and len(record["content_hash"]) == 16
        assert record["total_bytes"] > record["tensor_bytes"] > 0
        stored = _artifact(run.info.run_id, f"fastpersist/checkpoints/{tag}/manifest.json")
        assert stored["tag"] == tag
        # The record points at a checkpoint that verifies.
        with fastpersist.CheckpointManager(root) as check:
            assert check.verify(tag) == []
    # Large checkpoints are referenced, not copied.
    listed = [f.path for f in client.list_artifacts(run.info.run_id, "fastpersist/checkpoints/step-00000004")]
    assert listed == ["fastpersist/checkpoints/step-00000004/manifest.json"]
    # The two checkpoints hold different values: different hashes.
    hashes = {_artifact(run.info.run_id, f"fastpersist/checkpoints/step-0000000{s}.json")["content_hash"]
              for s in (2, 4)}
    assert len(hashes) == 2


def test_copy_uploads_the_files_and_the_copy_loads(tmp_path, tracking):
    state = {"w": torch.arange(1000.0), "step": 7}
    with fastpersist.CheckpointManager(tmp_path / "a") as mgr:
        mgr.save(7, state)
    run = mlflow.tracking.MlflowClient().create_run(tracking)
    record = fp_mlflow.log_checkpoint(tmp_path / "a", copy=True, run_id=run.info.run_id)  # newest
    assert record["tag"] == "step-00000007"
    copied = mlflow.artifacts.download_artifacts(
        run_id=run.info.run_id, artifact_path="fastpersist/checkpoints/step-00000007/files",
        dst_path=str(tmp_path / "download"))
    loaded = fastpersist.load_checkpoint(copied)
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 7
    # The same values saved elsewhere have the same content hash.
    with fastpersist.CheckpointManager(tmp_path / "b", compression="zstd") as mgr:
        mgr.save(7, state)
    again = fp_mlflow.log_checkpoint(str(tmp_path / "b" / "step-00000007"), run_id=run.info.run_id)
    assert again["content_hash"] == record["content_hash"]
    assert fp_mlflow.log_checkpoint(mgr, 7, run_id=run.info.run_id)["root"] == str(tmp_path / "b")
    with pytest.raises(TypeError, match="CheckpointManager or a path"):
        fp_mlflow.log_checkpoint(42, run_id=run.info.run_id)


def test_bad_input_is_refused_and_nothing_is_logged(tmp_path, tracking):
    with fastpersist.CheckpointManager(tmp_path / "ckpts") as mgr:
        mgr.save(1, {"w": torch.ones(3)})
    with pytest.raises(ValueError, match="no active MLflow run"):
        fp_mlflow.log_checkpoint(tmp_path / "ckpts")
    with pytest.raises(ValueError, match="no active MLflow run"):
        fp_mlflow.on_commit()
    run = mlflow.tracking.MlflowClient().create_run(tracking)
    rid = run.info.run_id
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "pytorch_model.bin").write_bytes(b"x")
    torch.save({"w": torch.ones(2)}, tmp_path / "file.pt")
    with pytest.raises(FileNotFoundError, match="no committed checkpoint 'step-00000009'"):
        fp_mlflow.log_checkpoint(tmp_path / "ckpts", 9, run_id=rid)
    with pytest.raises(FileNotFoundError, match="not a fastpersist checkpoint"):
        fp_mlflow.log_checkpoint(tmp_path / "file.pt", run_id=rid)
    with pytest.raises(FileNotFoundError, match="no committed checkpoint"):
        fp_mlflow.log_checkpoint(tmp_path / "other", run_id=rid)  # a folder of something else
    with pytest.raises(ValueError, match="not 'step-00000002'"):
        fp_mlflow.log_checkpoint(tmp_path / "ckpts" / "step-00000001", 2, run_id=rid)
    with pytest.raises(Exception):
        fp_mlflow.log_checkpoint(tmp_path / "ckpts", run_id="0123456789abcdef")  # no such run
    client = mlflow.tracking.MlflowClient()
    assert client.list_artifacts(rid) == []
    assert not any(k.startswith("fastpersist") for k in client.get_run(rid).data.tags)
