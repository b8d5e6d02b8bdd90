# SPDX-License-Identifier: Apache-2.0
"""Damaged checkpoints: each kind of damage is found and named (docs/format.md, "What a reader
trusts" in docs/commit_protocol.md).

Real files on disk, damaged the way storage damages them: a flipped bit in tensor data or in a
safetensors header, a truncated or missing file, a missing, empty, torn or garbage manifest, a
manifest with a wrong field, a damaged ``objects.pkl``. For each: what ``list()`` shows, what
``verify()`` reports, what ``load()`` raises (and with which words), and what ``resume()`` does.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest
import torch

import fastpersist
from fastpersist import CheckpointCorruptError
from fastpersist.checkpoint_state import flatten_state
from _checkpoint_models import assert_state_equal

TAG1, TAG2 = "step-00000001", "step-00000002"
DATA = "tensors-00000-of-00001.safetensors"


def make_state(step: int) -> Dict[str, Any]:
    g = torch.Generator().manual_seed(step)
    return {
        "model": {
            "embed.weight": torch.randn(1000, 64, generator=g),
            "layer.weight": torch.randn(64, 64, generator=g).to(torch.bfloat16),
            "layer.bias": torch.randn(64, generator=g),
        },
        "optimizer": {"state": {0: {"exp_avg": torch.randn(1000, 64, generator=g),
                                    "step": torch.tensor(float(step))}},
                      "param_groups": [{"lr": 0.1, "params": [0]}]},
        "counts": torch.arange(500, dtype=torch.int64) * step,
        "step": step,
        "note": f"step {step}",
    }


@pytest.fixture
def mgr(tmp_path: Path) -> Iterator[fastpersist.CheckpointManager]:
    """A root with two intact checkpoints, steps 1 and 2 (step 2 is the latest)."""
    m = fastpersist.CheckpointManager(tmp_path / "ckpts")
    assert m.save(1, make_state(1), metadata={"step": 1}) == TAG1
    assert m.save(2, make_state(2), metadata={"step": 2}) == TAG2
    assert m.list() == [TAG1, TAG2] and m.verify(TAG1) == [] and m.verify(TAG2) == []
    yield m
    m.close()


def ckpt_file(mgr: fastpersist.CheckpointManager, name: str, tag: str = TAG2) -> Path:
    return Path(mgr.path(tag)) / name


def manifest(mgr: fastpersist.CheckpointManager, tag: str = TAG2) -> Dict[str, Any]:
    return json.loads(ckpt_file(mgr, "manifest.json", tag).read_text())


def tensor_entry(mgr: fastpersist.CheckpointManager, name: str) -> Dict[str, Any]:
    (entry,) = [t for t in manifest(mgr)["tensors"] if t["name"] == name]
    return entry


def flip_byte(path: Path, offset: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        (b,) = f.read(1)
        f.seek(offset)
        f.write(bytes([b ^ mask]))


def assert_only_step1_left(mgr: fastpersist.CheckpointManager, reported: bool = True) -> None:
    """The damaged step 2 is not a committed checkpoint any more; step 1 is intact.

    `reported`: resume() warns that it skips step 2 (a directory without a manifest is not a
    checkpoint at all, so it is not reported).
    """
    assert mgr.list() == [TAG1]
    assert mgr.latest() == TAG1, "latest falls back to the newest committed checkpoint"
    assert mgr.verify(TAG1) == []
    assert_state_equal(mgr.load(), make_state(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tag, state = mgr.resume()
    messages = [str(w.message) for w in caught]
    if reported:
        assert len(messages) == 1 and f"skipping damaged checkpoint {TAG2}" in messages[0], messages
    else:
        assert messages == []
    assert tag == TAG1
    assert_state_equal(state, make_state(1))


# ------------------------------------------------------------------------- tensor data
@pytest.mark.parametrize("name", ["model.embed.weight", "model.layer.weight", "counts"])
def test_flipped_byte_in_tensor_data(mgr, name):
    entry = tensor_entry(mgr, name)
    path = ckpt_file(mgr, entry["file"])
    flip_byte(path, entry["offset"] + entry["length"] // 2)

    # Same size: still listed (listing is cheap); verify reads every byte and names the tensor.
    assert mgr.list() == [TAG1, TAG2]
    problems = mgr.verify(TAG2)
    assert len(problems) == 1, problems
    assert f"'{name}'" in problems[0] and entry["file"] in problems[0], problems
    assert "checksum" in problems[0]
    assert mgr.verify(TAG1) == []

    with pytest.raises(CheckpointCorruptError) as info:
        mgr.load(TAG2)
    msg = str(info.value)
    assert f"'{name}'" in msg and entry["file"] in msg and str(path) in msg, msg
    assert isinstance(info.value, ValueError)

    # In-place loads read straight into the destination: the same check, the same message.
    into = make_state(0)
    with pytest.raises(CheckpointCorruptError, match=f"'{name}'.*{entry['file']}"):
        mgr.load(TAG2, into=into)

    # verify=False loads the damaged bytes as they are: exactly one element differs.
    state = mgr.load(TAG2, verify=False)
    expected = make_state(2)
    flat_actual = flatten_state(state).tensors
    flat_expected = dict(flatten_state(expected).tensors)
    for n, t in flat_actual:
        if n == name:
            assert (t != flat_expected[n]).sum().item() == 1, "one flipped byte, one element"
        else:
            assert torch.equal(t, flat_expected[n]), n
    assert state["step"] == 2


def test_wrong_tensor_checksum_in_manifest(mgr):
    """The other side of the same check: intact data, a manifest checksum that disagrees."""
    path = ckpt_file(mgr, "manifest.json")
    m = manifest(mgr)
    m["tensors"][0]["checksum"] = "0123456789abcdef"
    path.write_text(json.dumps(m))
    name = m["tensors"][0]["name"]
    problems = mgr.verify(TAG2)
    assert len(problems) == 1 and f"'{name}'" in problems[0], problems
    with pytest.raises(CheckpointCorruptError, match=f"'{name}'.*0123456789abcdef"):
        mgr.load(TAG2)


# ------------------------------------------------------------------------- headers
def _header_offsets(path: Path) -> Dict[str, int]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    text = raw[8:8 + n]
    return {
        "length_prefix": 1,                                   # N changes by 256
        "json_name": 8 + text.index(b'"model.embed.weight"') + 3,  # a tensor name changes
        "json_dtype": 8 + text.index(b'"F32"') + 2,           # "F32" -> "F22": unknown dtype
        "padding": 8 + n - 2,                                 # a space after the JSON
    }


@pytest.mark.parametrize("where", ["length_prefix", "json_name", "json_dtype", "padding"])
def test_flipped_byte_in_safetensors_header(mgr, where):
    path = ckpt_file(mgr, DATA)
    flip_byte(path, _header_offsets(path)[where])
    problems = mgr.verify(TAG2)
    assert problems, "a damaged header must be reported"
    assert any(f"header of {DATA}" in p and "checksum" in p for p in problems), problems
    assert all(DATA in p for p in problems), problems
    assert mgr.verify(TAG1) == []


def test_non_utf8_byte_in_safetensors_header(mgr):
    # Regression: the JSON error quoted the raw byte and Python failed to decode the message.
    path = ckpt_file(mgr, DATA)
    flip_byte(path, _header_offsets(path)["json_name"], mask=0x80)
    problems = mgr.verify(TAG2)
    assert any(f"header of {DATA}" in p for p in problems), problems
    with pytest.raises(CheckpointCorruptError, match="header"):
        mgr.load(TAG2)


# ------------------------------------------------------------------------- files
def test_truncated_data_file(mgr):
    path = ckpt_file(mgr, DATA)
    size = path.stat().st_size
    os.truncate(path, size - 1000)

    assert_only_step1_left(mgr)
    problems = mgr.verify(TAG2)
    assert len(problems) == 1, problems
    assert DATA in problems[0] and "truncated" in problems[0], problems
    assert str(size) in problems[0] and str(size - 1000) in problems[0], problems
    for verify in (True, False):
        with pytest.raises(CheckpointCorruptError) as info:
            mgr.load(TAG2, verify=verify)
        msg = str(info.value)
        assert DATA in msg and "truncated" in msg and str(size) in msg, msg
        assert str(path) in msg, msg


@pytest.mark.parametrize("name", [DATA, "objects.pkl"])
def test_missing_file(mgr, name):
    path = ckpt_file(mgr, name)
    path.unlink()

    assert_only_step1_left(mgr)
    problems = mgr.verify(TAG2)
    assert len(problems) == 1 and name in problems[0] and "missing" in problems[0], problems
    with pytest.raises(CheckpointCorruptError) as info:
        mgr.load(TAG2)
    assert name in str(info.value) and "missing" in str(info.value), str(info.value)


@pytest.mark.parametrize("extra", [b"x", b"\0" * 4096])
def test_data_file_grown(mgr, extra):
    """Bytes appended (or a file replaced by a longer one): the size check catches it."""
    path = ckpt_file(mgr, DATA)
    with open(path, "ab") as f:
        f.write(extra)
    assert mgr.list() == [TAG1]
    (problem,) = mgr.verify(TAG2)
    assert DATA in problem and "bytes, the manifest says" in problem
    with pytest.raises(CheckpointCorruptError, match=DATA):
        mgr.load(TAG2)


# ------------------------------------------------------------------------- manifest
def test_missing_manifest(mgr):
    ckpt_file(mgr, "manifest.json").unlink()

    assert_only_step1_left(mgr, reported=False)
    assert mgr.verify(TAG2) == ["manifest.json is missing: not a committed checkpoint"]
    with pytest.raises(OSError) as info:
        mgr.load(TAG2)
    assert "manifest" in str(info.value)
    assert info.value.filename == str(ckpt_file(mgr, "manifest.json"))


def _torn(text: bytes) -> bytes:
    return text[: len(text) // 2]


GARBAGE: Dict[str, Callable[[bytes], bytes]] = {
    "not_json": lambda _: b"garbage{",
    "empty": lambda _: b"",
    "zeros": lambda text: b"\0" * len(text),
    "torn_write": _torn,
    "json_array": lambda _: b"[1, 2, 3]",
    "key_repeated": lambda text: text.replace(b'"step": 2,', b'"step": 2, "step": 3,', 1),
}


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_garbage_manifest(mgr, kind):
    path = ckpt_file(mgr, "manifest.json")
    damaged = GARBAGE[kind](path.read_bytes())
    assert damaged != path.read_bytes()
    path.write_bytes(damaged)

    assert_only_step1_left(mgr)
    problems = mgr.verify(TAG2)
    assert len(problems) == 1 and problems[0].startswith("manifest.json is damaged"), problems
    with pytest.raises(CheckpointCorruptError) as info:
        mgr.load(TAG2)
    assert str(path) in str(info.value), str(info.value)


def test_non_utf8_garbage_manifest(mgr):
    # Regression: a manifest of non-UTF-8 bytes made list()/verify()/load() raise
    # UnicodeDecodeError instead of skipping the checkpoint.
    ckpt_file(mgr, "manifest.json").write_bytes(b"\xff\xfe garbage")
    assert_only_step1_left(mgr)
    (problem,) = mgr.verify(TAG2)
    assert problem.startswith("manifest.json is damaged")
    with pytest.raises(CheckpointCorruptError):
        mgr.load(TAG2)


def _set(path: List[Any], value: Any) -> Callable[[Dict[str, Any]], None]:
    def edit(m: Dict[str, Any]) -> None:
        obj = m
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return edit


def _delete(path: List[Any]) -> Callable[[Dict[str, Any]], None]:
    def edit(m: Dict[str, Any]) -> None:
        obj = m
        for key in path[:-1]:
            obj = obj[key]
        del obj[path[-1]]
    return edit


# (edit, words the report must contain)
WRONG_FIELDS: Dict[str, Tuple[Callable[[Dict[str, Any]], None], str]] = {
    "newer_format_version": (_set(["format_version"], 3), "newer fastpersist (format version 3)"),
    "wrong_format": (_set(["format"], "something-else"), "'format'"),
    "checksum_algorithm": (_set(["checksum_algorithm"], "md5"), "checksum_algorithm"),
    "sequence_not_int": (_set(["sequence"], "seven"), "sequence"),
    "sequence_missing": (_delete(["sequence"]), "sequence"),
    "tensors_missing": (_delete(["tensors"]), "tensors"),
    "unknown_dtype": (_set(["tensors", 0, "dtype"], "F99"), "tensors[0].dtype"),
    "length_vs_shape": (_set(["tensors", 0, "shape"], [3, 3]), "tensors[0].length"),
    "offset_past_end": (_set(["tensors", 1, "offset"], 1 << 40), "tensors[1]"),
    "unknown_file": (_set(["tensors", 0, "file"], "nope.safetensors"), "tensors[0].file"),
    "file_size_string": (_set(["files", 0, "size"], "123"), "files[0].size"),
    "checksum_uppercase": (_set(["files", 0, "checksum"], "ABCDEF0123456789"), "files[0].checksum"),
    "bad_file_name": (_set(["files", 0, "name"], "../escape"), "files[0].name"),
}


@pytest.mark.parametrize("kind", list(WRONG_FIELDS))
def test_manifest_with_a_wrong_field(mgr, kind):
    edit, words = WRONG_FIELDS[kind]
    path = ckpt_file(mgr, "manifest.json")
    m = manifest(mgr)
    edit(m)
    path.write_text(json.dumps(m, indent=1))

    assert_only_step1_left(mgr)
    problems = mgr.verify(TAG2)
    assert len(problems) == 1, problems
    assert problems[0].startswith("manifest.json is damaged") and words in problems[0], problems
    with pytest.raises(CheckpointCorruptError) as info:
        mgr.load(TAG2)
    assert words in str(info.value) and str(path) in str(info.value), str(info.value)


def test_unknown_manifest_fields_are_ignored(mgr):
    """Forward compatibility (docs/format.md, Versioning): not damage."""
    path = ckpt_file(mgr, "manifest.json")
    m = manifest(mgr)
    m["added_later"] = {"x": 1}
    m["tensors"][0]["added_later"] = True
    path.write_text(json.dumps(m))
    assert mgr.list() == [TAG1, TAG2]
    assert mgr.verify(TAG2) == []
    assert_state_equal(mgr.load(TAG2), make_state(2))


# ------------------------------------------------------------------------- objects.pkl
def test_corrupted_objects_pkl(mgr):
    path = ckpt_file(mgr, "objects.pkl")
    flip_byte(path, path.stat().st_size // 2)

    problems = mgr.verify(TAG2)
    assert len(problems) == 1 and "objects.pkl" in problems[0] and "checksum" in problems[0]
    with pytest.raises(CheckpointCorruptError) as info:
        mgr.load(TAG2)
    assert "objects.pkl" in str(info.value) and str(path) in str(info.value)


# ------------------------------------------------------------------------- resume
def test_resume_skips_a_damaged_newest_checkpoint(mgr):
    entry = tensor_entry(mgr, "optimizer.state.0.exp_avg")
    flip_byte(ckpt_file(mgr, entry["file"]), entry["offset"] + 7, mask=0x40)
    assert mgr.latest() == TAG2, "listing does not read the data: still the latest"

    with pytest.warns(UserWarning, match=f"{TAG2}.*optimizer.state.0.exp_avg") as record:
        tag, state = mgr.resume()
    assert tag == TAG1
    assert_state_equal(state, make_state(1))
    assert len([w for w in record if TAG2 in str(w.message)]) == 1


def test_resume_into_existing_tensors_overwrites_what_a_damaged_newest_left(mgr):
    """An in-place load that fails verification has already overwritten part of the
    destination; resume(into=) then loads the older checkpoint into the same tensors, so
    every tensor ends with the older checkpoint's values, none with a mix."""
    entry = tensor_entry(mgr, "optimizer.state.0.exp_avg")
    flip_byte(ckpt_file(mgr, entry["file"]), entry["offset"] + entry["length"] - 1, mask=0x40)
    dest = make_state(7)  # same shapes, other values
    with pytest.warns(UserWarning, match=TAG2):
        tag, state = mgr.resume(into=dest)
    assert tag == TAG1
    assert state["model"]["embed.weight"] is dest["model"]["embed.weight"], "filled in place"
    assert_state_equal(state, make_state(1))


