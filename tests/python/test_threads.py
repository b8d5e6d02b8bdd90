# SPDX-License-Identifier: Apache-2.0
"""The GIL is released while I/O runs, and one handle serves several Python threads at once."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import fastpersist


class Counter(threading.Thread):
    """Counts as fast as pure Python can: progress is only possible while it holds the GIL."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.value = 0
        self.stop = False

    def run(self) -> None:
        while not self.stop:
            self.value += 1


def test_gil_is_released_during_sync_pwrite(backend, tmp_path):
    counter = Counter()
    counter.start()
    try:
        # Counting rate while the main thread sleeps (sleep releases the GIL).
        time.sleep(0.02)
        c0, t0 = counter.value, time.perf_counter()
        time.sleep(0.1)
        rate = (counter.value - c0) / (time.perf_counter() - t0)

        data = torch.empty(512 << 20, dtype=torch.uint8)
        data[::4096] = 1  # touch the pages so the write, not page faults, takes the time
        with fastpersist.AioHandle(backend=backend, intra_op_parallelism=1) as h:
            c0, t0 = counter.value, time.perf_counter()
            h.sync_pwrite(data, tmp_path / "big.bin")
            elapsed = time.perf_counter() - t0
            progress = counter.value - c0
    finally:
        counter.stop = True
        counter.join()
    if elapsed < 0.05:
        pytest.skip(f"the write took only {elapsed * 1000:.0f} ms; too fast to tell")
    # Holding the GIL, the counter could only run for about one switch interval (5 ms).
    assert progress > 0.2 * rate * elapsed, (
        f"counter advanced {progress} in {elapsed:.3f}s (free-running rate {rate:.0f}/s): "
        "the GIL was not released during the write"
    )


def test_sync_round_trips_from_several_threads(backend, tmp_path):
    errors = []
    with fastpersist.AioHandle(backend=backend, intra_op_parallelism=2) as h:

        def worker(k: int) -> None:
            try:
                for i in range(20):
                    src = torch.full((100_000 + k * 1000 + i,), k * 31 + i, dtype=torch.int32)
                    path = tmp_path / f"w{k}-{i}.bin"
                    assert h.sync_pwrite(src, path) >= 1
                    dst = torch.empty_like(src)
                    assert h.sync_pread(dst, path) >= 1
                    assert torch.equal(src, dst)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors


def test_async_writes_from_several_threads_then_one_wait(backend, tmp_path):
    per_thread, nthreads = 25, 4
    with fastpersist.AioHandle(backend=backend) as h:

        def worker(k: int) -> None:
            for i in range(per_thread):
                h.async_pwrite(
                    torch.full((50_000,), k * 100 + i, dtype=torch.int32), tmp_path / f"{k}-{i}.bin"
                )

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(nthreads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert h.wait() == per_thread * nthreads
        for k in range(nthreads):
            for i in range(per_thread):
                back = torch.empty(50_000, dtype=torch.int32)
                h.sync_pread(back, tmp_path / f"{k}-{i}.bin")
                assert bool((back == k * 100 + i).all())


def test_async_temporaries_survive_concurrent_waits(backend, tmp_path):
    """Writers hand temporaries to async_pwrite while other threads wait and sync-write:
    every file must hold exactly its temporary's bytes."""
    stop = threading.Event()
    errors = []
    with fastpersist.AioHandle(backend=backend) as h:

        def writer(k: int) -> None:
            try:
                for i in range(30):
                    h.async_pwrite(
                        torch.full((200_000,), (k * 30 + i) % 251, dtype=torch.uint8),
                        tmp_path / f"{k}-{i}.bin",
                    )
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        def waiter() -> None:
            try:
                while not stop.is_set():
                    h.wait()
                    h.sync_pwrite(torch.zeros(1000, dtype=torch.uint8), tmp_path / "noise.bin")
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        waiters = [threading.Thread(target=waiter) for _ in range(2)]
        writers = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
        for t in waiters + writers:
            t.start()
        for t in writers:
            t.join()
        stop.set()
        for t in waiters:
            t.join()
        h.wait()
    assert not errors, errors
    for k in range(3):
        for i in range(30):
            data = (tmp_path / f"{k}-{i}.bin").read_bytes()
            assert data == bytes([(k * 30 + i) % 251]) * 200_000, (k, i)


def test_sync_call_waits_for_its_own_request_under_concurrency(backend, tmp_path):
    """Regression: a sync call whose request was collected by another thread's concurrent drain
    returned 0 before its own write had finished. A sync call counts its own request, always."""
    short = []

    def worker(k: int, h: fastpersist.AioHandle) -> None:
        t = torch.full((4096,), k, dtype=torch.uint8)
        for _ in range(1000):
            n = h.sync_pwrite(t, tmp_path / f"{k}.bin")
            if n < 1:
                short.append(n)

    with fastpersist.AioHandle(backend=backend) as h:
        threads = [threading.Thread(target=worker, args=(k, h)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not short, f"{len(short)} of 8000 sync_pwrite calls returned before their own request"
