# SPDX-License-Identifier: Apache-2.0
"""AioHandle round trips and DeepNVMe usage patterns, on every available backend."""

from __future__ import annotations

import gc
import os
import pathlib
import weakref

import numpy as np
import pytest
import torch

import fastpersist

SIZES = [0, 1, 4095, (1 << 20) + 7]
DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.int64,
    torch.complex64,
]


def random_tensor(numel: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=g).bool()
    if dtype.is_complex:
        return torch.randn(numel, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=g).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (numel,), generator=g, dtype=torch.int64).to(dtype)


def file_bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# ------------------------------------------------------------------------------ construction
def test_defaults_match_deepnvme():
    with fastpersist.AioHandle() as h:
        assert h.get_block_size() == 1 << 20
        assert h.get_queue_depth() == 128
        assert h.get_single_submit() is False
        assert h.get_overlap_events() is False
        assert h.get_intra_op_parallelism() == 1
        assert h.get_alignment() > 0 and h.get_alignment() % 512 == 0
        assert h.backend in {"io_uring", "libaio", "threads"}
        assert h.backend_reason


def test_knobs_are_kept(backend):
    with fastpersist.aio_handle(
        block_size=64 << 10,
        queue_depth=8,
        single_submit=True,
        overlap_events=True,
        intra_op_parallelism=3,
        backend=backend,
    ) as h:
        assert h.get_block_size() == 64 << 10
        assert h.get_queue_depth() == 8
        assert h.get_single_submit() is True
        assert h.get_overlap_events() is True
        assert h.get_intra_op_parallelism() == 3
        assert h.get_alignment() % 3 == 0
        assert h.backend == backend


def test_aio_handle_alias_and_version():
    assert fastpersist.aio_handle is fastpersist.AioHandle
    assert isinstance(fastpersist.__version__, str) and fastpersist.__version__


# ------------------------------------------------------------------------------ round trips
@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tensor_round_trip(handle, tmp_path, dtype, numel):
    src = random_tensor(numel, dtype)
    path = tmp_path / "t.bin"
    assert handle.sync_pwrite(src, str(path)) == 1
    assert path.stat().st_size == numel * src.element_size()
    dst = torch.zeros_like(src)
    assert handle.sync_pread(dst, path) == 1
    assert torch.equal(src, dst)


@pytest.mark.parametrize(
    "dtype,shape",
    [(np.float32, (3, 5)), (np.int16, (4095,)), (np.float64, (64, 1024 + 1)), (np.uint8, (0,))],
)
def test_numpy_round_trip(handle, tmp_path, dtype, shape):
    rng = np.random.default_rng(1)
    src = (rng.standard_normal(shape) * 100).astype(dtype)
    path = tmp_path / "a.bin"
    handle.sync_pwrite(src, path)
    assert file_bytes(path) == src.tobytes()
    dst = np.zeros_like(src)
    handle.sync_pread(dst, path)
    np.testing.assert_array_equal(src, dst)


@pytest.mark.parametrize("n", SIZES)
def test_bytes_like_round_trip(handle, tmp_path, n):
    data = os.urandom(n)
    path = tmp_path / "b.bin"
    handle.sync_pwrite(data, path)  # read-only source is fine for writes
    assert file_bytes(path) == data
    into = bytearray(n)
    handle.sync_pread(into, path)
    assert bytes(into) == data
    into2 = bytearray(n)
    handle.sync_pread(memoryview(into2), path)
    assert bytes(into2) == data
    handle.sync_pwrite(memoryview(bytearray(data)), path)
    assert file_bytes(path) == data


def test_mmap_buffer(handle, tmp_path):
    import mmap

    data = os.urandom(10000)
    path = tmp_path / "m.bin"
    handle.sync_pwrite(data, path)
    with mmap.mmap(-1, len(data)) as m:
        handle.sync_pread(m, path)
        assert m[:] == data


