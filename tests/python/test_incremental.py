# SPDX-License-Identifier: Apache-2.0
"""Incremental checkpoints through the Python API and the CLI: every dtype round-trips
bit-identical with each codec when the unchanged tensors are references (whole, selected,
bounded, into existing tensors), a real fine-tune with frozen embeddings and save_async writes
only what changed, retention and remove keep a referenced base, `prune --dry-run` says why,
`list` shows the base, `convert --materialize` makes a checkpoint standalone, export_hf and
convert follow the references, and bad settings are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
import torch

import fastpersist
from fastpersist.checkpoint_state import DTYPE_TO_SAFETENSORS

from _test_support import find_cli

CODECS = [None, "zstd", "lz4"]


def _tensor(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) < 0.3
    if dtype.is_complex:
        return torch.randn(n, 2, generator=g).contiguous().view(dtype).reshape(-1)
    if dtype.is_floating_point and dtype.itemsize >= 2:
        return (torch.randn(n, generator=g) * 0.02).to(dtype)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 0.5).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -100), min(info.max, 100), (n,), generator=g,
                         dtype=torch.int64).to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def _manifest(ckpt: Path) -> Dict[str, Any]:
    return json.loads((ckpt / "manifest.json").read_text())


def _frozen_and_trained(seed: int) -> Dict[str, Any]:
    """Every dtype frozen (the bulk), plus a small trained adapter."""
    frozen = {str(dtype).split(".")[-1]: _tensor(50_001 + k, dtype, k)
              for k, dtype in enumerate(DTYPE_TO_SAFETENSORS)}
    return {"frozen": frozen, "adapter": _tensor(4096, torch.float32, 1000 + seed),
            "step": seed, "empty": torch.zeros(0, 4)}


@pytest.mark.parametrize("codec", CODECS)
def test_every_dtype_round_trips_with_references(tmp_path: Path, codec: Optional[str]) -> None:
    with fastpersist.CheckpointManager(tmp_path, incremental=True, compression=codec, durable=False) as mgr:
        first = _frozen_and_trained(1)
        assert mgr.save_async(1, first).wait() and mgr.checkpoints()[0].references == ()
        second = _frozen_and_trained(2)
        handle = mgr.save_async(2, second)
        handle.wait()
        assert handle.base == "step-00000001"
        assert handle.referenced_bytes > 0
        info = mgr.checkpoints()[1]
        assert info.references == ("step-00000001",) and info.incremental
        assert info.own_bytes < info.total_bytes / 4
        refs = {t["name"]: t["file"] for t in _manifest(tmp_path / "step-00000002")["tensors"]}
        assert all(f.startswith("step-00000001/") for n, f in refs.items() if n.startswith("frozen."))
        assert not refs["adapter"].startswith("step-00000001/")
        for tag, state in ((1, first), (2, second)):
            loaded = mgr.load(tag)
            for name, t in state["frozen"].items():
                assert _same(loaded["frozen"][name], t), (tag, name)
            assert _same(loaded["adapter"], state["adapter"]) and loaded["step"] == state["step"]
            assert mgr.verify(tag) == []
        part = mgr.load(2, keys=["frozen.float32", "adapter"], max_memory="64KiB")
        assert _same(part["frozen"]["float32"], second["frozen"]["float32"])
        into = {"frozen": {"bfloat16": torch.empty_like(second["frozen"]["bfloat16"])}}
        mgr.load(2, into=into, keys=["frozen.bfloat16"])
        assert _same(into["frozen"]["bfloat16"], second["frozen"]["bfloat16"])


def test_frozen_embedding_fine_tune_with_save_async_writes_only_the_adapter(tmp_path: Path) -> None:
    torch.manual_seed(0)
    embed = torch.nn.Embedding(4000, 128)
    embed.weight.requires_grad_(False)
    adapter = torch.nn.Linear(128, 8, bias=False)
    opt = torch.optim.AdamW(adapter.parameters(), lr=1e-2)
    with fastpersist.CheckpointManager(tmp_path, incremental=True, full_every=5, keep_last=2) as mgr:
        mgr.hook_optimizer(opt)
        handles, expected = [], {}
        for step in range(1, 9):
            x = torch.randint(0, 4000, (32,))
            loss = adapter(embed(x)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()  # waits for the previous snapshot by itself
            state = {"embed": embed.state_dict(), "adapter": adapter.state_dict(), "opt": opt.state_dict()}
            expected[step] = {k: v.clone() for k, v in adapter.state_dict().items()}
            handles.append(mgr.save_async(step, state))
        mgr.wait()
        bases = [h.base for h in handles]
        # Full at 1 and 6 (full_every 5); the others reference the last full one.
        assert bases == [None, "step-00000001", "step-00000001", "step-00000001", "step-00000001",
                         None, "step-00000006", "step-00000006"], bases
        embed_bytes = embed.weight.numel() * 4
        assert handles[2].referenced_bytes >= embed_bytes
        assert handles[2].bytes < embed_bytes / 4
        # keep_last 2 keeps 7 and 8, and their base 6; 1..5 are gone.
        assert mgr.list() == ["step-00000006", "step-00000007", "step-00000008"]
        for step in (6, 7, 8):
            loaded = mgr.load(step)
            assert _same(loaded["embed"]["weight"], embed.weight)
            assert _same(loaded["adapter"]["weight"], expected[step]["weight"])


def test_remove_of_a_referenced_base_is_refused_and_materialize_frees_it(tmp_path: Path) -> None:
    with fastpersist.CheckpointManager(tmp_path, incremental=True, durable=False) as mgr:
        mgr.save(1, _frozen_and_trained(1))
        second = _frozen_and_trained(2)
        mgr.save(2, second)
        with pytest.raises(ValueError, match="base of incremental checkpoint"):
            mgr.remove(1)
        assert mgr.list() == ["step-00000001", "step-00000002"]
        assert mgr.prune(keep_last=1) == []  # kept: the base of the newest
        assert mgr.materialize(2) > 0
        assert mgr.checkpoints()[1].references == ()
        assert mgr.materialize("latest") == 0
        mgr.remove(1)
        loaded = mgr.load(2)
        assert _same(loaded["frozen"]["float32"], second["frozen"]["float32"]) and mgr.verify(2) == []


def test_convert_and_export_follow_references(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from fastpersist.convert import convert

    w = _tensor(1 << 16, torch.float32, 3)
    with fastpersist.CheckpointManager(tmp_path / "ckpt", incremental=True, durable=False) as mgr:
        mgr.save(1, {"model": {"w": w, "b": torch.zeros(10)}})
        mgr.save(2, {"model": {"w": w, "b": torch.ones(10)}})
        assert mgr.checkpoints()[1].references
        files = mgr.export_hf(2, tmp_path / "hf")
    exported = {}
    for f in files:
        if f.endswith(".safetensors"):
            exported.update(load_file(str(tmp_path / "hf" / f)))
    assert _same(exported["w"], w) and _same(exported["b"], torch.ones(10))
    convert(str(tmp_path / "ckpt" / "step-00000002"), str(tmp_path / "flat.safetensors"))
    flat = load_file(str(tmp_path / "flat.safetensors"))
    assert _same(flat["model.w"], w) and _same(flat["model.b"], torch.ones(10))


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="full_every"):
        fastpersist.CheckpointManager(tmp_path / "a", incremental=True, full_every=0)
    with pytest.raises(TypeError, match="incremental"):
        fastpersist.CheckpointManager(tmp_path / "b", incremental="yes")  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError), match="full_every"):
        fastpersist.CheckpointManager(tmp_path / "c", incremental=True, full_every=1.5)  # type: ignore[arg-type]


@pytest.mark.skipif(find_cli() is None, reason="the fastpersist CLI is not built")
def test_cli_list_prune_dry_run_verify_and_materialize(tmp_path: Path) -> None:
    cli = find_cli()
    assert cli is not None
    with fastpersist.CheckpointManager(tmp_path, incremental=True, durable=False) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, _frozen_and_trained(step))

    def run(*args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, FASTPERSIST_PYTHON=sys.executable)
        return subprocess.run([cli, *args], capture_output=True, text=True, timeout=300, env=env)

    r = run("list", str(tmp_path))
    assert r.returncode == 0 and "BASE" in r.stdout, r.stdout
    assert any(line.split()[-1] == "step-00000001" for line in r.stdout.splitlines()
               if "step-00000003" in line), r.stdout
    listed = json.loads(run("list", str(tmp_path), "--json").stdout)["checkpoints"]
    assert listed[2]["references"] == ["step-00000001"] and listed[0]["references"] == []
    assert listed[2]["own_bytes"] < listed[2]["total_bytes"]
    r = run("prune", str(tmp_path), "--keep-last", "1", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "would remove step-00000002" in r.stdout, r.stdout
    assert "keep step-00000001: the base of step-00000003 (incremental, kept)" in r.stdout, r.stdout
    assert "keep step-00000003: the newest" in r.stdout, r.stdout
    j = json.loads(run("prune", str(tmp_path), "--keep-last", "1", "--dry-run", "--json").stdout)
    assert j["removed"] == ["step-00000002"] and "base of" in j["kept_because"]["step-00000001"]
    r = run("verify", str(tmp_path / "step-00000003"))
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("inspect", str(tmp_path / "step-00000003"))
    assert r.returncode == 0 and "base ..." in r.stdout and "step-00000001:" in r.stdout, r.stdout
    refs = json.loads(run("inspect", str(tmp_path / "step-00000003"), "--json").stdout)["references"]
    assert list(refs) == ["step-00000001"] and refs["step-00000001"]["bytes"] > 0
    r = run("convert", "--materialize", str(tmp_path / "step-00000003"))
    assert r.returncode == 0 and "materialized" in r.stdout and "step-00000001" in r.stdout, r.stdout + r.stderr
    r = run("convert", "--materialize", str(tmp_path / "step-00000003"))
    assert r.returncode == 0 and "standalone already" in r.stdout, r.stdout
    r = run("convert", "--materialize", str(tmp_path / "step-00000003"), str(tmp_path / "x"))
    assert r.returncode == 2 and "in place" in r.stderr, r.stderr
    r = run("convert", "--materialize", str(tmp_path))
    assert r.returncode == 2, r.stderr
    r = run("prune", str(tmp_path), "--keep-last", "1")
    assert r.returncode == 0, r.stderr
    # step-00000002 still references step-00000001 until it goes; now only 3 remains.
    assert json.loads(run("list", str(tmp_path), "--json").stdout)["checkpoints"][-1]["tag"] == "step-00000003"
    with fastpersist.CheckpointManager(tmp_path) as mgr:
        assert mgr.list() == ["step-00000003"]
        assert _same(mgr.load()["frozen"]["float32"], _frozen_and_trained(3)["frozen"]["float32"])


def test_python_convert_takes_the_clis_command_line_with_materialize(tmp_path: Path) -> None:
    # `python -m fastpersist.convert` parses with the CLI's parser, so --materialize works there
    # too (run by the C++ command in this process) and breaks the same rules.
    with fastpersist.CheckpointManager(tmp_path, incremental=True, durable=False) as mgr:
        for step in (1, 2):
            mgr.save(step, _frozen_and_trained(step))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fastpersist.convert", *args],
                              capture_output=True, text=True, timeout=300)

    ckpt = str(tmp_path / "step-00000002")
    r = run("--materialize", ckpt, str(tmp_path / "x"))
    assert r.returncode == 2, r.stderr
    assert "python -m fastpersist.convert: error: --materialize works in place" in r.stderr, r.stderr
    r = run("--materialize", ckpt)
    assert r.returncode == 0 and "materialized" in r.stdout and "step-00000001" in r.stdout, r.stdout + r.stderr
    with fastpersist.CheckpointManager(tmp_path) as mgr:
        assert mgr.materialize(2) == 0  # standalone now
        torch.testing.assert_close(mgr.load(2), _frozen_and_trained(2))


def test_a_missing_or_damaged_base_is_reported_and_resume_falls_back(tmp_path: Path) -> None:
    import shutil

    with fastpersist.CheckpointManager(tmp_path, incremental=True, full_every=2, durable=False) as mgr:
        mgr.save(1, _frozen_and_trained(1))   # full: base of 2
        mgr.save(2, _frozen_and_trained(2))   # references 1
        mgr.save(3, _frozen_and_trained(3))   # full again (full_every 2)
        mgr.save(4, _frozen_and_trained(4))   # references 3
        assert [c.references for c in mgr.checkpoints()] == [(), ("step-00000001",), (), ("step-00000003",)]
    ref = next(t for t in _manifest(tmp_path / "step-00000004")["tensors"] if t["name"] == "frozen.float32")
    assert ref["file"].startswith("step-00000003/")
    # A flipped byte in the base: the incremental checkpoint that uses it is corrupt, by name.
    path = tmp_path / ref["file"]
    with open(path, "r+b") as f:
        f.seek(ref["offset"] + 5)
        b = f.read(1)
        f.seek(ref["offset"] + 5)
        f.write(bytes([b[0] ^ 0x40]))
    with fastpersist.CheckpointManager(tmp_path) as mgr:
        assert any("frozen.float32" in p for p in mgr.verify(4))
        with pytest.raises(fastpersist.CheckpointCorruptError, match="frozen.float32"):
            mgr.load(4)
        # resume() takes the newest checkpoint that verifies: 2 (its base, 1, is intact).
        with pytest.warns(UserWarning, match="skipping damaged checkpoint step-00000004"):
            tag, state = mgr.resume()
        assert tag == "step-00000002" and state["step"] == 2
    # The base removed behind the manager's back: 3 and 4 leave the listing (4 as damaged).
    shutil.rmtree(tmp_path / "step-00000003")
    with fastpersist.CheckpointManager(tmp_path) as mgr:
        assert mgr.list() == ["step-00000001", "step-00000002"]
        with pytest.warns(UserWarning, match="refers to checkpoint 'step-00000003', which is not in the root"):
            assert mgr.resume()[0] == "step-00000002"
