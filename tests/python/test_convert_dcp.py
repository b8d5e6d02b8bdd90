# SPDX-License-Identifier: Apache-2.0
"""`fastpersist convert` imports directories written by torch.distributed.checkpoint's own
FileSystemWriter: by ``dcp.save`` in this process, and by 2 real gloo processes saving DTensors
sharded over a CPU DeviceMesh (tests/python/_foreign_writers.py). Every tensor comes back whole
and bit-identical in safetensors, torch and checkpoint destinations; a hostile ``.metadata`` or
value is refused without running its code; damaged directories give clear errors."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Dict

import pytest
import torch
import torch.distributed.checkpoint as dcp

import fastpersist
from fastpersist.checkpoint_state import flatten_state
from fastpersist.import_dcp import load_dcp_dir
from fastpersist.import_errors import ForeignCheckpointError, UnsafeForeignObjectError
from fastpersist.safetensors_io import load_safetensors

from _foreign_writers import dcp_full_state
from _test_support import find_cli

HERE = Path(__file__).resolve().parent
CLI = find_cli()
needs_cli = pytest.mark.skipif(CLI is None, reason="fastpersist CLI not built: set "
                               "FASTPERSIST_CLI or build build/tools/fastpersist")


def run_convert(*args: Any) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPERSIST_")}
    env["FASTPERSIST_PYTHON"] = sys.executable
    return subprocess.run([str(CLI), "convert", *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.contiguous().view(-1).view(torch.uint8),
                            b.contiguous().view(-1).view(torch.uint8)))


def assert_same_tensors(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert same_bits(got[name], tensor), name


def flat(state: Any) -> Dict[str, torch.Tensor]:
    return dict(flatten_state(state).tensors)


def expected_values(state: Any) -> Dict[str, Any]:
    """The non-tensor values: DCP stores dict keys as strings ({0: ...} comes back {"0": ...})."""
    return {"step": state["step"], "name": state["name"],
            "param_groups": state["optim"]["param_groups"]}


def dcp_save_here(state: Dict[str, Any], path: Path, **kwargs: Any) -> None:
    """dcp.save in this process, without a process group."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        dcp.save(state, checkpoint_id=str(path), no_dist=True, **kwargs)


@pytest.fixture(scope="module")
def two_rank_dirs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OUT/default and OUT/per-item, saved by 2 gloo processes with DTensor state."""
    out = tmp_path_factory.mktemp("dcp2")
    proc = subprocess.run([sys.executable, str(HERE / "_foreign_writers.py"), "dcp", str(out),
                           "2"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and "DeviceMesh" in proc.stderr and "cpu" in proc.stderr:
        pytest.skip(f"DTensor on a CPU DeviceMesh does not work in this torch: {proc.stderr}")
    assert proc.returncode == 0, proc.stderr
    return out


class _Evil:
    """Unpickling it creates ``marker``: what a hostile checkpoint could do instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> Any:
        return (open, (self.marker, "w"))


class _Touch(_Evil):
    """Unpickling it creates ``marker`` and gives None, a value any destination can store."""

    def __reduce__(self) -> Any:
        return (Path.touch, (Path(self.marker),))


# ----------------------------------------------------------------------------- one process
def test_load_dcp_dir_one_process_restores_the_nested_state(tmp_path: Path) -> None:
    state = dcp_full_state()
    dcp_save_here(state, tmp_path / "d")
    seen = []
    got = load_dcp_dir(str(tmp_path / "d"), report=lambda done, total: seen.append((done, total)))
    assert_same_tensors(flat(got), flat(state))
    assert got["step"] == 42 and got["name"] == "run-7"
    assert got["optim"]["param_groups"] == state["optim"]["param_groups"]
    assert sorted(got["model"]) == sorted(state["model"])  # the nesting came back
    total = seen[0][1]
    assert seen[0] == (0, total) and seen[-1] == (total, total) and len(seen) > 2
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


@needs_cli
def test_convert_one_process_dcp_to_pt_safetensors_and_checkpoint(tmp_path: Path) -> None:
    state = dcp_full_state()
    src = tmp_path / "dcp"
    dcp_save_here(state, src)

    pt = tmp_path / "state.pt"
    proc = run_convert(src, pt)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"converted DCP checkpoint {src} -> torch file {pt}: 8 tensors")
    loaded = torch.load(pt, weights_only=True)
    assert_same_tensors(flat(loaded), flat(state))
    assert {"step": loaded["step"], "name": loaded["name"],
            "param_groups": loaded["optim"]["param_groups"]} == expected_values(state)

    st = tmp_path / "model.safetensors"
    proc = run_convert(src, st)
    assert proc.returncode == 1 and "--drop-non-tensors" in proc.stderr and "step" in proc.stderr
    proc = run_convert(src, st, "--prefix", "model.")
    assert proc.returncode == 0, proc.stderr
    assert_same_tensors(load_safetensors(str(st)), flat(state["model"]))

    root = tmp_path / "ckpts"
    proc = run_convert(src, root, "--tag", "imported")
    assert proc.returncode == 0, proc.stderr
    with fastpersist.CheckpointManager(str(root)) as manager:
        back = manager.load("imported")
    assert_same_tensors(flat(back), flat(state))
    assert back["step"] == 42


