# SPDX-License-Identifier: Apache-2.0
"""Interoperability with the real safetensors library and transformers: checkpoint data files
and save_safetensors output load with safetensors, files safetensors wrote load with
load_safetensors, and export_hf folders load with from_pretrained."""

from __future__ import annotations

import json
import os
import struct
from typing import Dict

import pytest
import torch

import fastpersist
from fastpersist.checkpoint_state import DTYPE_TO_SAFETENSORS
from _checkpoint_models import (assert_tensor_equal, batch, data_files, every_dtype_state, logits,
                                manifest, tiny_gpt2, trained_gpt2, training_state)
from _checkpoint_models import numpy_rng_state_allowed  # noqa: F401 - a fixture

# training_state() holds numpy's RNG state, which weights_only=True loads once registered (as
# torch.load does).
pytestmark = pytest.mark.usefixtures("numpy_rng_state_allowed")

st_torch = pytest.importorskip("safetensors.torch")
safetensors = pytest.importorskip("safetensors")


def _header(path) -> tuple:
    """(header length N, header dict) of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return n, json.loads(f.read(n))


def _contiguous(tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in tensors.items()}


# ----------------------------------------------------------- checkpoint data files
def test_checkpoint_data_files_load_with_safetensors(tmp_path):
    state = {"model": {f"w{i}": torch.randn(4096) for i in range(12)}, "d": every_dtype_state(),
             "tied": {"a": torch.ones(3)}, "step": 4}
    state["tied"]["b"] = state["tied"]["a"]
    with fastpersist.CheckpointManager(tmp_path, durable=False, target_file_size="32KiB") as m:
        tag = m.save(1, state)
        ckpt = m.path(tag)
    files = data_files(ckpt)
    assert len(files) > 1
    flat = {f"model.{k}": v for k, v in state["model"].items()}
    flat.update({f"d.{k}": v for k, v in state["d"].items()})
    flat["tied.a"] = state["tied"]["a"]
    seen: Dict[str, torch.Tensor] = {}
    for name in files:
        path = os.path.join(ckpt, name)
        loaded = st_torch.load_file(path)
        assert not set(loaded) & set(seen)
        seen.update(loaded)
        with safetensors.safe_open(path, framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            assert set(f.keys()) == set(loaded)
        n, header = _header(path)
        assert (8 + n) % 4096 == 0
        for key, entry in header.items():
            if key != "__metadata__":
                itemsize = flat[key].element_size()
                assert entry["data_offsets"][0] % itemsize == 0, key
    # Every stored tensor exactly once (the alias is stored once), equal to the original.
    assert set(seen) == set(flat)
    for key, t in flat.items():
        assert_tensor_equal(seen[key], t.contiguous(), key)
    # The manifest's offsets agree with the safetensors headers.
    for entry in manifest(ckpt)["tensors"]:
        n, header = _header(os.path.join(ckpt, entry["file"]))
        begin, end = header[entry["name"]]["data_offsets"]
        assert entry["offset"] == 8 + n + begin and entry["length"] == end - begin


# ------------------------------------------------------------------- save_safetensors
def test_save_safetensors_is_read_by_safetensors(tmp_path):
    tensors = {
        "u8_odd": torch.arange(3, dtype=torch.uint8),
        "f32": torch.randn(5, 7),
        "bf16": torch.randn(11, dtype=torch.bfloat16),
        "f64_scalar": torch.tensor(2.5, dtype=torch.float64),
        "bool": torch.tensor([True, False, True]),
        "i64_t": torch.arange(12).reshape(3, 4).t(),  # not contiguous
        "empty": torch.empty(0, 3),
        "f16": torch.randn(2, 3, 4, dtype=torch.float16),
    }
    path = tmp_path / "out.safetensors"
    fastpersist.save_safetensors(tensors, path, metadata={"producer": "test", "n": 3})
    loaded = st_torch.load_file(path)
    assert set(loaded) == set(tensors)
    for k, t in tensors.items():
        assert_tensor_equal(loaded[k], t.contiguous(), k)
    with safetensors.safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "pt", "producer": "test", "n": "3"}
        assert_tensor_equal(f.get_tensor("bf16"), tensors["bf16"])
    n, header = _header(path)
    assert (8 + n) % 4096 == 0
    assert os.path.getsize(path) == 8 + n + sum(t.numel() * t.element_size()
                                                for t in tensors.values())
    for k, entry in header.items():
        if k != "__metadata__":
            assert entry["data_offsets"][0] % tensors[k].element_size() == 0, k
    # And fastpersist reads it back: tensors with storages of their own.
    back = fastpersist.load_safetensors(path)
    assert set(back) == set(tensors)
    for k, t in tensors.items():
        assert_tensor_equal(back[k], t.contiguous(), k)
        assert back[k].storage_offset() == 0, k
    assert list(fastpersist.load_safetensors(path, keys=["f16", "bool"])) in (["f16", "bool"],
                                                                               ["bool", "f16"])


def test_save_safetensors_every_dtype_and_overwrite(tmp_path):
    tensors = {k: v for k, v in every_dtype_state(seed=4).items() if not k.endswith(".empty")}
    path = tmp_path / "all.safetensors"
    path.write_bytes(b"old contents")
    fastpersist.save_safetensors(tensors, path)
    back = fastpersist.load_safetensors(path)
    for k, t in tensors.items():
        assert_tensor_equal(back[k], t.contiguous(), k)
    loaded = st_torch.load_file(path)
    for k, t in tensors.items():
        assert_tensor_equal(loaded[k], t.contiguous(), k)
    _, header = _header(path)
    for k, t in tensors.items():
        assert header[k]["dtype"] == DTYPE_TO_SAFETENSORS[t.dtype]
    assert os.listdir(tmp_path) == ["all.safetensors"]


def test_save_safetensors_refuses_what_it_cannot_store(tmp_path):
    path = tmp_path / "x.safetensors"
    with pytest.raises(TypeError):
        fastpersist.save_safetensors({"a": [1, 2]}, path)
    with pytest.raises(ValueError):
        fastpersist.save_safetensors({"c": torch.ones(2, dtype=torch.complex64)}, path)
    with pytest.raises(ValueError):
        fastpersist.save_safetensors({"__metadata__": torch.ones(2)}, path)
    assert not path.exists()


# ------------------------------------------------------------------- load_safetensors
def test_load_safetensors_reads_safetensors_output(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "u8_a": torch.arange(3, dtype=torch.uint8),
        "u8_b": torch.arange(5, dtype=torch.uint8),
        "i8": torch.tensor([-1, 2, -3], dtype=torch.int8),
        "bool": torch.tensor([True, False, True]),
        "f32": torch.randn(3, 5, generator=g),
        "bf16": torch.randn(7, generator=g).to(torch.bfloat16),
        "f16": torch.randn(1, generator=g).to(torch.float16),
        "f64": torch.randn(2, 2, generator=g, dtype=torch.float64),
        "i64": torch.arange(5),
        "i32": torch.arange(7, dtype=torch.int32),
        "i16": torch.arange(3, dtype=torch.int16),
        "scalar": torch.tensor(1.5),
        "empty": torch.empty(0, 2),
    }
    path = tmp_path / "ref.safetensors"
    st_torch.save_file(tensors, str(path), metadata={"k": "v"})
    back = fastpersist.load_safetensors(path)
    assert set(back) == set(tensors)
    for k, t in tensors.items():
        assert_tensor_equal(back[k], t, k)
    sub = fastpersist.load_safetensors(path, keys=["f32", "u8_b"])
    assert set(sub) == {"f32", "u8_b"}
    with pytest.raises(KeyError, match="nope"):
        fastpersist.load_safetensors(path, keys=["f32", "nope"])
    # What safetensors.torch.save (bytes) makes is the same format.
    raw = tmp_path / "bytes.safetensors"
    raw.write_bytes(st_torch.save({"x": torch.arange(9, dtype=torch.int16)}))
    assert_tensor_equal(fastpersist.load_safetensors(raw)["x"], torch.arange(9, dtype=torch.int16))


def test_load_safetensors_copes_with_misaligned_tensors(tmp_path):
    # A valid file (the safetensors reader accepts it) whose odd-sized U8 tensor comes first,
    # so that every later tensor starts at an odd offset.
    tensors = {
        "u8": torch.arange(3, dtype=torch.uint8),
        "f32": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7,
        "i64": torch.tensor([-5, 1 << 40]),
        "bf16": torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16),
        "f64": torch.tensor(3.25, dtype=torch.float64),
    }
    header, data, offset = {}, b"", 0
    for k, t in tensors.items():
        b = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[k] = {"dtype": DTYPE_TO_SAFETENSORS[t.dtype], "shape": list(t.shape),
                     "data_offsets": [offset, offset + len(b)]}
        data += b
        offset += len(b)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = tmp_path / "misaligned.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    reference = st_torch.load_file(str(path))
    back = fastpersist.load_safetensors(path)
    assert list(back) == list(tensors)
    for k, t in tensors.items():
        assert_tensor_equal(back[k], t, k)
        assert_tensor_equal(reference[k], t, k)


def test_load_safetensors_refuses_a_damaged_header(tmp_path):
    path = tmp_path / "bad.safetensors"
    st_torch.save_file({"x": torch.ones(4)}, str(path))
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(data[:-4]))  # truncated: the data section is short
    with pytest.raises(ValueError):
        fastpersist.load_safetensors(path)


# --------------------------------------------------------------------------- export_hf
@pytest.fixture(scope="module")
def gpt2_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    model, optimizer, scheduler = trained_gpt2(seed=0)
    with fastpersist.CheckpointManager(root, durable=False) as mgr:
        mgr.save(3, training_state(model, optimizer, scheduler, step=3))
    return root, model


def _from_pretrained(path):
    transformers = pytest.importorskip("transformers")
    model, info = transformers.GPT2LMHeadModel.from_pretrained(str(path), output_loading_info=True)
    model.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    return model


def test_export_hf_loads_with_from_pretrained(gpt2_checkpoint, tmp_path):
    root, model = gpt2_checkpoint
    out = tmp_path / "hf"
    with fastpersist.CheckpointManager(root, durable=False) as mgr:
        files = mgr.export_hf(3, out, config=model.config)
    assert files == ["model.safetensors"]
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    hf = _from_pretrained(out)
    ids = batch(seed=5)
    assert torch.equal(logits(hf, ids), logits(model, ids))
    assert hf.lm_head.weight is hf.transformer.wte.weight
    # The same tensor names as the model's own save_pretrained, values equal.
    ref = tmp_path / "ref"
    model.save_pretrained(ref)
    ours, theirs = st_torch.load_file(out / "model.safetensors"), st_torch.load_file(
        ref / "model.safetensors")
    assert set(ours) == set(theirs)
    for k in theirs:
        assert_tensor_equal(ours[k], theirs[k], k)
    n, _ = _header(out / "model.safetensors")
    assert (8 + n) % 4096 == 0


def test_export_hf_shards(gpt2_checkpoint, tmp_path):
    root, model = gpt2_checkpoint
    out = tmp_path / "sharded"
    with fastpersist.CheckpointManager(root, durable=False) as mgr:
        files = mgr.export_hf("step-00000003", out, config=model.config, max_shard_size="100KB")
    shards = [f for f in files if f.endswith(".safetensors")]
    assert len(shards) > 2
    assert shards == [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                      for i in range(len(shards))]
    assert "model.safetensors.index.json" in files
    with open(out / "model.safetensors.index.json") as f:
        index = json.load(f)
    assert set(index["weight_map"].values()) == set(shards)
    total = 0
    for shard in shards:
        part = st_torch.load_file(out / shard)
        assert all(index["weight_map"][k] == shard for k in part)
        total += sum(t.numel() * t.element_size() for t in part.values())
        if len(part) > 1:
            assert os.path.getsize(out / shard) <= 100_000 + 4096
    assert index["metadata"]["total_size"] == total
    hf = _from_pretrained(out)
    ids = batch(seed=6)
    assert torch.equal(logits(hf, ids), logits(model, ids))


def test_export_hf_refuses_a_shard_size_that_is_not_one(gpt2_checkpoint, tmp_path):
    root, _ = gpt2_checkpoint
    with fastpersist.CheckpointManager(root, durable=False) as mgr:
        with pytest.raises(ValueError, match="max_shard_size"):
            mgr.export_hf("step-00000003", tmp_path / "a", max_shard_size=-1)
        with pytest.raises(TypeError, match="max_shard_size"):
            mgr.export_hf("step-00000003", tmp_path / "b", max_shard_size=1.5)
        with pytest.raises(ValueError, match="as Hugging Face does"):
            mgr.export_hf("step-00000003", tmp_path / "c", max_shard_size="5 parsecs")
    assert not [f for d in "abc" for f in (tmp_path / d).glob("*.safetensors")]


def test_max_shard_size_means_what_hugging_face_means():
    """"5GB" is 5 * 10**9 bytes for Hugging Face (fastpersist's own sizes are binary): the
    export's parser agrees with transformers' own on every unit."""
    from transformers.utils.hub import convert_file_size_to_int

    for text in ["5GB", "5gB", "5gb", "5GiB", "100KB", "10MB", "3MiB", "7KiB", "5Gb", "500Mb"]:
        assert fastpersist._core.parse_hf_size(text) == convert_file_size_to_int(text), text
    with pytest.raises(ValueError, match="as Hugging Face does"):
        fastpersist._core.parse_hf_size("5 parsecs")


def test_export_hf_config_forms_and_errors(gpt2_checkpoint, tmp_path):
    root, model = gpt2_checkpoint
    model.config.save_pretrained(tmp_path / "cfg")
    with fastpersist.CheckpointManager(root, durable=False) as mgr:
        mgr.export_hf("latest", tmp_path / "a", config=str(tmp_path / "cfg"))
        assert json.loads((tmp_path / "a" / "config.json").read_text())["n_embd"] == 64
        mgr.export_hf(3, tmp_path / "b", config=model.config.to_dict())
        assert json.loads((tmp_path / "b" / "config.json").read_text())["n_layer"] == 2
        mgr.export_hf(3, tmp_path / "c")  # no config: weights only
        assert os.listdir(tmp_path / "c") == ["model.safetensors"]
        with pytest.raises(KeyError):
            mgr.export_hf(3, tmp_path / "d", prefix="nothing.")
        with pytest.raises(TypeError):
            mgr.export_hf(3, tmp_path / "e", config=42)
    hf = _from_pretrained(tmp_path / "b")
    ids = batch(seed=7)
    assert torch.equal(logits(hf, ids), logits(model, ids))


def test_export_hf_of_a_bare_state_dict(tmp_path):
    model = tiny_gpt2(seed=4)
    with fastpersist.CheckpointManager(tmp_path / "root", durable=False) as mgr:
        mgr.save(1, model.state_dict())
        assert mgr.export_hf(1, tmp_path / "out", config=model.config, prefix="") == [
            "model.safetensors"]
    hf = _from_pretrained(tmp_path / "out")
    ids = batch(seed=8)
    assert torch.equal(logits(hf, ids), logits(model, ids))
