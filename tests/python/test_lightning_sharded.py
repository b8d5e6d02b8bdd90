# SPDX-License-Identifier: Apache-2.0
"""fastpersist.lightning.FastPersistModelParallelStrategy: Lightning's sharded (FSDP2 through
ModelParallelStrategy) checkpoints saved and loaded through fastpersist's DCP plug-in, with real
Lightning on 2 CPU processes (gloo). A resume is bit-identical, rank by rank, to Lightning's own
strategy training straight through; each checkpoint path is a fastpersist root with one
committed checkpoint; Lightning's own sharded checkpoints still load; bad paths and options are
refused without changing anything. (FSDPStrategy, FSDP1, needs a GPU: torch refuses it on the
CPU, so it is not covered here.)"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning")

from fastpersist import _core  # noqa: E402
from fastpersist.lightning import FastPersistModelParallelStrategy  # noqa: E402

from _test_support import assert_same_state, find_cli  # noqa: E402

CHILD = Path(__file__).resolve().parent / "_lightning_sharded_child.py"


def _run(mode: str, folder: Path) -> list:
    proc = subprocess.run([sys.executable, str(CHILD), mode, str(folder)], capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [torch.load(folder / "out" / f"{mode}-rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Lightning's own strategy for 8 steps straight; fastpersist's for 4 steps, then a resume
    from its last.ckpt to step 8; and fastpersist's resuming from Lightning's own format."""
    folder = tmp_path_factory.mktemp("sharded")
    out = {mode: _run(mode, folder) for mode in
           ("stock", "fp-first", "fp-resume", "stock-first", "fp-resume-stock")}
    return folder, out


def test_a_resume_is_bit_identical_to_an_uninterrupted_run(runs):
    folder, out = runs
    for rank in (0, 1):
        assert out["fp-resume"][rank]["global_step"] == 8
        assert_same_state(out["fp-resume"][rank]["state"], out["stock"][rank]["state"])
    assert out["fp-first"][0]["state"] != {}  # the shards differ by rank: really sharded
    assert not torch.equal(out["fp-first"][0]["state"]["model.net.0.weight"],
                           out["fp-first"][1]["state"]["model.net.0.weight"])


def test_each_checkpoint_path_is_a_root_with_one_committed_checkpoint(runs):
    folder, _ = runs
    last = folder / "ckpt" / "last.ckpt"
    assert last.is_dir()
    assert _core.classify_path(str(last)).kind.name == "ROOT"
    assert _core.latest_checkpoint(str(last)) == "step-00000008"
    tags = sorted(n for n in os.listdir(last) if n.startswith("step-"))
    assert tags == ["step-00000008"]  # the earlier one went after the new commit
    cli = find_cli()
    if cli is not None:
        proc = subprocess.run([cli, "verify", str(last / "step-00000008")], capture_output=True,
                              text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    # The whole state reassembles in one process, Lightning's metadata included.
    from fastpersist.dcp import load_dcp_checkpoint

    whole = load_dcp_checkpoint(str(last))
    assert whole["state_dict"]["net.0.weight"].shape == (256, 32)
    meta = torch.load(io.BytesIO(whole["lightning_metadata"]), weights_only=True)
    assert meta["global_step"] == 8 and "loops" in meta and "state_dict" not in meta


def test_lightnings_own_sharded_checkpoints_still_load(runs):
    _, out = runs
    # stock-first saved 4 steps in Lightning's format; fastpersist's strategy resumed from it
    # and trained to 8: the same bytes as Lightning straight through.
    for rank in (0, 1):
        assert_same_state(out["fp-resume-stock"][rank]["state"], out["stock"][rank]["state"])


def test_model_checkpoint_rotation(tmp_path):
    _run("fp-rotate", tmp_path)
    assert sorted(os.listdir(tmp_path / "rotate")) == ["step=3.ckpt", "step=4.ckpt"]
    for step in (3, 4):
        assert _core.latest_checkpoint(str(tmp_path / "rotate" / f"step={step}.ckpt")) == \
            f"step-{step:08d}"


def test_bad_options_and_paths_are_refused(tmp_path):
    with pytest.raises(TypeError, match="unknown setting"):
        FastPersistModelParallelStrategy(checkpoint_options={"durabel": True})
    with pytest.raises(TypeError, match="keep_last"):
        FastPersistModelParallelStrategy(checkpoint_options={"keep_last": 2})
    with pytest.raises(TypeError, match="must be a dict"):
        FastPersistModelParallelStrategy(checkpoint_options=["durable"])
    from fastpersist.lightning_sharded import _plan_save

    (tmp_path / "file.ckpt").write_bytes(b"x")
    assert _plan_save(tmp_path / "file.ckpt", 3)[:2] == ("error", "NotADirectoryError")
    foreign = tmp_path / "foreign.ckpt"
    foreign.mkdir()
    (foreign / "meta.pt").write_bytes(b"x")  # Lightning's own sharded folder, say
    verdict = _plan_save(foreign, 3)
    assert verdict[:2] == ("error", "FileExistsError") and "left as it is" in verdict[2]
    assert os.listdir(foreign) == ["meta.pt"]
    assert (tmp_path / "file.ckpt").read_bytes() == b"x"
    assert _plan_save(tmp_path / "new.ckpt", 3) == ("tag", "step-00000003")
