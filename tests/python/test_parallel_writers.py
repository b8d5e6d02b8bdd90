# SPDX-License-Identifier: Apache-2.0
"""Parallel writers: N writers (threads, or processes that each build the same object) run the
same ``torch.save`` and each persist their interleaved stripes of one shared temporary file. The
result is byte-identical to the single writer's file, loads with plain ``torch.load``, appears
only when the last writer closed, and exactly one writer reports ``committed``.

Across processes the serialization must be deterministic: the zip format is (storage keys are
"0", "1", ... in pickling order); the legacy format is not (its keys are storage addresses), so
legacy-format writers in different processes never agree and nothing is committed.

Failures are never silent and never commit the wrong file: when one writer aborts, the others'
close() raise (ECANCELED), also when a new attempt has meanwhile started at the same path; with
``commit_timeout`` a close() waits for the set to commit and otherwise raises TimeoutError naming
the ranks that have not closed or serialized different bytes.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import random
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List

import pytest
import torch

import fastpersist
from _torch_objects import (assert_equal_objects, assert_same_file, assert_same_sharing, mixed,
                            parallel_writer_outcome, save_as_parallel_writer, torch_save_bytes)

_MiB = 1 << 20
N_WRITERS = [1, 2, 3, 8]
STRIPES = {"stripe4KiB": 4096 / _MiB, "stripe64KiB": 64 / 1024}
FORMATS = {"legacy": True, "zip": False}
TIMEOUT = 120  # seconds; nothing may hang


def run_in_threads(fn: Callable[[Any], None], args: Iterable[Any]) -> None:
    """Runs fn(a) for each a on its own thread; fails if one is still running after TIMEOUT."""
    threads = [threading.Thread(target=fn, args=(a,)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT)
        assert not t.is_alive(), "a writer thread hangs"


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

    run_in_threads(run, writers)
    assert not errors, errors
    order = list(range(n))
    random.Random(n * 31 + len(fmt)).shuffle(order)
    for i, r in enumerate(order):
        assert not path.exists(), f"file appeared after {i} of {n} closes"
        writers[r].close()
        assert writers[r].committed == (i == n - 1)
    _check_result(path, single_writer_file[fmt], obj, [_stats(w) for w in writers])


@pytest.mark.parametrize("commit_timeout", [None, TIMEOUT])
@pytest.mark.parametrize("n", [2, 3, 8])
def test_threads_closing_concurrently(obj, single_writer_file, tmp_path, n, commit_timeout):
    """All closes race. With a commit timeout every close returns only once the file is
    committed, and says so (without sitting out its timeout)."""
    path = tmp_path / "ckpt.pt"
    stats: List[Dict[str, Any]] = []
    errors: List[BaseException] = []
    barrier = threading.Barrier(n)

    def run(rank: int) -> None:
        try:
            with fastpersist.FastFileWriter(path, num_parallel_writers=n, writer_rank=rank,
                                            stripe_mb=STRIPES["stripe64KiB"],
                                            commit_timeout=commit_timeout) as f:
                torch.save(obj, f)
                barrier.wait(timeout=TIMEOUT)  # all closes race
            if commit_timeout:
                assert path.exists() and f.file_committed, f"rank {rank} returned before the commit"
            stats.append(_stats(f))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    start = time.monotonic()
    run_in_threads(run, range(n))
    assert not errors, errors
    assert time.monotonic() - start < TIMEOUT / 2, "a close sat out its timeout"
    _check_result(path, single_writer_file["zip"], obj, stats)


def test_fastpersist_save_as_parallel_writers_reports_the_commit(obj, single_writer_file, tmp_path):
    """fastpersist.save in three threads with a commit timeout: exactly one call committed the
    file, and every call returns only once the file is there, saying so."""
    path = tmp_path / "ckpt.pt"
    results: List[Dict[str, Any]] = []
    errors: List[BaseException] = []

    def run(rank: int) -> None:
        try:
            results.append(fastpersist.save(obj, path, num_parallel_writers=3, writer_rank=rank,
                                            stripe_mb=STRIPES["stripe64KiB"], commit_timeout=TIMEOUT))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    run_in_threads(run, range(3))
    assert not errors, errors
    assert sum(r["committed"] for r in results) == 1
    assert all(r["file_committed"] for r in results)
    assert torch.load(path, weights_only=True).keys() == obj.keys()
    assert os.listdir(tmp_path) == [path.name]


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


def _open_and_save(path: Path, n: int, obj: Any, **kwargs: Any) -> List[fastpersist.FastFileWriter]:
    """Writers 0..n-1 of `path`, each having serialized `obj` (none closed yet)."""
    writers = [fastpersist.FastFileWriter(path, num_parallel_writers=n, writer_rank=r,
                                          stripe_mb=STRIPES["stripe4KiB"], io_buffer_mb=0.0625,
                                          **kwargs)
               for r in range(n)]
    for w in writers:
        torch.save(obj, w)
    return writers


def _assert_aborted(w: fastpersist.FastFileWriter) -> None:
    with pytest.raises(OSError, match="another writer of this file aborted") as info:
        w.close()
    assert info.value.errno == errno.ECANCELED
    assert info.value.filename == w.name
    assert w.closed and not w.committed and not w.file_committed


@pytest.mark.parametrize("commit_timeout", [None, 30])
def test_an_abort_fails_the_other_closes_and_leaves_nothing(obj, tmp_path, commit_timeout):
    """Regression: abort() removed the shared temporary without the lock and the others' closes
    succeeded silently. Now they raise at once (a commit timeout does not make them wait)."""
    path = tmp_path / "ckpt.pt"
    writers = _open_and_save(path, 3, obj, commit_timeout=commit_timeout)
    writers[1].abort()
    start = time.monotonic()
    _assert_aborted(writers[0])
    _assert_aborted(writers[2])
    assert time.monotonic() - start < 5
    assert os.listdir(tmp_path) == [], "no file and no bookkeeping once everyone is done"


def test_an_abort_then_a_new_attempt_commits_only_the_new_bytes(obj, tmp_path):
    """Attempt A loses rank 1 to abort() while attempt B writes a new shared temporary at the
    same path: A's remaining closes fail, B commits exactly B's file."""
    path = tmp_path / "ckpt.pt"
    obj_b = {"b": torch.arange(100_000, dtype=torch.int64), "a": obj}
    a = _open_and_save(path, 3, obj)
    a[1].abort()
    b = _open_and_save(path, 3, obj_b)
    _assert_aborted(a[0])
    _assert_aborted(a[2])
    assert not path.exists()
    for w in b:
        w.close()
    assert [w.committed for w in b] == [False, False, True]
    assert_same_file(path.read_bytes(), torch_save_bytes(obj_b))
    assert_equal_objects(torch.load(path, weights_only=True), obj_b)
    assert os.listdir(tmp_path) == [path.name]


def test_a_missing_rank_times_out_naming_it(obj, tmp_path):
    """Rank 2 serializes but never closes: the concurrent closes of ranks 0 and 1 raise
    TimeoutError naming rank 2 and leave the shared temporary to it (it is still running); its
    abort then removes everything."""
    path = tmp_path / "ckpt.pt"
    writers = _open_and_save(path, 3, obj, commit_timeout=1)
    errors: Dict[int, BaseException] = {}
    seconds: Dict[int, float] = {}

    def run(rank: int) -> None:
        start = time.monotonic()
        try:
            writers[rank].close()
        except BaseException as e:  # noqa: BLE001 - checked below
            errors[rank] = e
        seconds[rank] = time.monotonic() - start

    run_in_threads(run, range(2))
    for rank in range(2):
        e = errors.get(rank)
        assert isinstance(e, TimeoutError), f"rank {rank}: {e!r}"
        assert e.errno == errno.ETIMEDOUT and e.filename == str(path)
        assert f"this writer is rank {rank} of 3" in str(e)
        assert f"rank {1 - rank} closed with the same stream" in str(e)
        assert "rank 2 has not closed" in str(e)
        assert "other writers still have" in str(e)
        assert 0.9 <= seconds[rank] < 1 + 10, f"rank {rank} took {seconds[rank]:.1f} s"
    assert not path.exists()
    writers[2].abort()
    assert os.listdir(tmp_path) == []


def test_save_passes_commit_timeout_through(obj, tmp_path):
    """fastpersist.save(..., commit_timeout=) of one rank of two, the other never starting: it
    raises, and being the only writer it removes the shared temporary files."""
    path = tmp_path / "ckpt.pt"
    with pytest.raises(TimeoutError, match="rank 1 has not closed"):
        fastpersist.save(obj, path, num_parallel_writers=2, writer_rank=0, commit_timeout=0.2)
    assert os.listdir(tmp_path) == []


def test_bad_commit_timeouts_raise(tmp_path):
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="commit_timeout"):
            fastpersist.FastFileWriter(tmp_path / "x", num_parallel_writers=2, commit_timeout=bad)
    with pytest.raises(TypeError, match="commit_timeout"):
        fastpersist.FastFileWriter(tmp_path / "x", num_parallel_writers=2, commit_timeout="1")
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


def test_processes_with_legacy_format_and_commit_timeout_raise_naming_the_ranks(obj, pool,
                                                                              tmp_path):
    """With a commit timeout the legacy format's disagreement is no longer silent: each close
    raises TimeoutError within about the timeout, naming the other rank's different stream, and
    the last writer out removes the shared temporary and the records."""
    path = tmp_path / "out" / "ckpt.pt"
    path.parent.mkdir()
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    timeout = 2.0
    jobs = [pool.apply_async(parallel_writer_outcome,
                             (str(path), 2, r, STRIPES["stripe4KiB"], True, timeout, str(barrier)))
            for r in range(2)]
    out = [j.get(TIMEOUT) for j in jobs]
    assert out[0]["pid"] != out[1]["pid"], "the barrier puts the ranks in different processes"
    if all(o["error_type"] is None for o in out):  # both processes used the same addresses
        assert sum(o["committed"] for o in out) == 1
        assert_equal_objects(torch.load(path, weights_only=True), obj)
        return
    for o in out:
        other = 1 - o["rank"]
        assert o["error_type"] == "TimeoutError", o
        assert o["errno"] == errno.ETIMEDOUT, o
        assert f"this writer is rank {o['rank']} of 2" in o["error"], o["error"]
        assert f"rank {other} closed with a different stream" in o["error"], o["error"]
        assert "serialized different bytes" in o["error"], o["error"]
        assert "use the zip format" in o["error"], o["error"]
        assert timeout * 0.9 <= o["close_secs"] < timeout + 10, o
        assert not o["committed"] and not o["file_committed"]
    assert os.listdir(path.parent) == [], "the last writer out cleans up"
