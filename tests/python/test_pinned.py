# SPDX-License-Identifier: Apache-2.0
"""Pinned host memory: new_cpu_locked_tensor / free_cpu_locked_tensor / is_pinned and friends."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import fastpersist


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.int8,
        torch.bool,
        torch.int64,
        torch.complex64,
    ],
    ids=str,
)
def test_new_cpu_locked_tensor(handle, tmp_path, dtype):
    example = torch.empty(0, dtype=dtype)
    t = handle.new_cpu_locked_tensor(12345, example)
    assert t.dtype == dtype and t.shape == (12345,) and t.device.type == "cpu"
    assert t.is_contiguous()
    assert t.data_ptr() % 4096 == 0, "pinned memory is page-aligned"
    assert handle.is_pinned(t)
    assert handle.is_pinned(t[100:200]), "views inside a locked buffer are pinned too"
    src = torch.arange(12345).to(dtype)
    t.copy_(src)
    assert handle.sync_pwrite(t, tmp_path / "p.bin") == 1
    back = handle.new_cpu_locked_tensor(12345, example)
    assert handle.async_pread(back, tmp_path / "p.bin") == 0
    assert handle.wait() == 1
    assert torch.equal(back, src)
    assert handle.free_cpu_locked_tensor(t)
    assert handle.free_cpu_locked_tensor(back)


def test_locked_tensor_keeps_its_memory_alive(backend):
    h = fastpersist.AioHandle(backend=backend)
    t = h.new_cpu_locked_tensor(1 << 20, torch.empty(0, dtype=torch.int32))
    t.copy_(torch.arange(1 << 20, dtype=torch.int32))
    assert h.free_cpu_locked_tensor(t)
    assert not h.free_cpu_locked_tensor(t), "a second free finds nothing"
    assert not h.is_pinned(t), "a freed buffer is no longer tracked"
    h.close()
    del h
    gc.collect()
    # The tensor still owns its memory after both the free and the handle are gone.
    assert torch.equal(t, torch.arange(1 << 20, dtype=torch.int32))
    t += 1
    assert int(t[-1]) == 1 << 20


def test_is_pinned_for_ordinary_memory(handle):
    assert not handle.is_pinned(torch.empty(100))
    assert not handle.is_pinned(np.zeros(100))
    assert not handle.is_pinned(bytearray(100))


def test_deepnvme_spellings_and_dtype_argument(handle):
    t = handle.new_cpu_locked_tensor(10, example_tenosr=torch.empty(1, dtype=torch.float16))
    assert t.dtype == torch.float16 and t.numel() == 10
    u = handle.new_cpu_locked_tensor(10, torch.bfloat16)
    assert u.dtype == torch.bfloat16
    z = handle.new_cpu_locked_tensor(0, torch.float32)
    assert z.numel() == 0


def test_new_cpu_locked_array(handle, tmp_path):
    a = handle.new_cpu_locked_array((3, 1000), np.float32)
    assert a.shape == (3, 1000) and a.dtype == np.float32 and a.flags.writeable
    assert handle.is_pinned(a)
    a[:] = np.arange(3000, dtype=np.float32).reshape(3, 1000)
    handle.sync_pwrite(a, tmp_path / "a.bin")
    b = handle.new_cpu_locked_array(3000, "float32")
    handle.sync_pread(b, tmp_path / "a.bin")
    np.testing.assert_array_equal(b.reshape(3, 1000), a)
    assert handle.free_cpu_locked_buffer(a)


def test_new_cpu_locked_buffer_protocol(handle, tmp_path):
    buf = handle.new_cpu_locked_buffer(5000)
    assert isinstance(buf, fastpersist.PinnedBuffer)
    assert buf.nbytes == 5000 and len(buf) == 5000
    assert buf.address % 4096 == 0
    assert isinstance(buf.locked, bool)
    view = memoryview(buf)
    assert view.nbytes == 5000 and not view.readonly
    view[:5] = b"hello"
    handle.sync_pwrite(buf, tmp_path / "m.bin")
    with open(tmp_path / "m.bin", "rb") as f:
        assert f.read(5) == b"hello"
    assert "PinnedBuffer" in repr(buf)
