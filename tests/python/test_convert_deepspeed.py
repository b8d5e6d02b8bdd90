# SPDX-License-Identifier: Apache-2.0
"""`fastpersist convert` imports DeepSpeed ZeRO checkpoint folders (what ``zero_to_fp32.py``
takes). The folders are written by DeepSpeed itself: 2 real processes train a small model with
tied embeddings, a frozen layer and two parameter groups on the CPU (gloo) with ZeRO stages 1,
2 and 3, in fp32 and bf16 (tests/python/_foreign_writers.py). Those tests skip when deepspeed is
not installed; the hostile-file and layout tests below them need no DeepSpeed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest
import torch

import fastpersist
from fastpersist.import_deepspeed import find_deepspeed_checkpoint, load_deepspeed_dir
from fastpersist.import_errors import ForeignCheckpointError, UnsafeForeignObjectError
from fastpersist.safetensors_io import load_safetensors

from _test_support import find_cli

HERE = Path(__file__).resolve().parent
CLI = find_cli()
needs_cli = pytest.mark.skipif(CLI is None, reason="fastpersist CLI not built: set "
                               "FASTPERSIST_CLI or build build/tools/fastpersist")
TRAINED = ["emb.weight", "hidden.weight", "hidden.bias"]
FROZEN = ["frozen.weight", "frozen.bias"]


def run_convert(*args: Any) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPERSIST_")}
    env["FASTPERSIST_PYTHON"] = sys.executable
    return subprocess.run([str(CLI), "convert", *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.contiguous().view(-1).view(torch.uint8),
                            b.contiguous().view(-1).view(torch.uint8)))


_trained: Dict[Tuple[int, bool], Path] = {}


def deepspeed_folder(tmp_path_factory: pytest.TempPathFactory, stage: int, bf16: bool) -> Path:
    """A folder DeepSpeed wrote after 3 steps on 2 ranks (trained once per configuration)."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed)")
    key = (stage, bf16)
    if key not in _trained:
        out = tmp_path_factory.mktemp(f"zero{stage}{'-bf16' if bf16 else ''}")
        env = dict(os.environ, DS_ACCELERATOR="cpu")
        proc = subprocess.run([sys.executable, str(HERE / "_foreign_writers.py"), "deepspeed",
                               str(out), str(stage), "2", "1" if bf16 else "0"],
                              capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr[-4000:]
        _trained[key] = out
    return _trained[key]


def zero_to_fp32(folder: Path) -> Dict[str, torch.Tensor]:
    """DeepSpeed's own reconstruction, the oracle."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return dict(get_fp32_state_dict_from_zero_checkpoint(str(folder)))


CONFIGS = [(1, False), (2, True), (3, False), (3, True)]


@needs_cli
@pytest.mark.parametrize("stage,bf16", CONFIGS,
                         ids=[f"zero{s}-{'bf16' if b else 'fp32'}" for s, b in CONFIGS])
def test_convert_zero_folder_to_safetensors_matches_deepspeed(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, stage: int, bf16: bool) -> None:
    folder = deepspeed_folder(tmp_path_factory, stage, bf16)
    out = tmp_path / "model.safetensors"
    proc = run_convert(folder, out)
    assert proc.returncode == 0, proc.stderr
    tag = (folder / "latest").read_text().strip()
    assert proc.stdout.startswith(f"converted DeepSpeed ZeRO checkpoint {folder / tag} -> ")
    assert f"converting the tag its latest file names, {tag}" in proc.stdout
    got = load_safetensors(str(out))

    # Bit-identical to what zero_to_fp32 rebuilds, for every name it gives ...
    oracle = zero_to_fp32(folder)
    for name, tensor in oracle.items():
        assert same_bits(got[name], tensor), name
    # ... which is everything but the frozen layer at stage 1 (it records none: convert takes
    # it from the module's state, where it is whole).
    assert sorted(set(got) - set(oracle)) == (sorted(FROZEN) if stage == 1 else [])

    # And to the model as DeepSpeed held it after the last step: fp32 master weights are the
    # parameters; with bf16 the parameters are those rounded to bf16.
    reference = torch.load(folder / "reference.pt", weights_only=True)
    assert sorted(got) == sorted(reference)
    for name in TRAINED + ["out.weight"]:
        assert got[name].dtype == torch.float32
        want = reference[name]
        assert same_bits(got[name].to(want.dtype), want), name
    for name in FROZEN + ["counter"]:
        assert same_bits(got[name], reference[name]), name
    assert same_bits(got["scale"], reference["scale"].float())
    assert torch.equal(got["out.weight"], got["emb.weight"])  # tied


@needs_cli
def test_convert_zero3_tag_folder_to_pt_and_checkpoint(tmp_path_factory: pytest.TempPathFactory,
                                                       tmp_path: Path) -> None:
    folder = deepspeed_folder(tmp_path_factory, 3, False)
    tag_folder = folder / (folder / "latest").read_text().strip()
    oracle = zero_to_fp32(folder)

    pt = tmp_path / "model.pt"
    proc = run_convert(tag_folder, pt, "--progress")
    assert proc.returncode == 0, proc.stderr
    assert f"convert read {tag_folder}" in proc.stderr  # bytes of the files read
    loaded = torch.load(pt, weights_only=True)
    assert sorted(loaded) == sorted(oracle)
    for name, tensor in oracle.items():
        assert same_bits(loaded[name], tensor), name
    # Tied weights stay one tensor in a torch file.
    assert loaded["out.weight"].data_ptr() == loaded["emb.weight"].data_ptr()

    root = tmp_path / "ckpts"
    proc = run_convert(folder, root, "--tag", "from-deepspeed")
    assert proc.returncode == 0, proc.stderr
    with fastpersist.CheckpointManager(str(root)) as manager:
        back = manager.load("from-deepspeed")
    for name, tensor in oracle.items():
        assert same_bits(back[name], tensor), name


@needs_cli
def test_real_zero_folder_with_a_hostile_object_is_refused_unless_unsafe(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    folder = tmp_path / "ds"
    shutil.copytree(deepspeed_folder(tmp_path_factory, 2, False), folder)
    tag = (folder / "latest").read_text().strip()
    optim = folder / tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    state = torch.load(optim, weights_only=False)  # written by DeepSpeed just now: trusted
    marker = tmp_path / "pwned"
    state["extra"] = _Touch(marker)
    torch.save(state, optim)

    proc = run_convert(folder, tmp_path / "o.safetensors")
    assert proc.returncode == 1
    assert optim.name in proc.stderr and "getattr" in proc.stderr, proc.stderr
    assert "--unsafe-pickle" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()
    # zero_to_fp32 and convert --unsafe-pickle load with weights_only=False: the code runs.
    proc = run_convert(folder, tmp_path / "o.safetensors", "--unsafe-pickle")
    assert proc.returncode == 0, proc.stderr
    assert marker.exists()


@needs_cli
def test_incomplete_zero_folders(tmp_path_factory: pytest.TempPathFactory,
                                 tmp_path: Path) -> None:
    folder = tmp_path / "ds"
    shutil.copytree(deepspeed_folder(tmp_path_factory, 1, False), folder)
    tag = (folder / "latest").read_text().strip()
    (folder / tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    proc = run_convert(folder, tmp_path / "o.pt")
    assert proc.returncode == 1
    assert "1 optimizer state file(s) but was saved by 2 ranks" in proc.stderr, proc.stderr

    (folder / "latest").unlink()
    proc = run_convert(folder, tmp_path / "o.pt")
    assert proc.returncode == 1
    assert "no latest file" in proc.stderr and tag in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------- no DeepSpeed
class _Touch:
    """Unpickling it creates ``marker`` (and gives None)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (Path.touch, (self.marker,))


def _fake_zero_folder(root: Path, optim_extra: Any) -> Path:
    """The layout of a ZeRO-2 folder of one rank, with ``optim_extra`` in its optimizer file.
    Not written by DeepSpeed: it tests the loader's gate, which reads the optimizer file first."""
    tag = root / "global_step1"
    tag.mkdir(parents=True)
    (root / "latest").write_text("global_step1")
    torch.save({"module": {"w": torch.ones(2)}, "buffer_names": [],
                "param_shapes": [{"w": torch.Size([2])}], "shared_params": {}},
               tag / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": {"zero_stage": 2, "partition_count": [1],
                                         "single_partition_of_fp32_groups": [torch.ones(2)],
                                         "extra": optim_extra}},
               tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    return tag