# ----------------------------------------------------------------------------- two ranks
@needs_cli
@pytest.mark.parametrize("layout", ["default", "per-item"])
def test_convert_two_rank_dtensor_checkpoint_whole(two_rank_dirs: Path, tmp_path: Path,
                                                    layout: str) -> None:
    src = two_rank_dirs / layout
    state = dcp_full_state()
    files = sorted(n for n in os.listdir(src) if n.endswith(".distcp"))
    assert any(n.startswith("__1_") for n in files)  # rank 1 really wrote shards

    st = tmp_path / "all.safetensors"
    proc = run_convert(src, st, "--drop-non-tensors")
    assert proc.returncode == 0, proc.stderr
    assert "non-tensor value(s)" in proc.stdout and "step (int), name (str)" in proc.stdout
    assert_same_tensors(load_safetensors(str(st)), flat(state))

    pt = tmp_path / "all.pt"
    proc = run_convert(src, pt)
    assert proc.returncode == 0, proc.stderr
    loaded = torch.load(pt, weights_only=True)
    assert_same_tensors(flat(loaded), flat(state))
    assert loaded["optim"]["param_groups"] == state["optim"]["param_groups"]


# ----------------------------------------------------------------------------- hostile input
@needs_cli
def test_hostile_metadata_is_refused_without_running_it(tmp_path: Path) -> None:
    src = tmp_path / "dcp"
    dcp_save_here({"w": torch.ones(3)}, src)
    marker = tmp_path / "pwned"
    with open(src / ".metadata", "rb") as f:
        metadata = pickle.load(f)  # written by dcp.save just now: trusted
    metadata.storage_meta = _Evil(marker)
    (src / ".metadata").write_bytes(pickle.dumps(metadata))

    proc = run_convert(src, tmp_path / "out.pt")
    assert proc.returncode == 1
    assert "io.open" in proc.stderr and "--unsafe-pickle" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()
    with pytest.raises(UnsafeForeignObjectError, match="io.open"):
        load_dcp_dir(str(src))
    assert not marker.exists()
    # The payload is real: plain pickle.load (what FileSystemReader does) runs it.
    with open(src / ".metadata", "rb") as f:
        pickle.load(f)
    assert marker.exists()


@needs_cli
def test_hostile_value_is_refused_unless_unsafe(tmp_path: Path) -> None:
    src = tmp_path / "dcp"
    marker = tmp_path / "pwned"
    dcp_save_here({"w": torch.arange(4.0), "extra": _Touch(marker)}, src)
    assert not marker.exists()

    proc = run_convert(src, tmp_path / "out.safetensors", "--drop-non-tensors")
    assert proc.returncode == 1
    # torch.save pickles Path.touch as getattr(Path, "touch"): the refused global is getattr
    assert "extra" in proc.stderr and "getattr" in proc.stderr, proc.stderr
    assert "--unsafe-pickle" in proc.stderr
    assert not marker.exists()
    # DCP's own loader runs it (DefaultLoadPlanner loads values with weights_only=False), and
    # so does convert when told the checkpoint is trusted.
    proc = run_convert(src, tmp_path / "out.safetensors", "--drop-non-tensors", "--unsafe-pickle")
    assert proc.returncode == 0, proc.stderr
    assert marker.exists()


def _rewrite_metadata(src: Path, edit: Any) -> None:
    with open(src / ".metadata", "rb") as f:
        metadata = pickle.load(f)  # trusted: written by the test
    edit(metadata)
    (src / ".metadata").write_bytes(pickle.dumps(metadata))


def test_metadata_paths_outside_the_directory_are_refused(tmp_path: Path) -> None:
    src = tmp_path / "dcp"
    dcp_save_here({"w": torch.ones(3)}, src)
    (tmp_path / "secret").write_bytes(b"s" * 4096)

    def escape(metadata: Any) -> None:
        for info in metadata.storage_data.values():
            info.relative_path = "../secret"

    _rewrite_metadata(src, escape)
    with pytest.raises(ForeignCheckpointError, match="not a file name inside"):
        load_dcp_dir(str(src))


