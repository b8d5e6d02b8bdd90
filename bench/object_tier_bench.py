#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draining into, and pulling back from, an S3 object-store tier (issue 13), side by side with
a single-stream copy through the same client, in one run.

A local checkpoint of --size bytes (64 MiB float32 tensors) is copied into a real S3 server
(SeaweedFS, started here in --folder unless --endpoint names a running one) four ways, each
--rounds times with the order of the cases rotated:

- ``drain``: a CheckpointManager with ``Tier("s3://...", part_size=, transfers=)`` drains the
  checkpoint (direct reads, every checksum checked, multipart uploads of --part-size parts,
  --transfers in flight, the manifest last). The page cache is dropped first (root).
- ``single-stream upload``: the same files through boto3's own ``upload_file`` with one thread
  (``TransferConfig(use_threads=False)``): an ``aws s3 cp``-style copy, one stream, same client.
- ``pull``: ``mgr.pull(tag, tier=url)`` into an empty local root (ranged reads of --part-size,
  --transfers at once, every byte checked before the local commit).
- ``single-stream download``: boto3's ``download_file`` with one thread, file by file.
- ``store: parallel puts`` / ``store: parallel gets``: what the store takes at best through the
  same client: the same number of parts put from memory, and the checkpoint's objects read in
  the same ranges into memory, --transfers threads, no files, no checks (the bound).

    .venv/bin/python bench/object_tier_bench.py --folder bench-data --size 1GiB --rounds 3

Prints the table (medians, GB/s, ratios to the single stream, parts and concurrency) and the
command; ``--json PATH`` writes every measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List

import torch

import fastpersist
from fastpersist.bench.loaders import drop_all_caches
from fastpersist.bench.seaweedfs import SeaweedFS
from fastpersist.bench.table import aligned, medians, rotated