def test_hostile_pickle_in_a_zero_layout_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    tag = _fake_zero_folder(tmp_path / "ds", _Touch(marker))
    assert find_deepspeed_checkpoint(str(tmp_path / "ds")) == str(tag)
    with pytest.raises(UnsafeForeignObjectError, match="getattr"):
        load_deepspeed_dir(str(tmp_path / "ds"))
    assert not marker.exists()


def test_layout_errors(tmp_path: Path) -> None:
    tag = _fake_zero_folder(tmp_path / "ds", None)
    assert same_bits(load_deepspeed_dir(str(tmp_path / "ds"))["w"], torch.ones(2))
    (tag / "mp_rank_01_model_states.pt").write_bytes(b"")
    with pytest.raises(ForeignCheckpointError, match="model .tensor or pipeline. parallel"):
        load_deepspeed_dir(str(tmp_path / "ds"))
    (tag / "mp_rank_01_model_states.pt").unlink()
    (tmp_path / "ds" / "latest").write_text("global_step9")
    with pytest.raises(ForeignCheckpointError, match="names global_step9, which does not exist"):
        find_deepspeed_checkpoint(str(tmp_path / "ds"))
    for f in tag.glob("*_optim_states.pt"):
        f.unlink()
    with pytest.raises(ForeignCheckpointError, match="not a ZeRO checkpoint"):
        load_deepspeed_dir(str(tag))


def test_links_out_of_the_folder_are_never_followed(tmp_path: Path) -> None:
    """An optimizer file that is a symbolic link (to a file outside the folder), and a tag folder
    named by `latest` that is itself a link, are refused: an import reads the folder's own files
    only, as fastpersist's own readers do."""
    tag = _fake_zero_folder(tmp_path / "ds", None)
    optim = tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    outside = tmp_path / "outside.pt"
    optim.rename(outside)
    optim.symlink_to(outside)
    with pytest.raises(ForeignCheckpointError, match="optim_states.pt is a symbolic link"):
        load_deepspeed_dir(str(tmp_path / "ds"))
    optim.unlink()
    outside.rename(optim)
    assert same_bits(load_deepspeed_dir(str(tmp_path / "ds"))["w"], torch.ones(2))
    elsewhere = tmp_path / "elsewhere"
    tag.rename(elsewhere)
    tag.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ForeignCheckpointError, match="global_step1 is a symbolic link"):
        load_deepspeed_dir(str(tmp_path / "ds"))