def test_truncated_data_file_is_named(tmp_path: Path) -> None:
    src = tmp_path / "dcp"
    dcp_save_here({"w": torch.ones(1000)}, src)
    data = src / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ForeignCheckpointError, match="__0_0.distcp.*truncated"):
        load_dcp_dir(str(src))
    data.unlink()
    with pytest.raises(ForeignCheckpointError, match="__0_0.distcp, which is missing"):
        load_dcp_dir(str(src))


def test_huge_list_index_in_nesting_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "dcp"
    dcp_save_here({"layers": [torch.ones(2), torch.zeros(2)]}, src)
    _rewrite_metadata(src, lambda m: m.planner_data.update({"layers.1": ("layers", 10**12)}))
    with pytest.raises(ForeignCheckpointError, match="nesting path of layers.1"):
        load_dcp_dir(str(src))


def test_garbage_metadata(tmp_path: Path) -> None:
    src = tmp_path / "dcp"
    dcp_save_here({"w": torch.ones(3)}, src)
    (src / ".metadata").write_bytes(b"\x80\x04not a pickle")
    with pytest.raises(ForeignCheckpointError, match="not readable"):
        load_dcp_dir(str(src))
    (src / ".metadata").write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(ForeignCheckpointError, match="holds a dict, not a DCP Metadata"):
        load_dcp_dir(str(src))


@needs_cli
def test_rank_local_metadata_and_unknown_directories(tmp_path: Path) -> None:
    src = tmp_path / "local"
    dcp_save_here({"w": torch.ones(3)}, src, use_collectives=False)
    if (src / ".metadata").exists():
        pytest.skip("this torch writes a global .metadata with use_collectives=False")
    proc = run_convert(src, tmp_path / "o.pt")
    assert proc.returncode == 1 and "use_collectives=False" in proc.stderr, proc.stderr

    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "notes.txt").write_text("hello")
    proc = run_convert(unknown, tmp_path / "o.pt")
    assert proc.returncode == 2
    assert "does not recognize" in proc.stderr and ".metadata" in proc.stderr
    assert "DeepSpeed" in proc.stderr



def test_safetensors_serialization_format_is_refused_clearly(tmp_path: Path) -> None:
    filesystem = pytest.importorskip("torch.distributed.checkpoint.filesystem")
    if not hasattr(filesystem, "SerializationFormat"):
        pytest.skip("this torch's FileSystemWriter has no serialization_format")
    pytest.importorskip("safetensors")
    src = tmp_path / "dcp"
    writer = dcp.FileSystemWriter(str(src),
                                  serialization_format=filesystem.SerializationFormat.SAFETENSORS)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        dcp.save({"w": torch.ones(3), "n": 1}, storage_writer=writer, no_dist=True)
    with pytest.raises(ForeignCheckpointError, match="serialization_format=SAFETENSORS"):
        load_dcp_dir(str(src))


def test_chunks_that_do_not_cover_the_tensor_are_refused(tmp_path: Path) -> None:
    src = tmp_path / "dcp"
    dcp_save_here({"w": torch.ones(4, 3)}, src)

    def grow(metadata: Any) -> None:  # a shape far larger than what is stored
        metadata.state_dict_metadata["w"].size = torch.Size([4 * 10**9, 3])

    _rewrite_metadata(src, grow)
    with pytest.raises(ForeignCheckpointError, match="chunks of w hold 12 of its"):
        load_dcp_dir(str(src))


def test_a_data_file_linked_out_of_the_directory_is_never_followed(tmp_path: Path) -> None:
    """A .distcp file (or the .metadata) that is a symbolic link is refused: an import reads the
    directory's own files only, as fastpersist's own readers do."""
    src = tmp_path / "dcp"
    dcp_save_here({"w": torch.arange(4.0)}, src)
    data = sorted(src.glob("*.distcp"))[0]
    outside = tmp_path / "outside.distcp"
    data.rename(outside)
    data.symlink_to(outside)
    with pytest.raises(ForeignCheckpointError, match=r"\.distcp is a symbolic link"):
        load_dcp_dir(str(src))
    data.unlink()
    outside.rename(data)
    assert torch.equal(load_dcp_dir(str(src))["w"], torch.arange(4.0))
    meta = src / ".metadata"
    meta.rename(tmp_path / "outside.metadata")
    meta.symlink_to(tmp_path / "outside.metadata")
    with pytest.raises(ForeignCheckpointError, match=r"\.metadata is a symbolic link"):
        load_dcp_dir(str(src))
