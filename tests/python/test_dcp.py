# SPDX-License-Identifier: Apache-2.0
"""fastpersist.dcp: torch.distributed.checkpoint saves and loads through FastPersistWriter and
FastPersistReader, on real processes with the gloo backend: round trips on 2 and 4 ranks,
resharding between world sizes, async_save in thread and process mode, a rank's failure, a
damaged shard, hostile metadata, and the checkpoint being an ordinary fastpersist checkpoint
(list, verify, CheckpointManager)."""

from __future__ import annotations

import os
import pickle
import subprocess
from pathlib import Path
from typing import Any, Dict

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import fastpersist
from fastpersist import _core
from fastpersist.dcp import FastPersistReader, FastPersistWriter, stored_name

import _dcp_workers as workers
from _distributed import run_ranks
from _test_support import find_cli


def _manifest(path: Path) -> Any:
    return _core.CheckpointReader(str(path), _core.EngineOptions()).manifest


def _plain_state(seed: int = 0) -> Dict[str, Any]:
    """The workers' state as one process holds it: whole tensors."""
    full = workers.full_state(seed)
    return {"model": {"w": full["model.w"], "b": full["model.b"]},
            "opt": {"m": full["opt.m"], "steps": full["opt.steps"]},
            "step": 11, "note": {"text": "hello", "lr": 0.5}}


def test_stored_names_are_the_key_or_the_block_as_a_slice() -> None:
    assert stored_name("w", [0, 0], [4, 5], [4, 5]) == "w"
    assert stored_name("w", [4, 0], [4, 5], [8, 5]) == "w[4:8,0:5]"
    assert stored_name("s", [], [], []) == "s"


