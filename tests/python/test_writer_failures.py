# SPDX-License-Identifier: Apache-2.0
"""Crash and error paths of ``FastFileWriter`` / ``fastpersist.save``: an exception inside
``torch.save``, ENOSPC on a small loop-mounted ext4 filesystem, a writer process killed with
SIGKILL. Never a partial file at the target path, the previous file untouched, never a hang.

A killed writer cannot remove its temporary: it stays as ``.<name>.fp-tmp-XXXXXX`` next to the
target, unlocked. The next writer of that target removes it, and so does
``fastpersist.clean_stale_temp_files`` (test_stale_files.py covers both in detail).
"""

from __future__ import annotations

import errno
import gc
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator, List

import pytest
import torch

import fastpersist
from _test_support import loop_ext4
from _torch_objects import assert_equal_objects, random_tensor

_MiB = 1 << 20
FORMATS = {"legacy": True, "zip": False}


class Boom:
    """Pickling it raises, as a bug in a user's __reduce__ would."""

    def __reduce__(self) -> Any:
        raise RuntimeError("boom while pickling")


class FailAfter:
    """A file object that passes writes to `inner` and raises EIO once `limit` bytes went
    through: torch.save fails part-way, after the writer already persisted some stages."""

    def __init__(self, inner: Any, limit: int) -> None:
        self.inner, self.limit, self.seen = inner, limit, 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        room = self.limit - self.seen
        if len(view) > room:  # pass what fits, then fail, as a device failing mid-request
            self.inner.write(view[:max(room, 0)])
            self.seen = self.limit
            raise OSError(errno.EIO, f"injected write failure after {self.limit} bytes")
        self.seen += len(view)
        return self.inner.write(view)

    def flush(self) -> None:
        self.inner.flush()


def _entries(folder: Path) -> List[str]:
    return sorted(n for n in os.listdir(folder) if n != "lost+found")


@pytest.fixture
def old_checkpoint(tmp_path: Path) -> Path:
    """A previous version at the target path, which no failure may touch."""
    path = tmp_path / "ckpt.pt"
    fastpersist.save({"version": 1, "w": torch.arange(1000.0)}, path)
    return path


def _assert_old_checkpoint_intact(path: Path, before: bytes) -> None:
    assert path.read_bytes() == before
    loaded = fastpersist.load(path)
    assert loaded["version"] == 1 and torch.equal(loaded["w"], torch.arange(1000.0))
    assert _entries(path.parent) == [path.name], "temporary files left behind"


# ---------------------------------------------------------------------------- exceptions
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_exception_while_pickling_leaves_old_file(old_checkpoint, fmt):
    before = old_checkpoint.read_bytes()
    obj = {"big": torch.ones(3 * _MiB), "bad": Boom()}
    with pytest.raises(RuntimeError, match="boom while pickling"):
        with fastpersist.FastFileWriter(old_checkpoint, io_buffer_mb=0.0625) as f:
            torch.save(obj, f, _use_new_zipfile_serialization=not FORMATS[fmt])
    assert f.closed and not f.committed
    _assert_old_checkpoint_intact(old_checkpoint, before)
    with pytest.raises(RuntimeError, match="boom while pickling"):
        fastpersist.save(obj, old_checkpoint, use_legacy_format=FORMATS[fmt])
    _assert_old_checkpoint_intact(old_checkpoint, before)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("limit", [100, 300_000, 2 * _MiB + 12345])
def test_write_failing_part_way_leaves_old_file(old_checkpoint, backend, fmt, limit):
    before = old_checkpoint.read_bytes()
    obj = {"a": random_tensor((_MiB,), torch.float32, seed=1), "b": torch.arange(77)}
    with pytest.raises((OSError, RuntimeError)):
        with fastpersist.FastFileWriter(old_checkpoint, io_buffer_mb=0.0625, backend=backend) as f:
            torch.save(obj, FailAfter(f, limit), _use_new_zipfile_serialization=not FORMATS[fmt])
    assert not f.committed
    if limit > 100_000:
        assert f.stats()["persisted_bytes"] > 0, "the failure came after stages hit the disk"
    _assert_old_checkpoint_intact(old_checkpoint, before)


