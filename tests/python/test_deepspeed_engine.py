# SPDX-License-Identifier: Apache-2.0
"""fastpersist.deepspeed: fastpersist as DeepSpeed's checkpoint engine, with real DeepSpeed
engines trained on the CPU (gloo) in 1 and 2 real processes (tests/python/_deepspeed_engine_child.py
holds the checks each rank runs). Skips when deepspeed is not installed; the option checks at
the end need no engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from _test_support import find_cli

HERE = Path(__file__).resolve().parent
CLI = find_cli()


def run_child(scenario: str, out: Path, stage: int, world: int, *args: Any,
              expect_ok: bool = True) -> subprocess.CompletedProcess:
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed)")
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    proc = subprocess.run([sys.executable, str(HERE / "_deepspeed_engine_child.py"), scenario,
                           str(out), str(stage), str(world), *map(str, args)],
                          capture_output=True, text=True, timeout=900, env=env)
    if expect_ok:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        for rank in range(world):
            assert (out / f"ok-{scenario}-{rank}").is_file(), f"rank {rank} did not finish"
    return proc


ROUNDTRIPS = [(0, 1, False, False), (1, 1, False, False), (2, 1, False, False),
              (3, 1, False, False), (0, 2, False, False), (1, 2, False, True),
              (2, 2, True, False), (3, 2, False, True), (1, 1, True, True)]


@pytest.mark.parametrize("stage,world,bf16,async_save", ROUNDTRIPS,
                         ids=[f"zero{s}-{w}rank-{'bf16' if b else 'fp32'}{'-async' if a else ''}"
                              for s, w, b, a in ROUNDTRIPS])
def test_round_trip(tmp_path: Path, stage: int, world: int, bf16: bool, async_save: bool) -> None:
    """Module, optimizer, scheduler, client state and step come back bit-identical through
    fastpersist; DeepSpeed's own load and zero_to_fp32 read the same tag; async saves commit at
    the next step (while training goes on) or at the explicit wait."""
    run_child("roundtrip", tmp_path, stage, world, int(bf16), int(async_save))
    root = tmp_path / "ckpt"
    if stage in (1, 2) and not bf16:
        ds_to_universal(root / "t1", tmp_path)
    if CLI is not None:
        for tag in ("t1", "t2") if async_save else ("t1",):
            proc = subprocess.run([str(CLI), "verify", str(root / tag)], capture_output=True,
                                  text=True, timeout=300)
            assert proc.returncode == 0, proc.stdout + proc.stderr


def ds_to_universal(tag: Path, tmp_path: Path) -> None:
    """DeepSpeed's ds_to_universal converts our tag; its fp32 weights are the saved ones."""
    import torch

    out = tmp_path / "universal"
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    proc = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                           "--input_folder", str(tag), "--output_folder", str(out)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    reference = torch.load(tmp_path / "reference-module.pt", weights_only=True)
    for name in ("inp.weight", "mid.weight", "out.bias"):
        got = torch.load(out / "zero" / name / "fp32.pt", weights_only=False)["param"]
        assert torch.equal(got.reshape(reference[name].shape), reference[name]), name


KILLS = [(1, 1, 0, "file"), (1, 2, 1, "file"), (2, 2, 0, "commit"), (1, 2, 1, "commit"),
         (3, 2, 0, "after")]


@pytest.mark.parametrize("stage,world,rank,point", KILLS,
                         ids=[f"zero{s}-{w}rank-kill{r}-{p}" for s, w, r, p in KILLS])
def test_sigkill_mid_save_leaves_latest_loadable(tmp_path: Path, stage: int, world: int,
                                                 rank: int, point: str) -> None:
    """SIGKILL of any rank while tag t2 is saved: `latest` names t1 (or t2 once its commit
    returned), and that tag loads, validated, into a fresh engine and equals what was saved."""
    proc = run_child("kill", tmp_path, stage, world, rank, point, expect_ok=False)
    assert proc.returncode != 0  # the killed rank's job fails
    root = tmp_path / "ckpt"
    latest = (root / "latest").read_text()
    assert latest == ("t2\n" if point == "after" else "t1\n"), latest
    if point != "after":
        assert not (root / "t2").exists()
    run_child("resume", tmp_path, stage, world)
    assert (tmp_path / "resumed-0").read_text() == latest.strip()