def test_resume_with_every_checkpoint_damaged(mgr):
    for tag in (TAG1, TAG2):
        entry = tensor_entry(mgr, "counts")
        flip_byte(Path(mgr.path(tag)) / entry["file"], entry["offset"])
    with pytest.warns(UserWarning) as record:
        assert mgr.resume() == (None, None)
    messages = [str(w.message) for w in record]
    assert any(TAG2 in m for m in messages) and any(TAG1 in m for m in messages), messages


def test_damaged_checkpoints_do_not_block_the_root(mgr, tmp_path):
    """A new manager opens a root with damaged checkpoints, leaves them alone, and saves."""
    ckpt_file(mgr, "manifest.json").write_bytes(b"garbage{")
    flip_byte(ckpt_file(mgr, "objects.pkl", TAG1), 0)
    mgr.close()
    with fastpersist.CheckpointManager(tmp_path / "ckpts", keep_last=2) as m2:
        assert m2.list() == [TAG1]
        assert m2.save(3, make_state(3)) == "step-00000003"
        assert m2.list() == [TAG1, "step-00000003"]
        assert m2.latest() == "step-00000003"
        assert_state_equal(m2.load(), make_state(3))
        # The damaged, unlisted step 2 is left for a person to look at, never reused silently.
        assert (tmp_path / "ckpts" / TAG2).is_dir()
        with pytest.raises(FileExistsError):
            m2.save(2, make_state(2))


def test_retention_removes_a_damaged_checkpoint_once_enough_valid_ones_are_newer(mgr, tmp_path):
    """keep_last counts valid checkpoints; a damaged one goes when it would have gone intact."""
    ckpt_file(mgr, DATA).unlink()  # step 2 damaged; its manifest still decodes
    mgr.close()
    root = tmp_path / "ckpts"
    with fastpersist.CheckpointManager(root, keep_last=2) as m2:
        assert m2.save(3, make_state(3)) == "step-00000003"
        assert (root / TAG2).is_dir(), "only one valid checkpoint is newer than step 2"
        assert m2.list() == [TAG1, "step-00000003"]
        assert m2.save(4, make_state(4)) == "step-00000004"
        assert not (root / TAG2).exists()
        assert m2.list() == ["step-00000003", "step-00000004"]
        assert sorted(os.listdir(root)) == [".lock", "latest", "step-00000003", "step-00000004"]
        assert_state_equal(m2.load("step-00000003"), make_state(3))