def test_exception_after_torch_save_discards_the_file(old_checkpoint):
    before = old_checkpoint.read_bytes()
    with pytest.raises(ValueError, match="changed my mind"):
        with fastpersist.FastFileWriter(old_checkpoint) as f:
            torch.save({"version": 2}, f)
            raise ValueError("changed my mind")
    _assert_old_checkpoint_intact(old_checkpoint, before)


def test_keyboard_interrupt_discards_the_file(old_checkpoint):
    before = old_checkpoint.read_bytes()
    with pytest.raises(KeyboardInterrupt):
        with fastpersist.FastFileWriter(old_checkpoint) as f:
            f.write(b"x" * 100_000)
            raise KeyboardInterrupt
    _assert_old_checkpoint_intact(old_checkpoint, before)


def test_writer_dropped_without_close_leaves_nothing(old_checkpoint):
    before = old_checkpoint.read_bytes()
    f = fastpersist.FastFileWriter(old_checkpoint, io_buffer_mb=0.0625)
    torch.save({"version": 2, "w": torch.ones(_MiB)}, f)
    assert len(_entries(old_checkpoint.parent)) == 2  # the temporary exists while it is open
    del f
    gc.collect()
    _assert_old_checkpoint_intact(old_checkpoint, before)


def test_explicit_abort_then_close_commits_nothing(old_checkpoint):
    before = old_checkpoint.read_bytes()
    f = fastpersist.FastFileWriter(old_checkpoint)
    torch.save({"version": 2}, f)
    f.abort()
    f.abort()
    f.close()
    assert f.closed and not f.committed
    _assert_old_checkpoint_intact(old_checkpoint, before)


# ---------------------------------------------------------------------------- ENOSPC
@pytest.fixture(scope="module")
def small_fs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 16 MiB ext4 filesystem on a loop device; always unmounted afterwards."""
    with loop_ext4(tmp_path_factory.mktemp("enospc"), "16M") as mnt:
        yield mnt


def _free_blocks(folder: Path) -> int:
    os.sync()
    return os.statvfs(folder).f_bfree


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("io_buffer_mb", [0.0625, 64], ids=["fails_in_write", "fails_in_close"])
def test_enospc_is_an_os_error_and_leaves_no_file(small_fs, backend, fmt, io_buffer_mb):
    """20 MiB into 16 MiB. With a 64 MiB buffer every byte is staged, so the error comes from
    close(); with a tiny one, from a write() part-way."""
    target = small_fs / "ckpt.pt"
    fastpersist.save({"version": 1, "w": torch.arange(1000.0)}, target)
    before = target.read_bytes()
    free = _free_blocks(small_fs)
    obj = {"version": 2, "w": random_tensor((5 * _MiB,), torch.float32, seed=2)}
    with pytest.raises(OSError) as info:
        with fastpersist.FastFileWriter(target, io_buffer_mb=io_buffer_mb, backend=backend) as f:
            torch.save(obj, f, _use_new_zipfile_serialization=not FORMATS[fmt])
    assert info.value.errno == errno.ENOSPC, repr(info.value)
    assert info.value.filename == str(target), "the error names the file being saved"
    assert not f.committed
    _assert_old_checkpoint_intact(target, before)
    assert _free_blocks(small_fs) >= free - 4, "the temporary's blocks were freed"
    target.unlink()


def test_enospc_through_fastpersist_save(small_fs):
    target = small_fs / "model.pt"
    with pytest.raises(OSError) as info:
        fastpersist.save({"w": torch.zeros(5 * _MiB)}, target)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    assert _entries(small_fs) == []
    # The filesystem is usable again: a checkpoint that fits commits normally.
    small = {"w": random_tensor((_MiB,), torch.float32, seed=3)}
    fastpersist.save(small, target)
    assert_equal_objects(fastpersist.load(target), small)
    target.unlink()


# ---------------------------------------------------------------------------- SIGKILL
_KILLED_WRITER = textwrap.dedent("""
    import sys, torch, fastpersist
    target, backend = sys.argv[1], sys.argv[2]
    data = torch.empty(24 << 20, dtype=torch.uint8)
    version = 0
    while True:
        data.fill_(version % 251)
        fastpersist.save({"version": version, "data": data}, target, backend=backend,
                         io_buffer_mb=4)
        print(version, flush=True)
        version += 1