GB = 1e9
TENSOR_BYTES = 64 << 20


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def make_checkpoint(root: Path, size: int) -> str:
    g = torch.Generator().manual_seed(1)
    state = {f"layer{i}.weight": torch.randn(TENSOR_BYTES // 4, generator=g)
             for i in range(max(1, size // TENSOR_BYTES))}
    with fastpersist.CheckpointManager(root) as mgr:
        mgr.save(1, state)
        return mgr.latest() or ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", required=True, help="where the local checkpoints (and the server's data) go")
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--part-size", default="32MiB")
    ap.add_argument("--transfers", type=int, default=8)
    ap.add_argument("--endpoint", help="a running S3 server instead of a SeaweedFS started here")
    ap.add_argument("--bucket", default="fastpersist-bench")
    ap.add_argument("--json", help="write every measurement here")
    a = ap.parse_args()
    from boto3.s3.transfer import TransferConfig

    folder = Path(a.folder) / f"object-tier-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    server = None
    try:
        if a.endpoint:
            endpoint = a.endpoint
        else:
            server = SeaweedFS(folder / "seaweedfs")
            server.start()
            endpoint = server.endpoint
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "fastpersist")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "fastpersist")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        client = fastpersist.S3Store(f"s3://{a.bucket}", endpoint_url=endpoint).client
        try:
            client.create_bucket(Bucket=a.bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        local = folder / "local"
        size = fastpersist.parse_size(a.size)
        log(f"making a {a.size} checkpoint in {local} ...")
        tag = make_checkpoint(local, size)
        files = sorted(p for p in (local / tag).iterdir() if p.is_file())
        nbytes = sum(p.stat().st_size for p in files)
        one_stream = TransferConfig(use_threads=False)
        part_bytes = fastpersist.parse_size(a.part_size)

        def store(prefix: str) -> fastpersist.S3Store:
            return fastpersist.S3Store(f"s3://{a.bucket}/{prefix}", endpoint_url=endpoint)

        def tier(prefix: str) -> fastpersist.Tier:
            return fastpersist.Tier(f"s3://{a.bucket}/{prefix}", store=store(prefix),
                                    part_size=a.part_size, transfers=a.transfers)

        drained: List[str] = []

        def drain() -> float:
            prefix = f"drain-{uuid.uuid4().hex[:8]}"
            drop_all_caches()
            began = time.perf_counter()
            with fastpersist.CheckpointManager(local, tiers=[tier(prefix)]) as mgr:
                mgr.wait()
            seconds = time.perf_counter() - began
            drained.append(prefix)
            return seconds

        def upload_single() -> float:
            prefix = f"single-{uuid.uuid4().hex[:8]}"
            drop_all_caches()
            began = time.perf_counter()
            for p in files:
                client.upload_file(str(p), a.bucket, f"{prefix}/{tag}/{p.name}", Config=one_stream)
            return time.perf_counter() - began

        def pull() -> float:
            prefix = drained[-1]
            dest = folder / f"pulled-{uuid.uuid4().hex[:8]}"
            with fastpersist.CheckpointManager(dest, tiers=[tier(prefix)]) as mgr:
                began = time.perf_counter()
                mgr.pull(tag, tier=f"s3://{a.bucket}/{prefix}")  # durable: fdatasync, then the commit
                seconds = time.perf_counter() - began
            shutil.rmtree(dest)
            return seconds

        # What the store takes at best through this client: the same parts as puts and ranged
        # gets, from memory, `transfers` threads, no file, no check, no durability.
        payload = memoryview(bytearray(os.urandom(1 << 20)) * (part_bytes >> 20))
        part_count = max(1, nbytes // part_bytes)

        def store_put() -> float:
            s3 = store(f"raw-{uuid.uuid4().hex[:8]}")
            began = time.perf_counter()
            with ThreadPoolExecutor(a.transfers) as ex:
                list(ex.map(lambda i: s3.put(f"part-{i}", payload), range(part_count)))
            return (time.perf_counter() - began) * nbytes / (part_count * part_bytes)

        def store_get() -> float:
            s3 = store(drained[-1])
            ranges = [(k, off, min(part_bytes, size - off)) for k, size in s3.list(tag + "/")
                      for off in range(0, size, part_bytes)]

            def get(r: tuple) -> None:
                s3.get_into(r[0], r[1], memoryview(bytearray(r[2])))
            began = time.perf_counter()
            with ThreadPoolExecutor(a.transfers) as ex:
                list(ex.map(get, ranges))
            return time.perf_counter() - began

        def download_single() -> float:
            prefix = drained[-1]
            dest = folder / f"single-{uuid.uuid4().hex[:8]}"
            dest.mkdir()
            began = time.perf_counter()
            for p in files:
                client.download_file(a.bucket, f"{prefix}/{tag}/{p.name}", str(dest / p.name), Config=one_stream)
            seconds = time.perf_counter() - began
            shutil.rmtree(dest)
            return seconds

        drain()  # a first drain, untimed: what the pulls read, and the server warmed up
        cases: List[tuple[str, Callable[[], float]]] = [
            ("drain", drain), ("single-stream upload", upload_single), ("store: parallel puts", store_put),
            ("pull", pull), ("single-stream download", download_single), ("store: parallel gets", store_get)]
        runs: List[Dict[str, float]] = []
        for r in range(a.rounds):
            run: Dict[str, float] = {}
            for name, fn in rotated(cases, r):
                seconds = fn()
                run[name] = seconds
                log(f"round {r + 1}: {name}: {seconds:.2f} s ({nbytes / seconds / GB:.3f} GB/s)")
            runs.append(run)
        med = medians(runs)
        parts = sum((p.stat().st_size + part_bytes - 1) // part_bytes for p in files)
        rows = []
        for name, base, limit in (("drain", "single-stream upload", "store: parallel puts"),
                                  ("single-stream upload", "single-stream upload", "store: parallel puts"),
                                  ("store: parallel puts", "single-stream upload", "store: parallel puts"),
                                  ("pull", "single-stream download", "store: parallel gets"),
                                  ("single-stream download", "single-stream download", "store: parallel gets"),
                                  ("store: parallel gets", "single-stream download", "store: parallel gets")):
            rows.append([name, f"{nbytes / med[name] / GB:.3f}", f"{med[name]:.2f}",
                         f"{med[base] / med[name]:.2f}x", f"{med[limit] / med[name]:.2f}"])
        print(f"object-store tier: {nbytes / GB:.2f} GB in {len(files)} files, {parts} parts of "
              f"{a.part_size}, {a.transfers} transfers at once; SeaweedFS {'(external)' if a.endpoint else '(local)'}; "
              f"medians of {a.rounds} rounds")
        print(aligned(["case", "GB/s", "s", "vs single stream", "share of the store's best"], rows))
        print("command: " + " ".join(["bench/object_tier_bench.py", *sys.argv[1:]]))
        if a.json:
            Path(a.json).write_text(json.dumps({"bytes": nbytes, "files": len(files), "parts": parts,
                                                "part_size": a.part_size, "transfers": a.transfers,
                                                "runs": runs, "medians": med}, indent=1))
        return 0
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
