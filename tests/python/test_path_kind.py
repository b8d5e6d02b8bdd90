# SPDX-License-Identifier: Apache-2.0
"""The one path classifier (src/checkpoint/path_kind.h, bound as ``_core.classify_path``): every
kind of path, and the same answer from Python, from ``fastpersist inspect`` and from
``fastpersist convert``, including a directory with data files but no manifest.json (an
incomplete or foreign checkpoint directory, never a root)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Dict

import pytest
import torch

import fastpersist
from fastpersist import _core
from fastpersist.convert import ConvertError, convert

from _test_support import find_cli

CLI = find_cli()
Kind = _core.PathKind


@pytest.fixture
def paths(tmp_path: Path) -> Dict[str, Path]:
    root = tmp_path / "root"
    with fastpersist.CheckpointManager(root) as mgr:
        mgr.save(1, {"w": torch.arange(8.0), "step": 1})
        mgr.save(2, {"w": torch.arange(8.0), "step": 2})
    incomplete = root / "step-00000002"
    (incomplete / "manifest.json").unlink()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "tensors-00000-of-00001.safetensors").write_bytes(b"\0" * 16)
    empty = tmp_path / "empty"
    empty.mkdir()
    st = tmp_path / "model.safetensors"
    fastpersist.save_safetensors({"w": torch.ones(4)}, st)
    st_unnamed = tmp_path / "weights.data"
    st_unnamed.write_bytes(st.read_bytes())
    pt = tmp_path / "model.pt"
    torch.save({"w": torch.ones(4)}, pt)
    zipped = tmp_path / "model.zip-data"
    zipped.write_bytes(pt.read_bytes())
    legacy = tmp_path / "legacy.weights"
    torch.save({"w": torch.ones(4)}, legacy, _use_new_zipfile_serialization=False)
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {"checkpoint": root / "step-00000001",
            "manifest": root / "step-00000001" / "manifest.json", "incomplete": incomplete,
            "foreign": foreign, "root": root, "empty": empty, "safetensors": st,
            "safetensors_unnamed": st_unnamed, "torch": pt, "torch_zip": zipped,
            "torch_legacy": legacy, "text": text, "fifo": fifo, "missing": tmp_path / "nope"}


EXPECTED = {"checkpoint": Kind.CHECKPOINT, "manifest": Kind.CHECKPOINT,
            "incomplete": Kind.INCOMPLETE_CHECKPOINT, "foreign": Kind.INCOMPLETE_CHECKPOINT,
            "root": Kind.ROOT, "empty": Kind.ROOT, "safetensors": Kind.SAFETENSORS,
            "safetensors_unnamed": Kind.SAFETENSORS, "torch": Kind.TORCH_FILE,
            "torch_zip": Kind.TORCH_FILE, "torch_legacy": Kind.TORCH_FILE,
            "text": Kind.OTHER_FILE, "fifo": Kind.OTHER_FILE, "missing": Kind.MISSING}


def test_every_kind(paths):
    got = {name: _core.classify_path(str(p)).kind for name, p in paths.items()}
    assert got == EXPECTED
    manifest = _core.classify_path(str(paths["manifest"]))
    assert manifest.path == str(paths["checkpoint"])  # a manifest names its directory
    missing = _core.classify_path(str(paths["missing"]))
    assert missing.error == f"{paths['missing']} does not exist" and missing.name == "missing"
    incomplete = _core.classify_path(str(paths["incomplete"]))
    assert incomplete.name == "incomplete_checkpoint"
    assert incomplete.description.startswith("an incomplete or foreign checkpoint directory")
    assert "no manifest.json" in incomplete.description


@pytest.mark.skipif(CLI is None, reason="fastpersist CLI not built: set FASTPERSIST_CLI or build "
                                        "build/tools/fastpersist")
def test_the_cli_gives_the_same_answer(paths):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPERSIST_")}
    for name, path in paths.items():
        info = _core.classify_path(str(path))
        proc = subprocess.run([CLI, "inspect", "--json", str(path)], capture_output=True,
                              text=True, timeout=120, env=env)
        if info.kind in (Kind.CHECKPOINT, Kind.SAFETENSORS, Kind.ROOT):
            assert proc.returncode == 0, (name, proc.stderr)
            assert json.loads(proc.stdout)["kind"] == info.name, name
        else:
            assert proc.returncode != 0, name
            said = info.error if info.kind == Kind.MISSING else f"{path} is {info.description}"
            assert said in proc.stderr, (name, proc.stderr)


def test_convert_refuses_an_incomplete_checkpoint_directory(paths, tmp_path):
    for name in ("incomplete", "foreign"):
        with pytest.raises(ConvertError) as info:
            convert(str(paths[name]), str(tmp_path / f"{name}.safetensors"))
        assert info.value.exit_code == 1
        assert str(info.value).startswith(
            f"SRC {paths[name]} is an incomplete or foreign checkpoint directory"), str(info.value)
    # As the CLI says it: the same description.
    assert _core.classify_path(str(paths["foreign"])).description in str(info.value)


def test_convert_uses_the_classifier_for_every_source(paths, tmp_path):
    # A checkpoint given by its manifest, a safetensors file without the suffix, a legacy torch
    # file without a torch suffix: each converted as what the classifier says it is.
    for name in ("manifest", "safetensors_unnamed", "torch_legacy", "root"):
        out = tmp_path / f"from_{name}.safetensors"
        lines = convert(str(paths[name]), str(out), drop_non_tensors=True)
        assert torch.equal(fastpersist.load_safetensors(out)["w"],
                           torch.arange(8.0) if name in ("manifest", "root") else torch.ones(4))
        assert lines[0].startswith("converted "), lines
    # The root's latest committed checkpoint is step 1: step 2 is incomplete and skipped.
    lines = convert(str(paths["root"]), str(tmp_path / "again.safetensors"),
                    drop_non_tensors=True)
    assert any("step-00000001" in line for line in lines), lines
    with pytest.raises(ConvertError, match="does not exist"):
        convert(str(paths["missing"]), str(tmp_path / "x.safetensors"))