""")

_TEMP_NAME = re.compile(r"^\.ckpt\.pt\.fp-tmp-[A-Za-z0-9]{6}$")


@pytest.mark.parametrize("trial", range(3))
def test_sigkill_mid_save_never_leaves_a_bad_file(tmp_path, trial):
    """A process saving versions in a loop is killed at a random moment: the target is absent
    (killed before the first commit) or a complete version, never a torn one."""
    backend = [b.name for b in fastpersist.backends() if b.available][trial % 2]
    rng = random.Random(1000 + trial)
    target = tmp_path / "ckpt.pt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(target), backend],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    printed: List[int] = []
    try:
        # Trial 0 kills before the first commit is reported; the others after 1-3 commits.
        wanted = 0 if trial == 0 else rng.randint(1, 3)
        deadline = time.monotonic() + 60
        while len(printed) < wanted:
            line = proc.stdout.readline()
            assert line, f"writer died: {proc.stderr.read()}"
            printed.append(int(line))
            assert time.monotonic() < deadline, "writer too slow"
        delay = rng.uniform(0.0, 0.15) if trial else rng.uniform(1.0, 2.0)
        time.sleep(delay)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        printed += [int(x) for x in proc.stdout.read().split()]
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    names = _entries(tmp_path)
    leftovers = [n for n in names if n != "ckpt.pt"]
    assert all(_TEMP_NAME.match(n) for n in leftovers), names
    assert len(leftovers) <= 1, "one save at a time, so at most one temporary"
    if "ckpt.pt" not in names:
        assert not printed, "a reported commit must survive"
        return
    loaded = torch.load(target, weights_only=True)  # plain torch reads it
    version = loaded["version"]
    last = printed[-1] if printed else -1
    assert version in (last, last + 1), f"version {version} after reported {printed}"
    assert loaded["data"].numel() == 24 << 20
    assert bool((loaded["data"] == version % 251).all()), f"torn data in version {version}"
    cleaned = fastpersist.clean_stale_temp_files(tmp_path)
    assert sorted(os.path.basename(p) for p in cleaned.removed) == sorted(leftovers)
    assert _entries(tmp_path) == ["ckpt.pt"]


# ---------------------------------------------------------------------------- GPU
def test_bench_gpu_without_cuda_is_a_clear_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here; the error path is for machines without it")
    r = subprocess.run([sys.executable, "-m", "fastpersist.bench", "tensor", "--gpu", "--folder",
                        str(tmp_path), "--mb_size", "1"], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode != 0
    assert "CUDA" in r.stderr and "--gpu" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch.cuda.is_available() "
                    "is False)")
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_gpu_tensors_through_the_writer_match_torch_save(tmp_path, fmt):  # pragma: no cover
    import io

    obj = {"gpu": torch.randn(100_003, device="cuda"), "cpu": torch.arange(10)}
    ref = io.BytesIO()
    torch.save(obj, ref, _use_new_zipfile_serialization=not FORMATS[fmt])
    with fastpersist.FastFileWriter(tmp_path / "g.pt", io_buffer_mb=0.0625) as f:
        torch.save(obj, f, _use_new_zipfile_serialization=not FORMATS[fmt])
    if fmt == "zip":
        assert (tmp_path / "g.pt").read_bytes() == ref.getvalue()
    loaded = torch.load(tmp_path / "g.pt", weights_only=True)
    assert torch.equal(loaded["gpu"].cpu(), obj["gpu"].cpu())
