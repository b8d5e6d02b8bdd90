# SPDX-License-Identifier: Apache-2.0
"""``fastpersist.FastFileWriter`` as the file object ``torch.save`` writes into.

The file it commits is byte-identical to what ``torch.save`` writes into an ``io.BytesIO`` with
the same serialization settings, and ``torch.load`` gives back equal objects, for a matrix of
objects and of writer settings on every backend.

torch 2.13 writes DOS time/date 0 (1980-00-00) into every zip header and a serialization id
derived from record names and CRCs, so two saves of the same object are byte-identical in the
zip format too; ``assert_same_file`` compares whole files and, when they differ, names the zip
records (offsets, sizes, payloads) that differ.
"""

from __future__ import annotations

import errno
import io
import mmap
import os
import random
from typing import Any, Dict, List

import numpy as np
import pytest
import torch

import fastpersist
from _torch_objects import (OBJECTS, assert_equal_objects, assert_same_file, assert_same_sharing,
                            mixed, page_aligned, save_config, torch_save_bytes, zip_records)

_MiB = 1 << 20

# Writer settings: double/single staging, tiny (64 KiB), odd-sized and default (64 MiB) buffers,
# zero-copy on and off, durable or not. durable=False skips only the fsyncs.
WRITER_SETTINGS: Dict[str, Dict[str, Any]] = {
    "double_64MiB": {},
    "single_64MiB": {"single_io_buffer": True},
    "double_tiny": {"io_buffer_mb": 0.0625},
    "single_tiny": {"io_buffer_mb": 0.0625, "single_io_buffer": True},
    "tiny_no_zero_copy": {"io_buffer_mb": 0.0625, "zero_copy": False},
    "odd_buffer_no_zero_copy": {"io_buffer_mb": 0.3, "zero_copy": False, "durable": False},
    "large_single_not_durable": {"io_buffer_mb": 128, "single_io_buffer": True, "durable": False},
}

# (legacy format?, zip storage alignment) — 4096 lets large storages take the zero-copy path.
FORMATS = {"legacy": (True, None), "zip_align64": (False, 64), "zip_align4096": (False, 4096)}


def _torch_save_through_writer(obj: Any, path: os.PathLike, legacy: bool, **options: Any):
    with fastpersist.FastFileWriter(path, **options) as f:
        torch.save(obj, f, _use_new_zipfile_serialization=not legacy)
    return f


def _no_strays(folder: os.PathLike, keep: List[str]) -> None:
    assert sorted(os.listdir(folder)) == sorted(keep), "temporary files left behind"


@pytest.fixture(scope="module")
def objects() -> Dict[str, Any]:
    """Each object built once per module (GPT-2 takes a few seconds)."""
    pytest.importorskip("transformers")
    return {name: build() for name, build in OBJECTS.items()}


@pytest.fixture(scope="module")
def mixed_object() -> Any:
    return mixed()


# ---------------------------------------------------------------------------- the file object
def test_file_object_surface(tmp_path):
    path = tmp_path / "f.bin"
    w = fastpersist.FastFileWriter(path)
    assert w.writable() and not w.readable() and not w.seekable()
    assert not hasattr(w, "fileno"), "torch must not write behind the writer's back"
    assert w.name == str(path) and not w.closed and not w.committed
    assert w.write(b"abc") == 3
    assert w.write(b"") == 0
    w.flush()
    assert not path.exists(), "nothing appears before close()"
    assert w.bytes_written == 3 and "open" in repr(w)
    w.close()
    assert w.closed and w.committed and "closed" in repr(w)
    w.close()  # idempotent
    assert path.read_bytes() == b"abc"
    with pytest.raises(ValueError, match="closed writer"):
        w.write(b"more")
    w.abort()  # after a commit: a no-op that keeps the file
    assert path.read_bytes() == b"abc"
    _no_strays(tmp_path, ["f.bin"])


def test_every_buffer_type_is_accepted(tmp_path):
    page = mmap.mmap(-1, 3 * 4096)  # page-aligned source memory
    page[:] = bytes(range(256)) * 48
    chunks: List[Any] = [b"bytes", bytearray(b"bytearray"), memoryview(b"memoryview"),
                         np.arange(10, dtype=np.int32), torch.arange(7, dtype=torch.int16).numpy(),
                         page, memoryview(page)[5:4000]]
    expected = b"".join(bytes(memoryview(c).cast("B")) for c in chunks)
    with fastpersist.FastFileWriter(tmp_path / "t.bin") as w:
        for c in chunks:
            assert w.write(c) == memoryview(c).nbytes
    assert (tmp_path / "t.bin").read_bytes() == expected


