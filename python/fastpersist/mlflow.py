# SPDX-License-Identifier: Apache-2.0
"""MLflow: record committed fastpersist checkpoints in a run.

``log_checkpoint(manager_or_path, tag=None)`` records one committed checkpoint in the active
run (or ``run_id``): where it is, its step, its size, the hash of its tensors' values and its
manifest. Large checkpoints are referenced, not copied; ``copy=True`` also uploads the files as
artifacts. ``on_commit()`` makes a ``CheckpointManager`` do it after every commit::

    with mlflow.start_run():
        mgr = fastpersist.CheckpointManager("/ckpt/run1", on_commit=fastpersist.mlflow.on_commit())
        mgr.save(step, state)            # recorded in the run once committed

What a run holds per checkpoint (``<tag>`` is the checkpoint's tag):

- artifact ``fastpersist/checkpoints/<tag>.json``: the record below, and
  ``fastpersist/checkpoints/<tag>/manifest.json``: the checkpoint's own manifest;
- tags ``fastpersist.checkpoint`` (the URI of the newest recorded checkpoint),
  ``fastpersist.checkpoint.tag``, ``fastpersist.checkpoint.step`` and
  ``fastpersist.checkpoint.content_hash``;
- metric ``fastpersist.checkpoint_bytes`` at the checkpoint's step;
- with ``copy=True``, the files under ``fastpersist/checkpoints/<tag>/files``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, Optional, Union

import mlflow  # type: ignore[import-not-found, import-untyped, unused-ignore]

from . import _core

ARTIFACT_DIR = "fastpersist/checkpoints"


def log_checkpoint(manager_or_path: Any, tag: Optional[Union[int, str]] = None, *,
                   copy: bool = False, run_id: Optional[str] = None) -> Dict[str, Any]:
    """Records a committed checkpoint in an MLflow run and returns the record it logged.

    Args:
        manager_or_path: a :class:`fastpersist.CheckpointManager`, a checkpoint root, or a
            checkpoint directory.
        tag: the checkpoint (a tag or a step) of a manager or root [its newest].
        copy: also upload the checkpoint's files as artifacts [False: referenced only].
        run_id: the run [the active one].

    Raises ``FileNotFoundError`` when there is no such committed checkpoint (an incomplete one,
    another framework's folder), ``ValueError`` without a run; nothing is logged then.
    """
    directory = _checkpoint_dir(manager_or_path, tag)
    reader = _core.CheckpointReader(directory, _core.EngineOptions())
    manifest = reader.manifest
    record = _record(directory, manifest)
    client = mlflow.tracking.MlflowClient()
    run = _run_id(run_id)
    with tempfile.TemporaryDirectory(prefix="fastpersist-mlflow-") as tmp:
        base = os.path.join(tmp, manifest.tag)
        os.makedirs(base)
        with open(base + ".json", "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
        shutil.copyfile(os.path.join(directory, "manifest.json"),
                        os.path.join(base, "manifest.json"))
        client.log_artifact(run, base + ".json", ARTIFACT_DIR)
        client.log_artifact(run, os.path.join(base, "manifest.json"),
                            f"{ARTIFACT_DIR}/{manifest.tag}")
    if copy:
        client.log_artifacts(run, directory, f"{ARTIFACT_DIR}/{manifest.tag}/files")
    client.set_tag(run, "fastpersist.checkpoint", record["uri"])
    client.set_tag(run, "fastpersist.checkpoint.tag", manifest.tag)
    client.set_tag(run, "fastpersist.checkpoint.step", str(record["step"]))
    client.set_tag(run, "fastpersist.checkpoint.content_hash", record["content_hash"])
    client.log_metric(run, "fastpersist.checkpoint_bytes", float(record["total_bytes"]),
                      step=record["step"] if record["step"] is not None else 0)
    return record


def on_commit(*, copy: bool = False, run_id: Optional[str] = None) -> Callable[[Any], None]:
    """A ``CheckpointManager(on_commit=...)`` callback that logs each committed checkpoint to
    `run_id`, or to the run active when this is called (the callback runs on the manager's own
    thread, where MLflow's active run is not visible)."""
    run = _run_id(run_id)

    def log(committed: Any) -> None:
        log_checkpoint(committed.path, copy=copy, run_id=run)

    return log


def _run_id(run_id: Optional[str]) -> str:
    if run_id is not None:
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(f"fastpersist: run_id must be an MLflow run id, got {run_id!r}")
        mlflow.tracking.MlflowClient().get_run(run_id)  # raises for an unknown run
        return run_id
    active = mlflow.active_run()
    if active is None:
        raise ValueError("fastpersist: no active MLflow run; start one (mlflow.start_run()) or "
                         "pass run_id")
    return str(active.info.run_id)


def _checkpoint_dir(manager_or_path: Any, tag: Optional[Union[int, str]]) -> str:
    """The committed checkpoint directory that `manager_or_path` and `tag` name."""
    from .checkpoint import tag_for

    if isinstance(manager_or_path, (str, bytes, os.PathLike)):
        path = os.path.abspath(os.fsdecode(os.fspath(manager_or_path)))
    elif isinstance(getattr(manager_or_path, "root", None), str):  # a CheckpointManager
        path = os.path.abspath(manager_or_path.root)
    else:
        raise TypeError(f"fastpersist: log_checkpoint takes a CheckpointManager or a path, not "
                        f"{type(manager_or_path).__name__}")
    info = _core.classify_path(path)
    kind = info.kind.name
    if kind == "CHECKPOINT" and info.path == path:
        if tag is not None and tag_for(tag) != os.path.basename(path):
            raise ValueError(f"fastpersist: {path} is checkpoint "
                             f"{os.path.basename(path)!r}, not {tag_for(tag)!r}")
        return path
    if kind == "ROOT":
        name = tag_for(tag) if tag is not None else _core.latest_checkpoint(path)
        if name is not None and _core.classify_path(os.path.join(path, name)).kind.name == \
                "CHECKPOINT":
            return os.path.join(path, name)
        raise FileNotFoundError(f"fastpersist: no committed checkpoint "
                                f"{'(none yet)' if name is None else repr(name)} in {path}")
    raise FileNotFoundError(f"fastpersist: {path} is not a fastpersist checkpoint or root "
                            f"({info.description})")


def _record(directory: str, manifest: Any) -> Dict[str, Any]:
    info = next((c for c in _core.list_checkpoints(os.path.dirname(directory)).committed
                 if c.tag == manifest.tag), None)
    total = sum(int(f.size) for f in manifest.files)
    return {
        "uri": "file://" + directory,
        "root": os.path.dirname(directory),
        "tag": manifest.tag,
        "step": manifest.step,
        "created_unix": manifest.created_unix,
        "total_bytes": int(info.total_bytes) if info is not None else total,
        "tensor_bytes": int(manifest.tensor_bytes),
        "num_tensors": len(manifest.tensors),
        "world_size": int(manifest.world_size),
        "content_hash": manifest.content_hash,
        "fingerprint": manifest.fingerprint,
        "checksum_algorithm": manifest.checksum_algorithm,
        "versions": dict(manifest.versions),
        "metadata": json.loads(manifest.metadata_json),
    }
