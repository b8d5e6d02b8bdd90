# SPDX-License-Identifier: Apache-2.0
"""The reader's typed manifest (no JSON re-parsed in Python) and the load's progress callback,
which C++ calls."""

from __future__ import annotations

import pytest
import torch

import fastpersist
from fastpersist import _core
from fastpersist.checkpoint_loading import load_checkpoint_dir
from fastpersist.writer import engine_options


@pytest.fixture()
def ckpt(tmp_path):
    state = {"w": torch.randn(1000, 300), "b": torch.arange(7), "h": torch.zeros(0, 3, dtype=torch.float16)}
    state["tied"] = state["w"]
    with fastpersist.CheckpointManager(tmp_path, durable=False) as m:
        m.save(5, state)
    return tmp_path / "step-00000005", state


def test_manifest_is_a_typed_read_only_object(ckpt):
    path, state = ckpt
    m = _core.CheckpointReader(str(path), engine_options()).manifest
    assert isinstance(m, _core.Manifest)
    assert m.step == 5 and m.tag == "step-00000005" and m.world_size == 1
    assert m.aliases == {"tied": "w"}
    assert sorted(m.names()) == ["b", "h", "tied", "w"]
    by_name = {t.name: t for t in m.tensors}
    assert by_name["w"].dtype == "F32" and by_name["w"].shape == [1000, 300]
    assert by_name["w"].length == 1000 * 300 * 4
    assert by_name["w"].encoding == "raw" and by_name["w"].global_shape == []
    assert m.tensor_bytes == sum(t.length for t in m.tensors)
    files = {f.name: f for f in m.files}
    assert {f.role for f in m.files} == {"tensors", "objects"}
    assert all(files[t.file].role == "tensors" and t.offset + t.length <= files[t.file].size for t in m.tensors)
    assert all(f.referenced_checkpoint == "" and f.rank is None for f in m.files)
    with pytest.raises(AttributeError):
        m.tag = "other"  # type: ignore[misc]


def test_progress_is_reported_from_cpp_up_to_the_total(ckpt):
    path, state = ckpt
    seen = []
    out = load_checkpoint_dir(str(path), engine_options(), progress=lambda d, t: seen.append((d, t)),
                              max_memory=100_000, dtype=torch.float16)
    total = 1000 * 300 * 4 + 7 * 8
    assert seen[0] == (0, total) and seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert torch.equal(out["w"], state["w"].half()) and out["tied"] is out["w"]


def test_an_exception_from_progress_propagates_after_the_load(ckpt):
    path, _ = ckpt

    def boom(done, total):
        raise KeyError("stop")

    with pytest.raises(KeyError, match="stop"):
        load_checkpoint_dir(str(path), engine_options(), progress=boom)