def test_bad_writes_raise_and_leave_no_file(tmp_path):
    w = fastpersist.FastFileWriter(tmp_path / "t.bin")
    with pytest.raises(TypeError):
        w.write("text")
    with pytest.raises(ValueError, match="contiguous"):
        w.write(np.zeros((4, 4))[:, ::2])
    w.abort()
    assert w.closed and not w.committed
    w.close()  # after abort: nothing to commit, and still no file
    _no_strays(tmp_path, [])


@pytest.mark.parametrize("kwargs, match", [
    ({"io_buffer_mb": 0.001}, "io_buffer_bytes"),
    ({"io_buffer_mb": 0.004, "single_io_buffer": False}, "io_buffer_bytes"),
    ({"num_parallel_writers": 2, "writer_rank": 2}, "writer_rank"),
    ({"num_parallel_writers": 0}, "writer_rank"),
    ({"num_parallel_writers": 2, "stripe_mb": 0.001}, "stripe_bytes"),
    ({"backend": "no-such-backend"}, "backend"),
])
def test_bad_options_are_value_errors(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fastpersist.FastFileWriter(tmp_path / "t.bin", **kwargs)
    _no_strays(tmp_path, [])


def test_bad_targets_are_os_errors(tmp_path):
    missing = tmp_path / "no" / "such" / "t.pt"
    with pytest.raises(FileNotFoundError) as info:
        fastpersist.FastFileWriter(missing)
    assert info.value.errno == errno.ENOENT and info.value.filename == str(missing)
    with pytest.raises(IsADirectoryError):
        fastpersist.FastFileWriter(tmp_path)


def test_random_stream_is_written_exactly(backend, tmp_path):
    """Many write sizes (tiny, odd, aligned and large, from aligned and unaligned memory) across
    staging-half boundaries; the file is exactly the concatenation."""
    rng = random.Random(1234)
    src = mmap.mmap(-1, 4 * _MiB)  # page-aligned, so aligned runs can go zero-copy
    src[:] = np.random.default_rng(5).integers(0, 256, 4 * _MiB, dtype=np.uint8).tobytes()
    view = memoryview(src)
    pieces = []
    for _ in range(60):
        kind = rng.random()
        n = (rng.randint(0, 40) if kind < 0.4 else rng.randint(1, 70000) if kind < 0.8
             else rng.choice([4096, 65536, _MiB, _MiB + 4096, 2 * _MiB]))
        start = 0 if kind >= 0.8 else rng.randint(0, 4 * _MiB - n)
        pieces.append(view[start:start + n])
    expected = b"".join(bytes(p) for p in pieces)
    for name, opts in [("tiny", {"io_buffer_mb": 0.0625}),
                       ("single_odd", {"io_buffer_mb": 0.3, "single_io_buffer": True}),
                       ("default", {})]:
        path = tmp_path / f"{name}.bin"
        with fastpersist.FastFileWriter(path, backend=backend, **opts) as w:
            for p in pieces:
                w.write(p)
        assert path.read_bytes() == expected, name
        assert w.stats()["bytes"] == len(expected)


@pytest.mark.parametrize("mib", [3, 12])
def test_pinned_memory_stays_at_the_configured_size(tmp_path, mib):
    """Staging is io_buffer_mb whatever the checkpoint size (the process-wide pool may hand out
    a cached buffer up to twice the request)."""
    data = torch.zeros(mib * _MiB, dtype=torch.uint8)
    with fastpersist.FastFileWriter(tmp_path / "t.pt", io_buffer_mb=0.25) as w:
        torch.save(data, w)
    stats = w.stats()
    assert _MiB // 4 <= stats["pinned_bytes"] <= _MiB // 2
    assert stats["bytes"] == w.bytes_written == os.path.getsize(tmp_path / "t.pt") > mib * _MiB


def test_show_statistics_prints_one_line(tmp_path, capsys):
    with fastpersist.FastFileWriter(tmp_path / "t.pt", show_statistics=True) as w:
        torch.save(torch.ones(100), w)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("stats = {bytes: ") and "zero_copy_bytes" in out[0]


# ---------------------------------------------------------------------------- byte identity
@pytest.mark.parametrize("fmt", ["legacy", "zip_align64"])
@pytest.mark.parametrize("name", list(OBJECTS))
def test_torch_save_is_byte_identical_for_every_object(objects, tmp_path, name, fmt):
    legacy, alignment = FORMATS[fmt]
    obj = objects[name]
    path = tmp_path / "ckpt.pt"
    with save_config(storage_alignment=alignment):
        expected = torch_save_bytes(obj, legacy)
        _torch_save_through_writer(obj, path, legacy)
    assert_same_file(path.read_bytes(), expected)
    loaded = torch.load(path, weights_only=True)
    assert_equal_objects(loaded, obj)
    assert_same_sharing(loaded, obj)
    _no_strays(tmp_path, ["ckpt.pt"])


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("settings", list(WRITER_SETTINGS))
def test_torch_save_is_byte_identical_for_every_setting(mixed_object, backend, tmp_path, settings,
                                                        fmt):
    legacy, alignment = FORMATS[fmt]
    path = tmp_path / "ckpt.pt"
    with save_config(storage_alignment=alignment):
        expected = torch_save_bytes(mixed_object, legacy)
        w = _torch_save_through_writer(mixed_object, path, legacy, backend=backend,
                                       **WRITER_SETTINGS[settings])
    assert w.committed
    assert_same_file(path.read_bytes(), expected)
    stats = w.stats()
    assert stats["bytes"] == len(expected) == stats["persisted_bytes"]
    assert stats["zero_copy_bytes"] + stats["fill_bytes"] == len(expected)
    opts = WRITER_SETTINGS[settings]
    if not opts.get("zero_copy", True):
        assert stats["zero_copy_bytes"] == 0
    elif fmt == "zip_align4096" and opts.get("io_buffer_mb", 64) < 1:
        assert stats["zero_copy_bytes"] >= 1 << 20, "the page-aligned 1.5 MiB storage"
    loaded = torch.load(path, weights_only=True)
    assert_equal_objects(loaded, mixed_object)
    assert_same_sharing(loaded, mixed_object)
    _no_strays(tmp_path, ["ckpt.pt"])


def test_aligned_storages_go_zero_copy(tmp_path):
    """With 4096-byte alignment, the payload of a large CPU storage is written straight from the
    tensor's memory; without zero-copy, the same bytes are staged."""
    # torch's CPU allocator aligns to 64 bytes only; O_DIRECT needs 512 or 4096, so take page-
    # aligned memory (what THP_MEM_ALLOC_ENABLE=1 or pinned allocations give real tensors).
    big = page_aligned(torch.arange(2 * _MiB, dtype=torch.int32))  # 8 MiB
    with save_config(storage_alignment=4096):
        expected = torch_save_bytes(big)
        fast = _torch_save_through_writer(big, tmp_path / "zc.pt", False, io_buffer_mb=1)
        slow = _torch_save_through_writer(big, tmp_path / "copy.pt", False, io_buffer_mb=1,
                                          zero_copy=False)
    assert (tmp_path / "zc.pt").read_bytes() == expected == (tmp_path / "copy.pt").read_bytes()
    assert big.data_ptr() % 4096 == 0
    assert fast.stats()["zero_copy_bytes"] >= 7 * _MiB
    assert slow.stats()["zero_copy_bytes"] == 0
    assert slow.stats()["fill_bytes"] == len(expected)


def test_zip_records_and_offsets_match(objects, tmp_path):
    """Record-by-record: the same names, header and data offsets, sizes and payloads."""
    obj = objects["model_and_adam"]
    with save_config(storage_alignment=4096, compute_crc32=True):
        expected = torch_save_bytes(obj)
        _torch_save_through_writer(obj, tmp_path / "m.pt", False, io_buffer_mb=0.0625)
    written = (tmp_path / "m.pt").read_bytes()
    assert zip_records(written) == zip_records(expected)
    assert all(rec[2] % 4096 == 0 for rec in zip_records(written))


def test_saving_the_same_object_twice_is_reproducible():
    """The premise of byte identity in the zip format: nothing time- or run-dependent in it."""
    obj = {"w": torch.arange(100.0), "meta": {"step": 3}}
    first = torch_save_bytes(obj)
    again = torch_save_bytes(obj)
    assert first == again
    import zipfile

    assert {i.date_time for i in zipfile.ZipFile(io.BytesIO(first)).infolist()} == {
        (1980, 0, 0, 0, 0, 0)}