@pytest.mark.parametrize("offset", [0, 512, 4097, (1 << 20) + 3])
def test_file_offsets(handle, tmp_path, offset):
    path = tmp_path / "o.bin"
    head = os.urandom(offset)
    handle.sync_pwrite(head, path)
    body = random_tensor(10007, torch.float32)
    handle.sync_pwrite(body, path, offset)
    raw = file_bytes(path)
    assert len(raw) == offset + body.numel() * 4
    assert raw[:offset] == head
    back = torch.empty_like(body)
    handle.sync_pread(back, path, file_offset=offset)
    assert torch.equal(back, body)


def test_truncate_replaces_a_longer_file(handle, tmp_path):
    path = tmp_path / "r.bin"
    handle.sync_pwrite(os.urandom(100_000), path)
    handle.sync_pwrite(b"short", path, truncate=True)
    assert file_bytes(path) == b"short"
    handle.async_pwrite(os.urandom(100_000), path)
    handle.wait()
    handle.async_pwrite(b"tail", path, 10, truncate=True)
    handle.wait()
    assert file_bytes(path) == bytes(10) + b"tail"
    handle.pwrite(b"validated", path, True, False, truncate=True)
    assert file_bytes(path) == b"validated"


def test_shorter_rewrite_leaves_the_old_tail(handle, tmp_path):
    path = tmp_path / "r.bin"
    old = os.urandom(100_000)
    handle.sync_pwrite(old, path)
    handle.sync_pwrite(b"short", path)
    assert file_bytes(path) == b"short" + old[5:]


def test_truncate_is_refused_for_a_file_descriptor(handle, tmp_path):
    path = tmp_path / "fd.bin"
    path.write_bytes(b"x" * 100)
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(ValueError, match="never truncated"):
            handle.sync_pwrite(b"ab", fd=fd, truncate=True)
    finally:
        os.close(fd)
    assert file_bytes(path) == b"x" * 100


# Regression (issue 10): 8 MiB at file offsets 8, 16 and 24 MiB, then 8 MiB at offset 0, shrank
# the file from 32 MiB to 8 MiB: the write at offset 0 opened it with O_TRUNC.
def test_write_at_offset_zero_keeps_ranges_written_before(handle, tmp_path):
    part = 8 << 20
    path = tmp_path / "ranges.bin"
    data = torch.randint(0, 256, (4 * part,), dtype=torch.uint8)
    for i in (1, 2, 3, 0):
        assert handle.sync_pwrite(data[i * part:(i + 1) * part], path, i * part) == 1
    assert os.path.getsize(path) == 4 * part
    back = torch.empty_like(data)
    handle.sync_pread(back, path)
    assert torch.equal(back, data)