@pytest.mark.parametrize("world_size", [2, 4])
def test_round_trip_on_ranks_is_an_ordinary_checkpoint(tmp_path: Path, world_size: int) -> None:
    path = tmp_path / "step-11"
    run_ranks(workers.save, world_size, str(path))
    run_ranks(workers.load, world_size, str(path))

    names = sorted(os.listdir(path))
    assert "manifest.json" in names and _core.layout.DCP_METADATA_FILE_NAME in names
    m = _manifest(path)
    assert m.world_size == world_size
    assert m.step == 11
    ranks = {f.rank for f in m.files if f.role == "tensors"}
    assert ranks == set(range(world_size)), "every rank wrote its share"
    blocks = [t for t in m.tensors if t.name.startswith("model.w[")]
    assert len(blocks) == world_size
    assert all(t.global_shape == [workers.ROWS, 10] for t in blocks)
    assert sorted(t.shard_offsets[0] for t in blocks) == list(range(0, workers.ROWS, workers.ROWS // world_size))
    assert len([t for t in m.tensors if t.name == "model.b"]) == 1, "a replicated tensor is written once"

    # The library's own tools read it unchanged.
    with fastpersist.CheckpointManager(tmp_path) as mgr:
        assert mgr.list() == ["step-11"]
        assert mgr.latest() == "step-11"
        assert mgr.verify("step-11") == []
    cli = find_cli()
    if cli is not None:
        for args in (["verify", str(path)], ["list", str(tmp_path)], ["inspect", str(path)],
                     ["clean", str(tmp_path)], ["prune", str(tmp_path), "--keep-last", "1"]):
            out = subprocess.run([cli] + args, capture_output=True, text=True, check=False)
            assert out.returncode == 0, (args, out.stdout + out.stderr)
            if args[0] == "inspect":
                assert f"{world_size} ranks" in out.stdout, out.stdout


def test_replicated_tensors_are_written_once_by_several_ranks(tmp_path: Path) -> None:
    run_ranks(workers.save_replicated, 2, str(tmp_path / "r"))
    m = _manifest(tmp_path / "r")
    assert sorted(t.name for t in m.tensors) == [f"rep{i}" for i in range(8)], "each once"
    rank_of = {f.name: f.rank for f in m.files}
    assert {rank_of[t.file] for t in m.tensors} == {0, 1}, "the writing is split over the ranks"


@pytest.mark.parametrize("saved,loaded", [(4, 2), (2, 1), (1, 4), (3, 2)])
def test_a_checkpoint_of_n_ranks_loads_on_m(tmp_path: Path, saved: int, loaded: int) -> None:
    path = tmp_path / "step-11"
    if saved == 1:
        dcp.save(_plain_state(), storage_writer=FastPersistWriter(path, step=11))
    else:
        run_ranks(workers.save, saved, str(path))
    if loaded == 1:
        target = workers.empty_like_state(_plain_state(seed=3))
        dcp.load(target, storage_reader=FastPersistReader(path))
        workers.check_loaded(target)
    else:
        run_ranks(workers.load, loaded, str(path))


def test_resharding_from_rows_to_columns(tmp_path: Path) -> None:
    path = tmp_path / "t"
    run_ranks(workers.save, 2, str(path), 0, "rows")
    run_ranks(workers.load, 3, str(path), 0, "columns")


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_async_save(tmp_path: Path, mode: str) -> None:
    run_ranks(workers.async_save, 2, str(tmp_path / "a"), mode, timeout=300)
    assert _manifest(tmp_path / "a").world_size == 2


def test_a_failing_rank_commits_nothing(tmp_path: Path) -> None:
    run_ranks(workers.save_fails, 2, str(tmp_path), "good", "bad")


def test_a_damaged_shard_fails_verify_naming_the_file_and_the_block(tmp_path: Path) -> None:
    path = tmp_path / "t"
    run_ranks(workers.save, 2, str(path))
    m = _manifest(path)
    block = next(t for t in m.tensors if t.name.startswith("model.w[") and t.file.startswith("tensors-r00001"))
    with open(path / block.file, "r+b") as f:
        f.seek(block.offset + 5)
        byte = f.read(1)
        f.seek(block.offset + 5)
        f.write(bytes([byte[0] ^ 0xFF]))
    with fastpersist.CheckpointManager(tmp_path) as mgr:
        problems = mgr.verify("t")
    assert any(block.file in p and block.name in p for p in problems), problems
    target = workers.empty_like_state(_plain_state())
    with pytest.raises(CheckpointException, match=r"CheckpointCorruptError: .*model\.w\[.*fails its checksum"):
        dcp.load(target, storage_reader=FastPersistReader(path))


class _Hostile:
    def __reduce__(self) -> Any:
        return (os.system, (f"touch {_Hostile.marker}",))

    marker = ""


def test_hostile_metadata_is_refused_without_running_it(tmp_path: Path) -> None:
    path = tmp_path / "t"
    dcp.save(_plain_state(), storage_writer=FastPersistWriter(path, checksums=False))
    marker = tmp_path / "pwned"
    _Hostile.marker = str(marker)
    meta = path / _core.layout.DCP_METADATA_FILE_NAME
    size = meta.stat().st_size
    payload = pickle.dumps(_Hostile(), protocol=2)
    assert len(payload) < size
    meta.write_bytes(payload + b"\0" * (size - len(payload)))  # same size: passes the cheap checks
    with pytest.raises(CheckpointException, match=r"not DCP metadata.*posix\.system"):
        dcp.load(workers.empty_like_state(_plain_state()), storage_reader=FastPersistReader(path))
    assert not marker.exists()


class Opaque:
    """A user class: torch's weights_only unpickler does not know it."""

    def __init__(self, value: int) -> None:
        self.value = value


def test_objects_beyond_weights_only_need_unsafe_objects(tmp_path: Path) -> None:
    path = tmp_path / "t"
    dcp.save({"w": torch.ones(3), "odd": Opaque(7)}, storage_writer=FastPersistWriter(path))
    with pytest.raises(CheckpointException, match=r"(?s)UnsafeCheckpointObjectError.*unsafe_objects=True"):
        dcp.load({"w": torch.zeros(3), "odd": None}, storage_reader=FastPersistReader(path))
    out: Dict[str, Any] = {"w": torch.zeros(3), "odd": None}
    dcp.load(out, storage_reader=FastPersistReader(path, unsafe_objects=True))
    assert out["odd"].value == 7


def test_tags_are_never_replaced_and_paths_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "t"
    dcp.save({"w": torch.ones(2)}, storage_writer=FastPersistWriter(path))
    with pytest.raises(CheckpointException, match="already exists"):
        dcp.save({"w": torch.zeros(2)}, storage_writer=FastPersistWriter(path))
    out = {"w": torch.zeros(2)}
    dcp.load(out, storage_reader=FastPersistReader(path))
    assert torch.equal(out["w"], torch.ones(2)), "the committed checkpoint is intact"
    with pytest.raises(ValueError, match="tag"):
        FastPersistWriter(tmp_path / ".hidden")
    with pytest.raises(TypeError, match="unknown setting"):
        FastPersistWriter(path, staging_budjet=1)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]


def test_the_writer_pickles_without_native_state(tmp_path: Path) -> None:
    writer = FastPersistWriter(tmp_path / "t", step=3, max_parallel_files=2)
    dcp.save({"w": torch.ones(2)}, storage_writer=writer)  # opens native resources
    clone = pickle.loads(pickle.dumps(writer))
    assert clone.checkpoint_id == writer.checkpoint_id
    dcp.save({"w": torch.ones(2)}, storage_writer=clone, checkpoint_id=tmp_path / "u")
    with fastpersist.CheckpointManager(tmp_path) as mgr:
        assert sorted(mgr.list()) == ["t", "u"]


def test_writers_of_one_process_share_their_pinned_staging(tmp_path: Path) -> None:
    """A training loop makes a writer per tag: the next save reuses the staging memory the
    previous one pinned (pinning gigabytes again took seconds per save), until close()."""
    state = {"w": torch.ones(1 << 20)}
    first = FastPersistWriter(tmp_path / "a")
    dcp.save(state, storage_writer=first)
    staged = first._shard_writer
    assert staged.staging_bytes >= 4 << 20
    del first
    second = FastPersistWriter(tmp_path / "b")
    dcp.save(state, storage_writer=second)
    assert second._shard_writer is staged, "a new writer pinned its staging again"
    other = FastPersistWriter(tmp_path / "c", staging_budget="1MiB")
    dcp.save(state, storage_writer=other)
    assert other._shard_writer is not staged, "other settings get a writer of their own"
    second.close()
    third = FastPersistWriter(tmp_path / "d")
    dcp.save(state, storage_writer=third)
    assert third._shard_writer is not staged, "close() released the shared writer"
    out = {"w": torch.zeros(1 << 20)}
    dcp.load(out, storage_reader=FastPersistReader(tmp_path / "d"))
    assert torch.equal(out["w"], state["w"])
    third.close()
    other.close()


def _edit_metadata(path: Path, edit: Any) -> None:
    """Rewrites a checkpoint's dcp-metadata.pt (saved without checksums) with `edit` applied,
    padded to its size, so that it passes the cheap checks."""
    meta = path / _core.layout.DCP_METADATA_FILE_NAME
    size = meta.stat().st_size
    metadata = pickle.loads(meta.read_bytes())  # trusted: the test wrote it
    edit(metadata)
    payload = min((pickle.dumps(metadata, protocol=p) for p in (2, 3, 4, 5)), key=len)
    assert len(payload) <= size
    meta.write_bytes(payload + b"\0" * (size - len(payload)))


@pytest.mark.parametrize("edit", ["shape", "dtype"])
def test_metadata_that_disagrees_with_the_stored_block_is_damage(tmp_path: Path, edit: str) -> None:
    """DCP metadata that gives a block another shape (a [5] over a stored [10]) or dtype than the
    stored block is refused as damage, never narrowed or converted into what it claims."""
    path = tmp_path / "t"
    dcp.save({"w": torch.arange(10, dtype=torch.float32)},
             storage_writer=FastPersistWriter(path, checksums=False))

    def shrink(metadata: Any) -> None:
        record = metadata.state_dict_metadata["w"]
        record.size = torch.Size([5])
        record.chunks[0].sizes = torch.Size([5])

    def retype(metadata: Any) -> None:
        metadata.state_dict_metadata["w"].properties.dtype = torch.float64

    _edit_metadata(path, shrink if edit == "shape" else retype)
    out = {"w": torch.zeros(5) if edit == "shape" else torch.zeros(10, dtype=torch.float64)}
    said = r"the DCP metadata (gives its block the shape \[5\]|says torch.float64)"
    with pytest.raises(CheckpointException, match=said):
        dcp.load(out, storage_reader=FastPersistReader(path))


@pytest.mark.parametrize("damage", ["metadata_bit_rot", "tensor_bit_rot", "hostile_metadata"])
def test_resume_falls_back_past_a_damaged_dcp_checkpoint(tmp_path: Path, damage: str) -> None:
    """resume() skips a DCP-written checkpoint that is damaged or hostile (DCP's
    CheckpointException, a BaseException, is mapped to fastpersist's errors) and loads the
    previous intact one; a plain load raises CheckpointCorruptError, not DCP's exception."""
    root = tmp_path / "root"
    dcp.save({"w": torch.arange(8.0)}, storage_writer=FastPersistWriter(root / "step-1", step=1))
    # Hostile metadata passes the cheap checks only without checksums (same size, no content check).
    dcp.save({"w": torch.arange(8.0) + 1},
             storage_writer=FastPersistWriter(root / "step-2", step=2,
                                              checksums=damage != "hostile_metadata"))
    newest = root / "step-2"
    if damage == "metadata_bit_rot":
        target = newest / _core.layout.DCP_METADATA_FILE_NAME
        offset = target.stat().st_size // 2
    elif damage == "tensor_bit_rot":
        target = next(newest.glob("*.safetensors"))
        offset = target.stat().st_size - 4  # inside the last tensor's bytes
    if damage == "hostile_metadata":
        _Hostile.marker = str(tmp_path / "pwned")
        meta = newest / _core.layout.DCP_METADATA_FILE_NAME
        size = meta.stat().st_size
        payload = pickle.dumps(_Hostile(), protocol=2)
        meta.write_bytes(payload + b"\0" * (size - len(payload)))
    else:
        data = bytearray(target.read_bytes())
        data[offset] ^= 0xFF
        target.write_bytes(bytes(data))
    with fastpersist.CheckpointManager(root) as manager:
        with pytest.warns(UserWarning, match="skipping damaged checkpoint step-2"):
            tag, state = manager.resume()
        assert tag == "step-1" and torch.equal(state["w"], torch.arange(8.0))
        with pytest.raises(fastpersist.CheckpointCorruptError):
            manager.load("step-2")
    assert not (tmp_path / "pwned").exists()


def test_a_nesting_index_beyond_the_items_is_damage(tmp_path: Path) -> None:
    """A planner_data path with a list index of 3 * 10**6 (DCP's set_element would append
    that many Nones) is refused as damage before DCP builds anything."""
    path = tmp_path / "t"
    dcp.save({"w": torch.arange(4.0), "a_long_name_that_leaves_room": torch.arange(2.0)},
             storage_writer=FastPersistWriter(path, checksums=False))

    def deepen(metadata: Any) -> None:
        metadata.planner_data = {"w": (3_000_000,)}  # shorter than before: fits the file

    _edit_metadata(path, deepen)
    with fastpersist.CheckpointManager(tmp_path) as manager:
        with pytest.raises(fastpersist.CheckpointCorruptError, match=r"nesting path of w is \(3000000,\)"):
            manager.load("t")


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and values; NaNs in the same places (their payloads may differ)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        nan = a.isnan()
        return torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])
    return torch.equal(a, b)


