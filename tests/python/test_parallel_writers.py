# SPDX-License-Identifier: Apache-2.0
"""Parallel writers: N writers (threads, or processes that each build the same object) run the
same ``torch.save`` and each persist their interleaved stripes of one shared temporary file. The
result is byte-identical to the single writer's file, loads with plain ``torch.load``, appears
only when the last writer closed, and exactly one writer reports ``committed``.

Across processes the serialization must be deterministic: the zip format is (storage keys are
"0", "1", ... in pickling order); the legacy format is not (its keys are storage addresses), so
legacy-format writers in different processes never agree and nothing is committed.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import threading
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

import fastpersist
from _torch_objects import (assert_equal_objects, assert_same_file, assert_same_sharing, mixed,
                            save_as_parallel_writer, torch_save_bytes)

_MiB = 1 << 20
N_WRITERS = [1, 2, 3, 8]
STRIPES = {"stripe4KiB": 4096 / _MiB, "stripe64KiB": 64 / 1024}
FORMATS = {"legacy": True, "zip": False}
TIMEOUT = 120  # seconds; nothing may hang


@pytest.fixture(scope="module")
def obj() -> Any:
    return mixed()


@pytest.fixture(scope="module")
def single_writer_file(obj, tmp_path_factory) -> Dict[str, bytes]:
    """The single writer's file in each format, itself checked against torch.save."""
    out = {}
    folder = tmp_path_factory.mktemp("single")
    for fmt, legacy in FORMATS.items():
        path = folder / f"{fmt}.pt"
        with fastpersist.FastFileWriter(path, io_buffer_mb=0.0625) as f:
            torch.save(obj, f, _use_new_zipfile_serialization=not legacy)
        out[fmt] = path.read_bytes()
        assert_same_file(out[fmt], torch_save_bytes(obj, legacy))
    return out


def _check_result(path: Path, expected: bytes, obj: Any, stats: List[Dict[str, Any]]) -> None:
    assert_same_file(path.read_bytes(), expected)
    assert sum(s["committed"] for s in stats) == 1, "exactly one writer commits"
    assert sum(s["persisted_bytes"] for s in stats) == len(expected), "each byte persisted once"
    assert all(s["bytes"] == len(expected) for s in stats), "every writer saw the whole stream"
    loaded = torch.load(path, weights_only=True)
    assert_equal_objects(loaded, obj)
    assert_same_sharing(loaded, obj)
    assert os.listdir(path.parent) == [path.name], "bookkeeping files left behind"


def _stats(f: fastpersist.FastFileWriter) -> Dict[str, Any]:
    return {"committed": f.committed, **f.stats()}


# ---------------------------------------------------------------------------- threads
@pytest.mark.parametrize("stripe", list(STRIPES))
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("n", N_WRITERS)
def test_threads_then_ordered_closes(obj, single_writer_file, tmp_path, n, fmt, stripe):
    """Writers serialize concurrently; then they close one by one in a random order and the file
    appears only at the last close, made by the writer that reports `committed`."""
    path = tmp_path / "ckpt.pt"
    writers = [fastpersist.FastFileWriter(path, num_parallel_writers=n, writer_rank=r,
                                          stripe_mb=STRIPES[stripe], io_buffer_mb=0.0625)
               for r in range(n)]
    barrier = threading.Barrier(n)
    errors: List[BaseException] = []

    def run(w: fastpersist.FastFileWriter) -> None:
        try:
            barrier.wait(timeout=TIMEOUT)
            torch.save(obj, w, _use_new_zipfile_serialization=not FORMATS[fmt])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(w,)) for w in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT)
        assert not t.is_alive(), "a writer thread hangs"
    assert not errors, errors
    order = list(range(n))
    random.Random(n * 31 + len(fmt)).shuffle(order)
    for i, r in enumerate(order):
        assert not path.exists(), f"file appeared after {i} of {n} closes"
        writers[r].close()
        assert writers[r].committed == (i == n - 1)
    _check_result(path, single_writer_file[fmt], obj, [_stats(w) for w in writers])