def test_threads_writing_disjoint_ranges_of_one_file_keep_every_range(handle, tmp_path):
    import threading

    part, parts = 1 << 20, 8
    path = tmp_path / "threads.bin"
    data = torch.randint(0, 256, (parts * part,), dtype=torch.uint8)
    errors = []
    start = threading.Barrier(parts)

    def write(i):
        try:
            start.wait()
            handle.sync_pwrite(data[i * part:(i + 1) * part], path, i * part)
        except Exception as e:  # reported below, with the failing range
            errors.append((i, e))

    threads = [threading.Thread(target=write, args=(i,)) for i in reversed(range(parts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    back = torch.empty_like(data)
    handle.sync_pread(back, path)
    assert torch.equal(back, data)


def test_async_batch_of_disjoint_ranges_keeps_every_range(handle, tmp_path):
    part = 1 << 20
    path = tmp_path / "batch.bin"
    data = torch.randint(0, 256, (8 * part,), dtype=torch.uint8)
    for i in (3, 0, 7, 5, 1, 2, 6, 4):
        assert handle.async_pwrite(data[i * part:(i + 1) * part], path, i * part) == 0
    assert handle.wait() == 8
    back = torch.empty_like(data)
    handle.sync_pread(back, path)
    assert torch.equal(back, data)


def test_pathlike_and_str_paths(handle, tmp_path):
    t = random_tensor(1000, torch.int64)
    handle.sync_pwrite(t, pathlib.Path(tmp_path) / "p.bin")
    handle.sync_pwrite(t, os.fsencode(tmp_path / "q.bin"))
    assert file_bytes(tmp_path / "p.bin") == file_bytes(tmp_path / "q.bin") == t.numpy().tobytes()


# ------------------------------------------------------------------------------ DeepNVMe patterns
def test_async_pwrite_then_wait_returns_one(handle, tmp_path):
    t = random_tensor(1 << 20, torch.float16)
    path = tmp_path / "a.bin"
    assert handle.async_pwrite(t, str(path)) == 0
    assert handle.wait() == 1
    assert file_bytes(path) == t.view(torch.uint8).numpy().tobytes()
    assert handle.wait() == 0  # nothing left


def test_many_async_writes_then_one_wait(handle, tmp_path):
    tensors = [random_tensor(1000 + i * 517, torch.float32, seed=i) for i in range(16)]
    for i, t in enumerate(tensors):
        assert handle.async_pwrite(t, tmp_path / f"{i}.bin") == 0
    assert handle.wait() == len(tensors)
    for i, t in enumerate(tensors):
        out = torch.empty_like(t)
        assert handle.async_pread(out, tmp_path / f"{i}.bin") == 0
        assert handle.wait() == 1
        assert torch.equal(out, t)


def test_async_reads_of_slices_into_one_buffer(handle, tmp_path):
    src = random_tensor(4 * 4096 + 3, torch.uint8)
    path = tmp_path / "s.bin"
    handle.sync_pwrite(src, path)
    dst = torch.zeros_like(src)
    cuts = [0, 4096, 2 * 4096 + 1, src.numel()]
    for a, b in zip(cuts, cuts[1:]):
        handle.async_pread(dst[a:b], path, a)
    assert handle.wait() == 3
    assert torch.equal(src, dst)


def test_pwrite_pread_deepnvme_signature(handle, tmp_path):
    t = random_tensor(5000, torch.int8)
    path = str(tmp_path / "p.bin")
    # pwrite(buffer, filename, validate, async, file_offset=0): positional...
    assert handle.pwrite(t, path, False, False) == 1
    assert handle.pwrite(t, path, False, True) == 0
    assert handle.wait() == 1
    # ... and the `async` keyword, which only works through **kwargs in Python.
    assert handle.pwrite(t, path, validate=False, **{"async": True}) == 0
    assert handle.wait() == 1
    out = torch.empty_like(t)
    assert handle.pread(out, path, False, **{"async": False}) == 1
    assert torch.equal(out, t)
    out.zero_()
    assert handle.pread(out, path, True, True, 0) == 0
    assert handle.wait() == 1
    assert torch.equal(out, t)
    out.zero_()
    assert handle.pread(out, path, validate=True, async_op=False) == 1
    assert torch.equal(out, t)


def test_pwrite_with_validate(handle, tmp_path):
    t = random_tensor((1 << 20) + 7, torch.uint8)
    path = tmp_path / "v.bin"
    assert handle.pwrite(t, path, True, False) == 1
    assert handle.pwrite(t, path, True, True, 0) == 0
    assert handle.wait() == 1
    assert handle.pwrite(t[:100], path, True, False, 4097) == 1


def test_async_pwrite_on_callers_fd(handle, tmp_path):
    path = tmp_path / "fd.bin"
    a = random_tensor(5000, torch.uint8, seed=1)
    b = random_tensor(3000, torch.uint8, seed=2)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        assert handle.async_pwrite(a, fd=fd, file_offset=0) == 0
        assert handle.async_pwrite(b, fd=fd, file_offset=5000) == 0
        assert handle.wait() == 2
        os.fstat(fd)  # still open: the handle never closes a caller's fd
        out = torch.empty(8000, dtype=torch.uint8)
        assert handle.sync_pread(out, fd=fd) >= 1
        assert torch.equal(out, torch.cat([a, b]))
        out.zero_()
        handle.async_pread(out, fd)  # an int filename is a descriptor too
        handle.wait()
        assert torch.equal(out, torch.cat([a, b]))
    finally:
        os.close(fd)


def test_temporary_buffer_of_async_write_stays_alive_until_wait(handle, tmp_path):
    n = 4 << 20
    path = tmp_path / "tmp.bin"
    handle.async_pwrite(torch.full((n,), 7, dtype=torch.uint8), path)
    tracked = torch.full((n,), 9, dtype=torch.uint8)
    ref = weakref.ref(tracked)
    handle.async_pwrite(tracked, tmp_path / "tracked.bin")
    del tracked
    gc.collect()
    assert ref() is not None, "the handle must hold an async buffer until wait()"
    # Churn the allocator: freed memory would be reused and overwritten here.
    junk = [torch.full((n,), 1, dtype=torch.uint8) for _ in range(4)]
    assert handle.wait() == 2
    del junk
    gc.collect()
    assert ref() is None, "wait() must release the buffers it collected"
    assert file_bytes(path) == b"\x07" * n
    assert file_bytes(tmp_path / "tracked.bin") == b"\x09" * n


def test_context_manager_waits_and_closes(backend, tmp_path):
    t = random_tensor(1 << 20, torch.float32)
    with fastpersist.AioHandle(backend=backend) as h:
        h.async_pwrite(t, tmp_path / "c.bin")
    assert h.closed
    assert file_bytes(tmp_path / "c.bin") == t.numpy().tobytes()
    with pytest.raises(ValueError, match="closed"):
        h.sync_pwrite(t, tmp_path / "c.bin")
    h.close()  # idempotent


def test_dropping_a_handle_with_requests_in_flight(backend, tmp_path):
    h = fastpersist.AioHandle(backend=backend)
    for i in range(8):
        h.async_pwrite(torch.full((1 << 20,), i, dtype=torch.uint8), tmp_path / f"{i}.bin")
    del h
    gc.collect()
    for i in range(8):
        assert file_bytes(tmp_path / f"{i}.bin") == bytes([i]) * (1 << 20)


@pytest.mark.parametrize("parallelism", [1, 3, 4])
def test_intra_op_parallelism_any_size(backend, tmp_path, parallelism):
    with fastpersist.AioHandle(
        backend=backend, intra_op_parallelism=parallelism, block_size=64 << 10
    ) as h:
        for n in [1, 4095, 4096 * parallelism + 1, (3 << 20) + 11]:
            src = random_tensor(n, torch.uint8, seed=n)
            h.sync_pwrite(src, tmp_path / "x.bin")
            dst = torch.empty_like(src)
            h.sync_pread(dst, tmp_path / "x.bin")
            assert torch.equal(src, dst), n


def test_buffered_only_handle(backend, tmp_path):
    with fastpersist.AioHandle(backend=backend, direct_io=False) as h:
        src = random_tensor(1 << 20, torch.uint8)
        h.sync_pwrite(src, tmp_path / "b.bin")
        assert h.stats().direct_bytes == 0
        dst = torch.empty_like(src)
        h.sync_pread(dst, tmp_path / "b.bin")
        assert torch.equal(src, dst)


def test_stats_count_bytes(handle, tmp_path):
    before = handle.stats()
    handle.sync_pwrite(b"x" * 10000, tmp_path / "s.bin")
    handle.sync_pread(bytearray(10000), tmp_path / "s.bin")
    after = handle.stats()
    assert after.requests - before.requests == 2
    assert after.bytes_written - before.bytes_written == 10000
    assert after.bytes_read - before.bytes_read == 10000
