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


def test_the_load_seam_takes_keywords_and_returns_typed_objects(ckpt):
    """CheckpointReader.load takes keyword arguments only and returns a LoadOutcome whose
    tensors and destination states are named, not positions in tuples; verify_checkpoint gives
    a VerifyReport."""
    path, state = ckpt
    reader = _core.CheckpointReader(str(path), engine_options())
    with pytest.raises(TypeError):
        reader.load(None, [], False, "", {}, True, True, 0, None)  # positional: refused
    into = torch.empty(7, dtype=torch.int64)
    outcome = reader.load(names=["b", "w"], destinations=[("b", into.data_ptr(), into.nbytes, "I64", [7], [])],
                          into=False, dtype="", dtype_by_name={}, strict=True, verify=True,
                          max_memory=0, progress=None)
    assert isinstance(outcome, _core.LoadOutcome)
    assert list(outcome.destinations) == [_core.DestinationState.FILLED]
    assert torch.equal(into, state["b"])
    by_name = {t.name: t for t in outcome.tensors}
    assert by_name["b"].destination == 0 and by_name["b"].buffer == -1
    w = by_name["w"]
    assert w.destination == -1 and w.dtype == "F32" and w.shape == [1000, 300]
    assert 0 <= w.buffer < len(outcome.buffers) and w.nbytes == 1000 * 300 * 4
    assert list(outcome.missing) == [] and list(outcome.mismatched) == []
    report = _core.verify_checkpoint(str(path), engine_options(), None)
    assert isinstance(report, _core.VerifyReport) and report.ok and report.has_checksums
    assert report.bytes_checked >= 1000 * 300 * 4 and list(report.problems) == []


def test_commit_content_is_built_by_keyword_with_the_cpp_defaults(tmp_path):
    content = _core.CommitContent(files=[])
    assert content.metadata_json == "{}" and content.world_size == 1 and content.checksums
    assert content.step is None and content.tensors == []
    with pytest.raises(TypeError):
        _core.CommitContent([], [], None, "{}", {}, 1, True, {})  # positional: refused