def test_loads_into_other_dtypes_and_strides_match_dcps_own_reader(tmp_path: Path) -> None:
    """Each block one read item covers whole is offered to C++ with its destination, and C++
    picks the route: straight in, converted (float32 into bfloat16, float16 into float64,
    int64 into float32) or through strides (a transposed view); where it cannot convert (floats
    into integers) it leaves the block in new memory for torch's copy. Whatever the route, the
    values are exactly those DCP's own FileSystemReader gives."""
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    specials = torch.tensor([float("inf"), float("-inf"), float("nan"), 3.0e38, -1.0e-40,
                             1.00390625, 1.01171875, 65504.0, 65520.0, -0.0])
    state = {"f32": torch.cat([torch.randn(2090), specials]).reshape(70, 30),
             "f16": torch.randn(40).half(), "i64": torch.arange(-(1 << 40), 1 << 40, 1 << 34),
             "bf16": (torch.randn(17) * 100).bfloat16(), "t": torch.randn(64, 33)}
    dcp.save(state, storage_writer=FastPersistWriter(tmp_path / "fp"))
    dcp.save(state, storage_writer=FileSystemWriter(str(tmp_path / "ref")))

    def destinations() -> Dict[str, torch.Tensor]:
        return {"f32": torch.zeros(70, 30, dtype=torch.bfloat16),
                "f16": torch.zeros(40, dtype=torch.float64),
                "i64": torch.zeros(128, dtype=torch.float32),
                "bf16": torch.zeros(17, dtype=torch.int32),
                "t": torch.zeros(33, 64).t()}

    ours, theirs = destinations(), destinations()
    kept = ours["t"]
    dcp.load(ours, storage_reader=FastPersistReader(tmp_path / "fp"))
    dcp.load(theirs, storage_reader=FileSystemReader(str(tmp_path / "ref")))
    for name in ours:
        assert _same_values(ours[name], theirs[name]), name
    assert ours["t"].data_ptr() == kept.data_ptr() and ours["t"].stride() == (1, 64)
    assert torch.equal(ours["t"], state["t"])
