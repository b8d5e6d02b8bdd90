# SPDX-License-Identifier: Apache-2.0
"""Every buffer that crosses into C++ carries its own length, and C++ checks it before any I/O.

The bindings read address, length, layout and device from the object itself (the buffer protocol
or DLPack), so no entry point can be handed a bare address or a length larger than the memory
behind it. Each way a buffer can be too small or wrong is a ValueError raised before any I/O:
the file is left exactly as it was, and the bytes around a view are never touched. The cases
that would have read or written outside the buffer run in a subprocess, so a regression shows
up as a failed test instead of a crashed test run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import fastpersist
from fastpersist import _core

SENTINEL = 0xA5


@pytest.fixture
def existing(tmp_path):
    """A 64 KiB file of known bytes, to show that a refused call leaves it as it was."""
    path = tmp_path / "existing.bin"
    content = os.urandom(64 << 10)
    path.write_bytes(content)
    return path, content


def _unchanged(path_and_content) -> bool:
    path, content = path_and_content
    return path.read_bytes() == content


def _run_isolated(code: str) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter: a memory error kills only that process."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


# ------------------------------------------------------------------------ AioHandle transfers
TRANSFERS = {
    "sync_pread": lambda h, buf, path, off: h.sync_pread(buf, path, off),
    "async_pread": lambda h, buf, path, off: (h.async_pread(buf, path, off), h.wait()),
    "pread_validate": lambda h, buf, path, off: h.pread(buf, path, True, False, off),
    "pread_async": lambda h, buf, path, off: (h.pread(buf, path, False, True, off), h.wait()),
}
WRITES = {
    "sync_pwrite": lambda h, buf, path, off: h.sync_pwrite(buf, path, off),
    "async_pwrite": lambda h, buf, path, off: (h.async_pwrite(buf, path, off), h.wait()),
    "pwrite_validate": lambda h, buf, path, off: h.pwrite(buf, path, True, False, off),
    "pwrite_async": lambda h, buf, path, off: (h.pwrite(buf, path, False, True, off), h.wait()),
}


@pytest.mark.parametrize("read", TRANSFERS.values(), ids=TRANSFERS.keys())
def test_read_into_a_view_touches_only_the_view(handle, existing, read):
    path, content = existing
    big = torch.full((4096,), SENTINEL, dtype=torch.uint8)
    read(handle, big[100:300], path, 7)
    assert bytes(big[100:300].numpy()) == content[7:207]
    assert bool((big[:100] == SENTINEL).all()) and bool((big[300:] == SENTINEL).all())
    array = np.full(4096, SENTINEL, dtype=np.uint8)
    read(handle, array[1000:1010], path, 0)
    assert bytes(array[1000:1010]) == content[:10]
    assert (array[:1000] == SENTINEL).all() and (array[1010:] == SENTINEL).all()
    raw = bytearray([SENTINEL]) * 64
    read(handle, memoryview(raw)[8:16], path, 0)
    assert raw[8:16] == content[:8] and raw[:8] == bytes([SENTINEL]) * 8
    assert raw[16:] == bytes([SENTINEL]) * 48


@pytest.mark.parametrize("read", TRANSFERS.values(), ids=TRANSFERS.keys())
def test_buffer_larger_than_the_rest_of_the_file_is_refused_before_io(handle, existing, read):
    path, content = existing
    target = torch.full((len(content) + 1,), SENTINEL, dtype=torch.uint8)
    with pytest.raises(ValueError, match="past the end"):
        read(handle, target, path, 0)
    with pytest.raises(ValueError, match="past the end"):
        read(handle, target[:100], path, len(content) - 99)
    assert bool((target == SENTINEL).all())  # nothing was read into it


@pytest.mark.parametrize("read", TRANSFERS.values(), ids=TRANSFERS.keys())
def test_read_only_and_strided_destinations_are_refused(handle, existing, read):
    path, _ = existing
    frozen = np.zeros(16, dtype=np.uint8)
    frozen.flags.writeable = False
    for bad, match in [(b"x" * 16, "read-only"), (memoryview(bytearray(16)).toreadonly(), "read-only"),
                       (frozen, "read-only"), (torch.zeros(32, dtype=torch.uint8)[::2], "contiguous"),
                       (np.zeros((4, 8), dtype=np.uint8)[:, ::2], "contiguous"),
                       (memoryview(bytearray(32))[::2], "contiguous")]:
        with pytest.raises(ValueError, match=match):
            read(handle, bad, path, 0)
    assert handle.wait() == 0  # nothing was submitted


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_strided_sources_are_refused_and_the_file_is_untouched(handle, existing, write):
    path, _ = existing
    for bad in [torch.arange(64.0)[::2], torch.arange(64.0).reshape(8, 8).t(),
                np.zeros((8, 8))[:, ::3], memoryview(bytearray(64))[::4]]:
        with pytest.raises(ValueError, match="contiguous"):
            write(handle, bad, path, 0)
    assert _unchanged(existing)
    assert handle.wait() == 0


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_a_view_writes_exactly_its_own_bytes(handle, existing, write):
    path, content = existing
    source = torch.arange(256, dtype=torch.uint8)
    write(handle, source[16:48], path, 100)
    expected = bytearray(content)
    expected[100:132] = bytes(range(16, 48))
    assert path.read_bytes() == bytes(expected)
    wide = torch.arange(64, dtype=torch.float32)  # dtype size counts: 8 floats are 32 bytes
    write(handle, wide[8:16], path, 0)
    expected[0:32] = wide[8:16].numpy().tobytes()
    assert path.read_bytes() == bytes(expected)


def test_descriptor_transfers_check_their_buffers_too(handle, existing):
    path, content = existing
    fd = os.open(path, os.O_RDWR)
    try:
        for bad, match in [(b"x" * 16, "read-only"), (torch.zeros(32)[::2], "contiguous")]:
            with pytest.raises(ValueError, match=match):
                handle.async_pread(bad, fd=fd)
            with pytest.raises(ValueError, match=match):
                handle.sync_pread(bad, fd=fd)
        with pytest.raises(ValueError, match="contiguous"):
            handle.async_pwrite(np.zeros((4, 4))[:, ::2], fd=fd)
        assert handle.wait() == 0
        big = torch.full((64,), SENTINEL, dtype=torch.uint8)
        assert handle.sync_pread(big[8:24], fd=fd, file_offset=3) == 1
        assert bytes(big[8:24].numpy()) == content[3:19]
        assert bool((big[:8] == SENTINEL).all()) and bool((big[24:] == SENTINEL).all())
    finally:
        os.close(fd)
    assert _unchanged(existing)


@pytest.mark.parametrize("offset", [(1 << 63) - 1, (1 << 63) - 8, 1 << 63, 1 << 64, -1])
def test_offsets_that_overflow_are_refused_before_io(handle, existing, offset):
    path, _ = existing
    for call in (*WRITES.values(), *TRANSFERS.values()):
        with pytest.raises(ValueError):
            call(handle, bytearray(16), path, offset)
    assert _unchanged(existing)


def test_zero_length_buffers(handle, tmp_path, existing):
    path, _ = existing
    for empty in (b"", bytearray(), torch.empty(0), np.empty(0), torch.empty((3, 0))):
        assert handle.sync_pwrite(empty, path, 10) == 1
        if not isinstance(empty, bytes):
            assert handle.sync_pread(empty, path, 10) == 1
    assert _unchanged(existing)


def test_tensors_that_require_grad_and_numpy_dtypes_work(handle, tmp_path):
    path = tmp_path / "w.bin"
    t = torch.randn(1000, requires_grad=True)
    handle.sync_pwrite(t, path)
    back = torch.empty(1000)
    handle.sync_pread(back, path)
    assert torch.equal(back, t.detach())
    for dtype in (np.float16, np.int64, np.complex128, np.bool_):
        a = np.ones(33, dtype=dtype)
        handle.sync_pwrite(a, path, truncate=True)
        assert os.path.getsize(path) == a.nbytes
        out = np.zeros_like(a)
        handle.sync_pread(out, path)
        assert (out == a).all()


def test_async_buffers_stay_exported_until_wait(handle, existing):
    path, content = existing
    target = bytearray(4096)
    handle.async_pread(target, path)
    with pytest.raises(BufferError):
        target.extend(b"x")  # would move the memory the kernel is writing into
    assert handle.wait() == 1
    target.extend(b"x")  # released after wait()
    assert bytes(target[:4096]) == content[:4096]


def test_pinned_buffer_queries_take_the_buffer_itself(handle):
    pinned = handle.new_cpu_locked_tensor(1024, torch.float32)
    assert handle.is_pinned(pinned) and handle.is_pinned(pinned[10:20])
    assert not handle.is_pinned(torch.empty(1024))
    assert not handle.is_pinned(b"")
    with pytest.raises(ValueError, match="contiguous"):
        handle.is_pinned(pinned[::2])
    assert not handle.free_cpu_locked_tensor(pinned[1:])  # not the start of a pinned buffer
    assert handle.free_cpu_locked_tensor(pinned)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_memory_is_refused_before_io(handle, existing):
    path, _ = existing
    on_gpu = torch.zeros(16, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="CUDA device"):
        handle.sync_pwrite(on_gpu, path)
    with pytest.raises(ValueError, match="CUDA device"):
        handle.sync_pread(on_gpu, path)
    assert _unchanged(existing) and bool((on_gpu == 0).all())


# ------------------------------------------------------------------------ FastFileWriter.write
def test_writer_takes_lengths_from_the_object(tmp_path):
    path = tmp_path / "w.bin"
    t = torch.arange(100, dtype=torch.int16)
    with fastpersist.FastFileWriter(path) as w:
        assert w.write(t[10:20]) == 20
        assert w.write(np.arange(4, dtype=np.int64)[1:3]) == 16
        with pytest.raises(ValueError, match="contiguous"):
            w.write(t[::2])
    assert path.read_bytes() == t[10:20].numpy().tobytes() + np.arange(1, 3).tobytes()


# ------------------------------------------------------------------------ checkpoint saves
def _save(root, tensors):
    """Calls the binding directly: what the façade sends, and what a wrong façade could send."""
    mgr = _core.CheckpointManager(str(root), _core.CheckpointOptions())
    try:
        mgr.save_async("t", tensors, {}, b"", None, "{}", {}).wait()
    finally:
        mgr.close()


@pytest.mark.parametrize("dtype,shape,tensor", [
    ("F32", [8], torch.zeros(8, dtype=torch.float16)),            # wrong dtype size
    ("F16", [8], torch.zeros(8, dtype=torch.float32)),            # wrong dtype size, other way
    ("F32", [9], torch.zeros(8)),                                 # shape larger than the tensor
    ("F32", [4], torch.zeros(8)),                                 # shape smaller than the tensor
    ("F32", [1 << 62, 4], torch.zeros(8)),                        # element count overflows
    ("U8", [16], torch.zeros(32, dtype=torch.uint8)[::2]),        # non-contiguous
    ("F32", [2, 2], np.zeros((2, 4), dtype=np.float32)[:, :2]),   # non-contiguous numpy
    ("XX", [8], torch.zeros(8)),                                  # unknown dtype
], ids=["f16-as-f32", "f32-as-f16", "shape-too-big", "shape-too-small", "overflow",
        "strided", "strided-numpy", "unknown-dtype"])
def test_save_checks_shape_and_dtype_against_the_memory(tmp_path, dtype, shape, tensor):
    with pytest.raises(ValueError):
        _save(tmp_path / "root", [("x", dtype, shape, tensor)])
    assert not (tmp_path / "root" / "t").exists()


def test_save_accepts_tensors_views_and_buffers(tmp_path):
    base = torch.arange(100, dtype=torch.float32)
    array = np.arange(6, dtype=np.int64).reshape(2, 3)
    _save(tmp_path / "root", [("view", "F32", [10], base[20:30]), ("np", "I64", [2, 3], array),
                              ("bytes", "U8", [4], b"abcd"),
                              ("empty", "F32", [0, 5], torch.empty(0, 5))])
    ckpt = tmp_path / "root" / "t"
    stored = {}
    for t in json.loads((ckpt / "manifest.json").read_text())["tensors"]:
        with open(ckpt / t["file"], "rb") as f:
            f.seek(t["offset"])
            stored[t["name"]] = f.read(t["length"])
    assert stored == {"view": base[20:30].numpy().tobytes(), "np": array.tobytes(),
                      "bytes": b"abcd", "empty": b""}


def test_save_with_a_shape_larger_than_the_memory_does_not_crash(tmp_path):
    """Before the bindings read the length from the tensor, a façade bug sending a shape larger
    than the memory made the snapshot read past the end of the tensor."""
    proc = _run_isolated(f"""
        import torch
        from fastpersist import _core
        mgr = _core.CheckpointManager({str(tmp_path / 'root')!r}, _core.CheckpointOptions())
        small = torch.zeros(16)
        try:
            mgr.save_async("t", [("x", "F32", [1 << 28], small)], {{}}, b"", None, "{{}}", {{}}).wait()
        except ValueError as e:
            print("refused:", e)
        mgr.close()
    """)
    assert proc.returncode == 0, proc.stderr
    assert "refused:" in proc.stdout and "memory holds 16 elements" in proc.stdout


def test_read_into_a_small_view_of_a_big_file_does_not_crash(tmp_path):
    """A read's length is the destination's, never the file's: a 16-element view of a tensor
    read from a 16 MiB file gets 64 bytes, and its neighbours keep theirs."""
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(16 << 20))
    proc = _run_isolated(f"""
        import torch, fastpersist
        big = torch.full((1024,), 7.0)
        with fastpersist.AioHandle() as h:
            h.sync_pread(big[100:116], {str(path)!r})
        assert bool((big[:100] == 7.0).all()) and bool((big[116:] == 7.0).all())
        print("ok")
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