@pytest.mark.parametrize("n", [2, 3, 8])
def test_threads_closing_concurrently(obj, single_writer_file, tmp_path, n):
    path = tmp_path / "ckpt.pt"
    stats: List[Dict[str, Any]] = []
    errors: List[BaseException] = []
    barrier = threading.Barrier(n)

    def run(rank: int) -> None:
        try:
            with fastpersist.FastFileWriter(path, num_parallel_writers=n, writer_rank=rank,
                                            stripe_mb=STRIPES["stripe64KiB"]) as f:
                torch.save(obj, f)
                barrier.wait(timeout=TIMEOUT)  # all closes race
            stats.append(_stats(f))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT)
        assert not t.is_alive(), "a writer thread hangs"
    assert not errors, errors
    _check_result(path, single_writer_file["zip"], obj, stats)


def test_one_failing_writer_means_no_file(obj, tmp_path):
    """If one writer fails, the others' closes cannot complete the set: no file, nobody commits,
    nothing waits for the missing writer, and (since the failed writer removed the shared
    temporary they write to) their closes say so instead of returning as if all were well."""
    path = tmp_path / "ckpt.pt"
    writers = [fastpersist.FastFileWriter(path, num_parallel_writers=3, writer_rank=r,
                                          stripe_mb=STRIPES["stripe4KiB"], io_buffer_mb=0.0625)
               for r in range(3)]
    with pytest.raises(RuntimeError, match="rank 1 failed"):
        with writers[1] as f:
            torch.save(obj, f)
            raise RuntimeError("rank 1 failed")
    for r in (0, 2):
        with pytest.raises(OSError, match="another writer of this file aborted"):
            with writers[r] as f:
                torch.save(obj, f)
    assert not path.exists()
    assert not any(w.committed for w in writers)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------- processes
@pytest.fixture(scope="module")
def pool():
    """Spawned worker processes, each building the object itself from seeds."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as p:
        yield p
        p.terminate()


@pytest.mark.parametrize("n", N_WRITERS)
def test_processes_one_by_one(obj, single_writer_file, pool, tmp_path, n):
    """Each rank runs in a spawned process, one after another in a random order; the file
    appears with the last one."""
    path = tmp_path / "ckpt.pt"
    order = list(range(n))
    random.Random(n).shuffle(order)
    stats = []
    for i, r in enumerate(order):
        assert not path.exists(), f"file appeared after {i} of {n} writers"
        stats.append(pool.apply_async(save_as_parallel_writer,
                                      (str(path), n, r, STRIPES["stripe4KiB"])).get(TIMEOUT))
        assert stats[-1]["committed"] == (i == n - 1)
    assert stats[0]["pid"] != os.getpid()
    _check_result(path, single_writer_file["zip"], obj, stats)


@pytest.mark.parametrize("n", [3, 8])
def test_processes_concurrently(obj, single_writer_file, pool, tmp_path, n):
    path = tmp_path / "ckpt.pt"
    jobs = [pool.apply_async(save_as_parallel_writer, (str(path), n, r, STRIPES["stripe64KiB"]))
            for r in range(n)]
    stats = [j.get(TIMEOUT) for j in jobs]
    _check_result(path, single_writer_file["zip"], obj, stats)


def test_processes_with_legacy_format_never_commit_mixed_content(obj, pool, tmp_path):
    """The legacy format names storages by address, so two processes serialize different
    bytes; the writers must not assemble a file from both."""
    path = tmp_path / "ckpt.pt"
    jobs = [pool.apply_async(save_as_parallel_writer,
                             (str(path), 2, r, STRIPES["stripe4KiB"], True)) for r in range(2)]
    stats = [j.get(TIMEOUT) for j in jobs]
    if len({s["pid"] for s in stats}) == 1:
        pytest.skip("both ranks ran in one worker process")
    if path.exists():  # only if both processes happened to use the same addresses
        assert sum(s["committed"] for s in stats) == 1
        assert_equal_objects(torch.load(path, weights_only=True), obj)
    else:
        assert not any(s["committed"] for s in stats)
