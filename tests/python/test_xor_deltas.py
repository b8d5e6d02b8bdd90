# SPDX-License-Identifier: Apache-2.0
"""XOR deltas of incremental checkpoints (``xor_deltas=True``) through the Python API and the
CLI: a real full fine-tune (every weight and the Adam state change each step) saved with
save_async writes deltas much smaller than full saves; every checkpoint loads bit-identical
(whole, bounded, into existing tensors), verifies, exports and converts; `convert --materialize`
frees the base; a damaged delta or base is refused, and resume() falls back; bad settings are
refused."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Dict

import pytest
import torch

import fastpersist

from _test_support import find_cli


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def _flat(state: Any, prefix: str = "") -> Dict[str, torch.Tensor]:
    out: Dict[str, torch.Tensor] = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(_flat(v, f"{prefix}{k}."))
    elif isinstance(state, torch.Tensor):
        out[prefix[:-1]] = state
    return out


def _train(steps: int, dtype: torch.dtype = torch.float32):
    """A small MLP fully fine-tuned with AdamW: yields (step, state) after each step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randn(64, 256, dtype=dtype)
    for step in range(1, steps + 1):
        loss = (model(data) - data).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        yield step, {"model": model.state_dict(), "optimizer": opt.state_dict()}


def _model_stored_bytes(ckpt: Path) -> int:
    m = json.loads((ckpt / "manifest.json").read_text())
    return sum(t["stored_length"] for t in m["tensors"] if t["name"].startswith("model."))


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_full_fine_tune_writes_small_deltas_that_load_bit_identical(tmp_path: Path, compression) -> None:
    plain, deltas = tmp_path / "plain", tmp_path / "deltas"
    expected: Dict[int, Dict[str, torch.Tensor]] = {}
    with fastpersist.CheckpointManager(plain, incremental=True, compression=compression, durable=False) as a, \
         fastpersist.CheckpointManager(deltas, incremental=True, xor_deltas=True, compression=compression,
                                       durable=False) as b:
        handles = []
        for step, state in _train(4):
            expected[step] = {k: v.clone() for k, v in _flat(state).items()}
            a.save(step, state)
            handles.append(b.save_async(step, state))
            handles[-1].wait()  # the state changes at the next step
        # Without deltas every weight changed: each save is full. With them, the second saves
        # deltas against the first; those take about two thirds of a full save (Adam's moments
        # move by more than the weights), more than half, so the third is a fresh base, and the
        # fourth a delta against it.
        assert [c.references for c in a.checkpoints()] == [()] * 4
        assert [h.base for h in handles] == [None, "step-00000001", None, "step-00000003"]
        for step in (2, 4):
            tag = f"step-{step:08d}"
            m = json.loads((deltas / tag / "manifest.json").read_text())
            encodings = {t["name"]: t["encoding"] for t in m["tensors"]}
            assert encodings["model.0.weight"] == "xor-zstd", encodings
            assert encodings["model.2.weight"] == "xor-zstd", encodings
            # The weights moved by one small step: their deltas are much smaller than the
            # weights stored alone, raw (about 0.6x) or compressed (about 0.7x).
            assert _model_stored_bytes(deltas / tag) < 0.8 * _model_stored_bytes(plain / tag), step
        for step in (1, 2, 3, 4):
            for max_memory in (None, 256 << 10):
                loaded = _flat(b.load(step, max_memory=max_memory))
                for name, want in expected[step].items():
                    assert _same(loaded[name], want), (step, name)
            assert b.verify(step) == []
        # Into existing tensors, in place.
        into = {k: torch.empty_like(v) for k, v in expected[4].items() if k.startswith("model.")}
        nested = {"model": {k[len("model."):]: v for k, v in into.items()}}
        b.load(4, into=nested, keys=lambda name: name.startswith("model."))
        for k, v in into.items():
            assert _same(v, expected[4][k]), k