def test_interpreter_exit_commits_a_pending_async_save(tmp_path: Path) -> None:
    """An async save that no step, wait or load committed is committed at interpreter exit,
    and loads (validated) as it was saved."""
    run_child("exit", tmp_path, 1, 1)
    root = tmp_path / "ckpt"
    assert (root / "latest").read_text() == "t1\n"
    assert (root / "t1" / "manifest.json").is_file()
    run_child("resume", tmp_path, 1, 1)
    assert (tmp_path / "resumed-0").read_text() == "t1"


@pytest.mark.parametrize("stage,world", [(1, 2), (3, 2), (2, 1)])
def test_retention_stock_tags_damage_bad_tags_and_filters(tmp_path: Path, stage: int,
                                                          world: int) -> None:
    """keep_last=2 over our tags (a stock tag stays); DeepSpeed's TorchCheckpointEngine tag
    loads through ours with a warning that it cannot be verified; existing, `..` and `/` tags
    are refused with nothing written; keys/dtype filter a load; a flipped byte makes a
    validated load raise CheckpointCorruptError naming the file on every rank, and
    `fastpersist verify` exit non-zero."""
    run_child("features", tmp_path, stage, world)
    if CLI is not None:
        root = tmp_path / "ckpt"
        bad = subprocess.run([str(CLI), "verify", str(root / "r2")], capture_output=True,
                             text=True, timeout=300)
        assert bad.returncode != 0 and "optim_states.pt" in bad.stdout + bad.stderr, bad.stdout
        good = subprocess.run([str(CLI), "verify", str(root / "r3")], capture_output=True,
                              text=True, timeout=300)
        assert good.returncode == 0, good.stdout + good.stderr
        listed = subprocess.run([str(CLI), "list", str(root)], capture_output=True, text=True,
                                timeout=300)
        assert listed.returncode == 0 and "r3" in listed.stdout, listed.stdout + listed.stderr
        # DeepSpeed's own tag: listed, inspected, and reported as unverifiable (exit 1).
        assert "1 DeepSpeed tag without a fastpersist manifest" in listed.stdout, listed.stdout
        assert "  stock: " in listed.stdout, listed.stdout
        stock = subprocess.run([str(CLI), "verify", str(root / "stock")], capture_output=True,
                               text=True, timeout=300)
        assert stock.returncode == 1 and "UNVERIFIED" in stock.stdout, stock.stdout + stock.stderr
        inspected = subprocess.run([str(CLI), "inspect", str(root / "stock")],
                                   capture_output=True, text=True, timeout=300)
        assert inspected.returncode == 0, inspected.stdout + inspected.stderr
        assert "DeepSpeed tag" in inspected.stdout and "model_states.pt" in inspected.stdout
        whole = subprocess.run([str(CLI), "verify", str(root)], capture_output=True, text=True,
                               timeout=300)
        assert "UNVERIFIED stock" in whole.stdout and "DAMAGED  r2" in whole.stdout, whole.stdout
        (root / "latest").write_text("stock")  # as DeepSpeed's own engine writes it
        listed = subprocess.run([str(CLI), "list", str(root)], capture_output=True, text=True,
                                timeout=300)
        assert "(the `latest` file names it)" in listed.stdout, listed.stdout


SPLITS = [(1, 1, "zstd", False), (2, 2, "lz4", True), (3, 2, "none", False)]


@pytest.mark.parametrize("stage,world,compression,async_save", SPLITS,
                         ids=[f"zero{s}-{w}rank-{c}{'-async' if a else ''}"
                              for s, w, c, a in SPLITS])
