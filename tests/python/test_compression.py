# SPDX-License-Identifier: Apache-2.0
"""Compressed checkpoints through the Python API and the CLI: every dtype with each codec loads
bit-identical (whole, selected, bounded, into existing tensors, converted), save_async keeps
working, `inspect` shows encodings and ratios, `convert` compresses and decompresses, data files
stay valid safetensors, a damaged chunk is CheckpointCorruptError naming the tensor, and bad
settings are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import fastpersist
from fastpersist.checkpoint_state import DTYPE_TO_SAFETENSORS

from _test_support import find_cli

CODECS = ["zstd", "lz4"]


def _weights(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point and dtype.itemsize >= 2:
        return (torch.randn(n, generator=g) * 0.02).to(dtype)
    if dtype.is_complex:
        return (torch.randn(n, 2, generator=g) * 0.02).contiguous().view(dtype).reshape(-1)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) < 0.1
    if dtype.is_floating_point:  # the 1-byte float8 types
        return (torch.randn(n, generator=g) * 0.5).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -100), min(info.max, 100), (n,), generator=g, dtype=torch.int64).to(dtype)


def _state() -> dict:
    state = {}
    for k, dtype in enumerate(DTYPE_TO_SAFETENSORS):
        state[f"t.{str(dtype).split('.')[-1]}"] = _weights(70_001 + k, dtype, k)
    state["big"] = _weights(3 << 20, torch.bfloat16, 99)  # 6 MiB: two 4 MiB chunks
    state["noise"] = torch.randint(-(1 << 31), (1 << 31) - 1, (40_000,), dtype=torch.int64).to(torch.int32)
    state["small"] = torch.arange(10, dtype=torch.float32)
    state["empty"] = torch.zeros(0, 3)
    state["nested"] = {"step": 7, "lr": 0.1}
    return state


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (NaNs and signed zeros included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


@pytest.mark.parametrize("codec", CODECS)
def test_every_dtype_round_trips_bit_identical(tmp_path: Path, codec: str) -> None:
    state = _state()
    with fastpersist.CheckpointManager(tmp_path, compression=codec, durable=False) as mgr:
        mgr.save(1, state)
        loaded = mgr.load()
        for name, t in state.items():
            if isinstance(t, torch.Tensor):
                assert _same(loaded[name], t), name
        assert loaded["nested"] == state["nested"]
        assert mgr.verify(1) == []
        # Selected, bounded, and into existing tensors (of the stored dtype, and converted).
        part = mgr.load(keys=["big", "t.float32"], max_memory="1MiB")
        assert _same(part["big"], state["big"]) and _same(part["t.float32"], state["t.float32"])
        into = {"big": torch.empty_like(state["big"]), "t.float16": torch.empty(70_001 + 2, dtype=torch.float32)}
        mgr.load(into=into, keys=list(into))
        assert _same(into["big"], state["big"])
        assert torch.equal(into["t.float16"], state["t.float16"].to(torch.float32))
    encodings = {t["name"]: t["encoding"] for t in _manifest(tmp_path / mgr.latest())["tensors"]}
    assert encodings["big"] == codec and encodings["t.float32"] == codec
    assert encodings["noise"] == "raw" and encodings["small"] == "raw" and encodings["empty"] == "raw"


def test_compressed_is_smaller_and_data_files_stay_safetensors(tmp_path: Path) -> None:
    state = {"w": _weights(1 << 21, torch.bfloat16, 1), "v": _weights(1 << 20, torch.float32, 2)}
    with fastpersist.CheckpointManager(tmp_path / "raw", durable=False) as raw, \
            fastpersist.CheckpointManager(tmp_path / "z", compression="zstd", durable=False) as z:
        raw.save(1, state)
        z.save(1, state)
    raw_bytes = sum(t["stored_length"] for t in _manifest(tmp_path / "raw" / "step-00000001")["tensors"])
    z_tensors = _manifest(tmp_path / "z" / "step-00000001")["tensors"]
    assert sum(t["stored_length"] for t in z_tensors) < raw_bytes / 1.2
    for f in (tmp_path / "z" / "step-00000001").glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            assert st.metadata()["fastpersist.encoding"] == "zstd"
            for name in st.keys():
                stored = st.get_tensor(name)  # the encoded bytes, as U8
                assert stored.dtype == torch.uint8 and stored.dim() == 1
    for f in (tmp_path / "raw" / "step-00000001").glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            assert "fastpersist.encoding" not in (st.metadata() or {})


def test_save_async_with_compression(tmp_path: Path) -> None:
    state = {"w": _weights(1 << 20, torch.float32, 3)}
    expected = state["w"].clone()
    with fastpersist.CheckpointManager(tmp_path, compression="lz4", durable=False) as mgr:
        handle = mgr.save_async(1, state)
        handle.wait_snapshot()
        state["w"].zero_()  # after the snapshot: the checkpoint keeps the old values
        handle.wait()
        assert _same(mgr.load()["w"], expected)


def test_damaged_chunk_is_corrupt_error_naming_the_tensor(tmp_path: Path) -> None:
    state = {"w": _weights(1 << 20, torch.float32, 4)}
    with fastpersist.CheckpointManager(tmp_path, compression="zstd", durable=False) as mgr:
        mgr.save(1, state)
    t = next(t for t in _manifest(tmp_path / "step-00000001")["tensors"] if t["name"] == "w")
    assert t["encoding"] == "zstd"
    path = tmp_path / "step-00000001" / t["file"]
    with open(path, "r+b") as f:
        f.seek(t["offset"] + t["stored_length"] // 3)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x10]))
    with fastpersist.CheckpointManager(tmp_path) as mgr:
        for verify in (True, False):
            with pytest.raises(fastpersist.CheckpointCorruptError, match="tensor 'w'"):
                mgr.load(verify=verify)
        problems = mgr.verify(1)
        assert any("tensor 'w'" in p for p in problems), problems


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="none, zstd or lz4"):
        fastpersist.CheckpointManager(tmp_path / "a", compression="gzip")
    with pytest.raises(TypeError, match="compression"):
        fastpersist.CheckpointManager(tmp_path / "b", compression=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="zstd compression level"):
        fastpersist.CheckpointManager(tmp_path / "c", compression="zstd", compression_level=99)
    with pytest.raises(ValueError, match="lz4 compression level"):
        fastpersist.CheckpointManager(tmp_path / "d", compression="lz4", compression_level=-1)
    with pytest.raises(TypeError, match="compression_level"):
        fastpersist.CheckpointManager(tmp_path / "e", compression="zstd", compression_level=1.5)  # type: ignore[arg-type]
    for bad in ("2", True, -1):
        with pytest.raises((TypeError, ValueError), match="compression_threads"):
            fastpersist.CheckpointManager(tmp_path / "f", compression="zstd", compression_threads=bad)  # type: ignore[arg-type]


@pytest.mark.skipif(find_cli() is None, reason="the fastpersist CLI is not built")
def test_cli_inspect_and_convert_compress_and_decompress(tmp_path: Path) -> None:
    cli = find_cli()
    assert cli is not None
    state = {"w": _weights(1 << 20, torch.bfloat16, 5),
             "noise": torch.randint(0, 1 << 30, (50_000,), dtype=torch.int32)}
    with fastpersist.CheckpointManager(tmp_path / "src", durable=False) as mgr:
        mgr.save(1, state)

    def run(*args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, FASTPERSIST_PYTHON=sys.executable)
        return subprocess.run([cli, *args], capture_output=True, text=True, timeout=300, env=env)

    r = run("convert", str(tmp_path / "src" / "step-00000001"), str(tmp_path / "z"), "--tag", "c",
            "--compression", "zstd", "--compression-level", "3", "--no-progress")
    assert r.returncode == 0, r.stderr
    r = run("inspect", str(tmp_path / "z" / "c"), "--json", "--tensors")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    by_name = {t["name"]: t for t in info["tensors"]}
    assert by_name["w"]["encoding"] == "zstd" and by_name["w"]["ratio"] > 1.2
    assert by_name["noise"]["encoding"] == "raw" and by_name["noise"]["ratio"] == 1.0
    assert info["encodings"]["zstd"]["tensors"] == 1 and info["compression_ratio"] > 1.1
    r = run("inspect", str(tmp_path / "z" / "c"), "--tensors")
    assert r.returncode == 0 and "zstd" in r.stdout and "ENCODING" in r.stdout, r.stdout
    r = run("verify", str(tmp_path / "z" / "c"))
    assert r.returncode == 0, r.stdout + r.stderr
    # Decompress: back to plain safetensors files that any reader takes.
    r = run("convert", str(tmp_path / "z" / "c"), str(tmp_path / "plain"), "--tag", "p",
            "--compression", "none", "--no-progress")
    assert r.returncode == 0, r.stderr
    plain = tmp_path / "plain" / "p"
    assert {t["encoding"] for t in _manifest(plain)["tensors"]} == {"raw"}
    loaded = fastpersist.CheckpointManager(tmp_path / "plain").load()
    assert _same(loaded["w"], state["w"]) and _same(loaded["noise"], state["noise"])
    with safe_open(str(next(plain.glob("*.safetensors"))), framework="pt") as st:
        assert any(_same(st.get_tensor(k), state[k]) for k in st.keys())
    r = run("convert", str(tmp_path / "z" / "c"), str(tmp_path / "x.safetensors"), "--compression", "zstd")
    assert r.returncode == 2 and "checkpoint DST only" in r.stderr, r.stderr
    r = run("convert", str(tmp_path / "z" / "c"), str(tmp_path / "y"), "--tag", "y", "--compression", "gzip")
    assert r.returncode != 0
    # A level without a codec says nothing: refused, not ignored.
    r = run("convert", str(tmp_path / "z" / "c"), str(tmp_path / "y"), "--tag", "l",
            "--compression-level", "99", "--no-progress")
    assert r.returncode == 2 and "without a compression codec" in r.stderr, r.stderr
    assert not (tmp_path / "y" / "l").exists()


@pytest.mark.parametrize("codec", CODECS)
def test_another_tool_reads_the_stored_bytes(tmp_path: Path, codec: str) -> None:
    """What docs/format.md promises: the stored bytes are standard frames plus a skippable
    table, so the codec's own command-line tool decodes them, and undoing the byte grouping
    chunk by chunk gives the tensor."""
    import numpy as np
    import shutil as sh
    import struct

    tool = sh.which(codec)
    if tool is None:
        pytest.skip(f"the {codec} command-line tool is not installed")
    w = _weights(3 << 20, torch.bfloat16, 6)  # 6 MiB: a full chunk and a shorter one
    with fastpersist.CheckpointManager(tmp_path, compression=codec, durable=False) as mgr:
        mgr.save(1, {"w": w})
    t = next(t for t in _manifest(tmp_path / "step-00000001")["tensors"] if t["name"] == "w")
    with safe_open(str(tmp_path / "step-00000001" / t["file"]), framework="np") as st:
        stored = st.get_tensor("w").tobytes()
    assert len(stored) == t["stored_length"]
    grouped = subprocess.run([tool, "-dc"], input=stored, capture_output=True, timeout=120, check=True).stdout
    chunk_bytes, n, width = struct.unpack_from("<IIB", stored, len(stored) - 16)
    assert (n, width) == (2, 2) and len(grouped) == t["length"]
    raw = bytearray()
    for k in range(n):
        g = np.frombuffer(grouped[k * chunk_bytes:(k + 1) * chunk_bytes], dtype=np.uint8)
        raw += g.reshape(width, -1).T.tobytes()
    assert bytes(raw) == w.view(torch.uint8).numpy().tobytes()


def test_export_hf_decodes_compressed_checkpoints(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    state = {"model": {"w": _weights(1 << 20, torch.bfloat16, 7), "b": torch.zeros(10)}}
    with fastpersist.CheckpointManager(tmp_path / "ckpt", compression="zstd", durable=False) as mgr:
        mgr.save(1, state)
        files = mgr.export_hf(1, tmp_path / "hf")
    exported = {}
    for f in files:
        if f.endswith(".safetensors"):
            exported.update(load_file(str(tmp_path / "hf" / f)))
    assert _same(exported["w"], state["model"]["w"]) and _same(exported["b"], state["model"]["b"])


def test_dcp_writer_compresses_and_reader_decodes(tmp_path: Path) -> None:
    """FastPersistWriter takes the data-file settings, compression included (every rank's
    ShardWriter compresses); FastPersistReader decodes through CheckpointReader.load."""
    import torch.distributed.checkpoint as dist_cp

    from fastpersist.dcp import FastPersistReader, FastPersistWriter

    state = {"w": _weights(1 << 20, torch.bfloat16, 8), "v": _weights(70_001, torch.float32, 9)}
    dist_cp.save(state, storage_writer=FastPersistWriter(tmp_path / "ckpt", compression="zstd", durable=False))
    encodings = {t["name"]: t["encoding"] for t in _manifest(tmp_path / "ckpt")["tensors"]}
    assert "zstd" in encodings.values(), encodings
    loaded = {k: torch.empty_like(v) for k, v in state.items()}
    dist_cp.load(loaded, storage_reader=FastPersistReader(tmp_path / "ckpt"))
    for k in state:
        assert _same(loaded[k], state[k]), k