def test_bf16_weights_gain_more_and_export_and_convert_follow_the_base(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from fastpersist.convert import convert

    with fastpersist.CheckpointManager(tmp_path / "ckpt", incremental=True, xor_deltas=True, durable=False) as mgr:
        last: Dict[str, torch.Tensor] = {}
        for step, state in _train(2, torch.bfloat16):
            mgr.save(step, {"model": state["model"]})
            last = {k: v.clone() for k, v in state["model"].items()}
        m = json.loads((tmp_path / "ckpt" / "step-00000002" / "manifest.json").read_text())
        w = next(t for t in m["tensors"] if t["name"] == "model.0.weight")
        assert w["encoding"] == "xor-zstd" and w["stored_length"] * 2 < w["length"], w
        files = mgr.export_hf(2, tmp_path / "hf")
    exported: Dict[str, torch.Tensor] = {}
    for f in files:
        if f.endswith(".safetensors"):
            exported.update(load_file(str(tmp_path / "hf" / f)))
    for k, v in last.items():
        assert _same(exported[k], v), k
    convert(str(tmp_path / "ckpt" / "step-00000002"), str(tmp_path / "flat.safetensors"))
    flat = load_file(str(tmp_path / "flat.safetensors"))
    for k, v in last.items():
        assert _same(flat[f"model.{k}"], v), k


def test_damage_in_a_delta_or_its_base_is_refused_and_resume_falls_back(tmp_path: Path) -> None:
    with fastpersist.CheckpointManager(tmp_path, incremental=True, xor_deltas=True, durable=False) as mgr:
        states = {}
        for step, state in _train(4):
            mgr.save(step, state)
            states[step] = {k: v.clone() for k, v in _flat(state).items()}
    m = json.loads((tmp_path / "step-00000004" / "manifest.json").read_text())
    t = next(t for t in m["tensors"] if t["name"] == "model.2.weight")
    assert t["encoding"] == "xor-zstd"
    base = tmp_path / t["delta_base"]["file"]
    at = t["delta_base"]["offset"] + t["delta_base"]["stored_length"] // 2
    data = bytearray(base.read_bytes())
    data[at] ^= 0x10
    base.write_bytes(bytes(data))
    with fastpersist.CheckpointManager(tmp_path, incremental=True, xor_deltas=True, durable=False) as mgr:
        problems = mgr.verify(4)
        assert any("model.2.weight" in p for p in problems), problems
        with pytest.raises(fastpersist.CheckpointCorruptError, match="model.2.weight"):
            mgr.load(4)
    # Repaired; now a damaged delta frame in step 4: resume() skips it for step 3.
    data[at] ^= 0x10
    base.write_bytes(bytes(data))
    own = tmp_path / "step-00000004" / t["file"]
    data = bytearray(own.read_bytes())
    data[t["offset"] + 20] ^= 0x01
    own.write_bytes(bytes(data))
    with fastpersist.CheckpointManager(tmp_path, incremental=True, xor_deltas=True, durable=False) as mgr:
        with pytest.raises(fastpersist.CheckpointCorruptError, match="model.2.weight"):
            mgr.load(4)
        with pytest.warns(UserWarning, match="model.2.weight"):
            tag, state = mgr.resume()
        assert tag == "step-00000003"  # the base itself, intact
        for name, want in states[3].items():
            assert _same(_flat(state)[name], want), name


@pytest.mark.skipif(find_cli() is None, reason="the fastpersist CLI is not built")
def test_cli_inspect_verify_and_materialize(tmp_path: Path) -> None:
    cli = find_cli()
    assert cli is not None
    with fastpersist.CheckpointManager(tmp_path, incremental=True, xor_deltas=True, durable=False) as mgr:
        for step, state in _train(2):
            mgr.save(step, state)
    ckpt = tmp_path / "step-00000002"
    inspect = subprocess.run([cli, "inspect", str(ckpt)], capture_output=True, text=True)
    assert inspect.returncode == 0, inspect.stderr
    assert "xor-zstd" in inspect.stdout, inspect.stdout
    verify = subprocess.run([cli, "verify", str(ckpt)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    materialize = subprocess.run([cli, "convert", "--materialize", str(ckpt)], capture_output=True, text=True)
    assert materialize.returncode == 0, materialize.stdout + materialize.stderr
    with fastpersist.CheckpointManager(tmp_path, incremental=True, durable=False) as mgr:
        assert mgr.checkpoints()[1].references == ()
        mgr.remove(1)
        assert mgr.verify(2) == []
        mgr.load(2)


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="xor_deltas needs incremental"):
        fastpersist.CheckpointManager(tmp_path / "a", xor_deltas=True)
    with pytest.raises(TypeError, match="xor_deltas"):
        fastpersist.CheckpointManager(tmp_path / "b", incremental=True, xor_deltas="yes")  # type: ignore[arg-type]