def test_compressed_and_incremental_tags(tmp_path: Path, stage: int, world: int,
                                         compression: str, async_save: bool) -> None:
    """Compressed and incremental tags round-trip bit-identical (an unchanged save stores only
    references to its base); `fastpersist verify` checks them; `fastpersist convert` turns one
    back into a plain tag that DeepSpeed's own engine and zero_to_fp32 read."""
    run_child("split", tmp_path, stage, world, compression, int(async_save))
    root = tmp_path / "ckpt"
    plain = tmp_path / "plain" / "s3"
    if CLI is None:
        from fastpersist.convert import convert

        convert(str(root / "s3"), str(plain))
    else:
        for tag in ("s1", "s2", "s3"):
            proc = subprocess.run([str(CLI), "verify", str(root / tag)], capture_output=True,
                                  text=True, timeout=300)
            assert proc.returncode == 0, proc.stdout + proc.stderr
        env = dict(os.environ, FASTPERSIST_PYTHON=sys.executable)
        proc = subprocess.run([str(CLI), "convert", str(root / "s3"), str(plain)],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "plain DeepSpeed tag" in proc.stdout, proc.stdout
        refused = subprocess.run([str(CLI), "convert", str(root / "s3"),
                                  str(tmp_path / "x.safetensors")],
                                 capture_output=True, text=True, timeout=300, env=env)
        assert refused.returncode == 2 and "stored split" in refused.stderr, refused.stderr
        verified = subprocess.run([str(CLI), "verify", str(plain)], capture_output=True,
                                  text=True, timeout=300)
        assert verified.returncode == 0, verified.stdout + verified.stderr
    assert (tmp_path / "plain" / "latest").read_text().strip() == "s3"
    run_child("stock", tmp_path, stage, world, str(plain))


def test_a_flipped_byte_in_a_compressed_tag_is_named(tmp_path: Path) -> None:
    """A damaged data file of a split tag: verify exits non-zero; a validated load raises
    CheckpointCorruptError."""
    run_child("split", tmp_path, 1, 1, "zstd", 0)
    root = tmp_path / "ckpt"
    data = sorted((root / "s3").glob("*.safetensors"))
    assert data, list((root / "s3").iterdir())
    with open(data[0], "r+b") as f:
        f.seek(os.path.getsize(data[0]) - 10)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    if CLI is not None:
        proc = subprocess.run([str(CLI), "verify", str(root / "s3")], capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode != 0, proc.stdout
    run_child("damaged", tmp_path, 1, 1)


# ----------------------------------------------------------------------------- options
def test_options_are_checked_before_anything_runs() -> None:
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed)")
    from fastpersist.deepspeed.settings import EngineSettings, merge_options

    with pytest.raises(ValueError, match="unknown option 'keep_lats'"):
        merge_options({"keep_lats": 3}, None)
    with pytest.raises(ValueError, match="unknown option 'bogus'.*\"fastpersist\" section"):
        merge_options({}, {"fastpersist": {"bogus": 1}})
    with pytest.raises(ValueError, match="'keep_last' is 3 in install.* 5 in the DeepSpeed"):
        merge_options({"keep_last": 3}, {"fastpersist": {"keep_last": 5}})
    with pytest.raises(ValueError, match="'block_size' is 1048576 in the DeepSpeed config's "
                       "\"fastpersist\" section but 2097152 in the DeepSpeed config's \"aio\""):
        merge_options({}, {"fastpersist": {"block_size": 1 << 20}, "aio": {"block_size": 2 << 20}})
    with pytest.raises(ValueError, match="'xor_deltas'.*untyped bytes"):
        merge_options({"xor_deltas": True}, None)
    with pytest.raises(ValueError, match="compression"):
        EngineSettings({"compression": "gzip"})
    assert EngineSettings({"compression": "lz4"}).split
    assert EngineSettings({"incremental": True}).split
    assert not EngineSettings({}).split
    with pytest.raises(ValueError, match="keep_last must be >= 1"):
        EngineSettings(merge_options({"keep_last": 0}, None))
    with pytest.raises(TypeError, match="async_save must be True or False"):
        EngineSettings({"async_save": "yes"})
    with pytest.raises(ValueError, match="io_buffer_mb"):
        EngineSettings({"io_buffer_mb": -1})
    # The config's section and its "aio" knobs are read; the same value twice is fine.
    merged = merge_options({"keep_last": 3}, {"fastpersist": {"keep_last": 3, "async_save": True},
                                              "aio": {"block_size": 1 << 20, "queue_depth": 8}})
    assert merged == {"keep_last": 3, "async_save": True, "block_size": 1 << 20, "queue_depth": 8}
    s = EngineSettings(merged)
    assert s.async_save and s.checkpoint.keep_last == 3 and s.engine.block_size == 1 << 20


def test_install_refuses_what_is_not_a_deepspeed_engine() -> None:
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed)")
    import torch

    import fastpersist.deepspeed as fds

    with pytest.raises(TypeError, match="DeepSpeedEngine.*got Linear"):
        fds.install(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="call fastpersist.deepspeed.install"):
        fds.load_checkpoint(torch.nn.Linear(2, 2), "/nonexistent")
