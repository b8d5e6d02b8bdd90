# SPDX-License-Identifier: Apache-2.0
"""dtype conversion on load happens in C++ (include/fastpersist/dtype.h); its results must be
bit-identical to torch's own ``Tensor.to()``: round to nearest even, NaN, infinities,
subnormals and overflow included, on random and edge-case data."""

from __future__ import annotations

import pytest
import torch

import fastpersist
from fastpersist.checkpoint_state import DTYPE_TO_SAFETENSORS, SAFETENSORS_TO_DTYPE

FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
INTS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]


def _edge_floats(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    wide = torch.cat([
        torch.randn(20000, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-12, 12, (20000,), generator=g),
        torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan"), 65504.0,
                      65519.99, 65520.0, 65536.0, 1e39, -1e39, 3.4e38, 2.0 ** -24, 2.0 ** -25,
                      1.5 * 2.0 ** -25, 2.0 ** -14, 2.0 ** -149, 2.0 ** -150, 1e-45, 1.0 + 2.0 ** -11,
                      1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -24,
                      1.0 + 2.0 ** -53, 1.0000000596046448, 0.1, 1 / 3]),
    ])
    if dtype == torch.float64:
        return wide
    # Every bit pattern of the 16-bit formats, and random float32 bit patterns.
    if dtype in (torch.float16, torch.bfloat16):
        return torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype)
    bits = torch.randint(-(1 << 31), (1 << 31) - 1, (50000,), generator=g, dtype=torch.int64).to(torch.int32)
    return torch.cat([wide.to(torch.float32), bits.view(torch.float32)])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, except that a NaN of `b` (torch) needs only a NaN in `a`: torch itself
    encodes a bfloat16 NaN as 0xffff or 0x7fc0 depending on the source dtype and on whether
    the element fell in a vectorised chunk or the scalar tail."""
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype.is_floating_point:
        width = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
        nan = torch.isnan(b)
        if not torch.equal(torch.isnan(a), nan):
            return False
        return torch.equal(a.view(width)[~nan], b.view(width)[~nan])
    return torch.equal(a, b)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("dtype")
    g = torch.Generator().manual_seed(99)
    state = {f"f.{DTYPE_TO_SAFETENSORS[d]}": _edge_floats(d) for d in FLOATS}
    for d in INTS:
        info = torch.iinfo(d)
        edge = torch.tensor([info.min, info.max, 0, -1 if info.min < 0 else 1, 1 << 24 | 1 if info.bits > 24 else 3],
                            dtype=torch.int64).clamp(info.min, info.max).to(d)
        state[f"i.{DTYPE_TO_SAFETENSORS[d]}"] = torch.cat(
            [edge, torch.randint(info.min, info.max, (10000,), generator=g, dtype=torch.int64).to(d)])
    with fastpersist.CheckpointManager(root, durable=False) as m:
        m.save(1, state)
    return root / "step-00000001", state


@pytest.mark.parametrize("target", FLOATS, ids=str)
@pytest.mark.parametrize("source", FLOATS, ids=str)
def test_float_conversions_are_bit_identical_to_torch(saved, source, target):
    path, state = saved
    name = f"f.{DTYPE_TO_SAFETENSORS[source]}"
    got = fastpersist.load_checkpoint(path, keys=[name], dtype={name: target})[name]
    assert _same_bits(got, state[name].to(target))
    # The same conversion into a destination, and streamed in pieces under a small budget.
    dest = torch.empty(state[name].shape, dtype=target)
    fastpersist.load_checkpoint(path, keys=[name], into={name: dest}, max_memory=4096)
    assert _same_bits(dest, state[name].to(target))


@pytest.mark.parametrize("target", FLOATS + INTS, ids=str)
@pytest.mark.parametrize("source", INTS, ids=str)
def test_integer_conversions_are_bit_identical_to_torch(saved, source, target):
    path, state = saved
    name = f"i.{DTYPE_TO_SAFETENSORS[source]}"
    got = fastpersist.load_checkpoint(path, keys=[name], dtype={name: target})[name]
    assert _same_bits(got, state[name].to(target))


def test_blanket_dtype_converts_floats_only(saved):
    path, state = saved
    got = fastpersist.load_checkpoint(path, dtype=torch.float16)
    for name, t in state.items():
        want = t.to(torch.float16) if t.dtype.is_floating_point else t
        assert _same_bits(got[name], want), name


def test_float_to_integer_is_a_clear_error(saved):
    path, _ = saved
    with pytest.raises(ValueError, match="cannot load tensor 'f.F32' as I32"):
        fastpersist.load_checkpoint(path, dtype={"f.F32": torch.int32})


def test_the_dtype_table_comes_from_cpp():
    assert [(code, str(d)) for d, code in DTYPE_TO_SAFETENSORS.items()][:4] == [
        ("F64", "torch.float64"), ("F32", "torch.float32"), ("F16", "torch.float16"), ("BF16", "torch.bfloat16")]
    for d in fastpersist._core.dtype_table():
        if d.torch_name and d.name in SAFETENSORS_TO_DTYPE:
            assert SAFETENSORS_TO_DTYPE[d.name].itemsize == d.size
