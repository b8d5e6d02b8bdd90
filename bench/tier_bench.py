#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draining checkpoints into a tier (issue 13), against fio, side by side in one run.

Two measurements, each repeated --rounds times with the order of its cases rotated:

- ``drain``: one committed checkpoint of GPT-2 large with its Adam state (built from its config,
  nothing downloaded; about 9.3 GB) is drained by ``fastpersist drain LOCAL TIER`` (the C++
  pass a manager runs in the background: direct reads, every checksum checked, fdatasync, the
  tier's commit) into a second directory, against fio copying the same number of bytes the way
  the drain must: an O_DIRECT read job and an O_DIRECT write job (io_uring, 8 MiB blocks,
  iodepth 32, end_fsync) running together. The page cache is dropped before each case (root).
- ``blocking``: the time ``save_async`` blocks (until the snapshot is taken) for a state of
  --blocking-gib GiB, made while the manager drains the previous save of the same size into a
  tier, against the same save on a manager without a tier.

    .venv/bin/python bench/tier_bench.py --folder bench-data --rounds 3

Prints both tables (medians) and their ratios; ``--json PATH`` writes every measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import torch

import fastpersist
from fastpersist.bench import models
from fastpersist.bench.loaders import drop_all_caches

GB = 1e9
ROOT = Path(__file__).resolve().parent.parent
FIO_BLOCK = 8 << 20


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)



def cli() -> str:
    built = ROOT / "build" / "tools" / "fastpersist"
    return str(built) if built.exists() else shutil.which("fastpersist") or "fastpersist"


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def fio_copy(fio: str, folder: Path, size: int) -> float:
    """GB/s of fio reading `size` bytes of one file and writing them to another at once."""
    src, dst = folder / "fio-src.dat", folder / "fio-dst.dat"
    if not src.exists() or src.stat().st_size != size:
        subprocess.run([fio, "--name=fill", f"--filename={src}", "--rw=write", "--direct=1",
                        "--ioengine=io_uring", "--bs=8M", "--iodepth=32", f"--size={size}",
                        "--output-format=json"], check=True, capture_output=True)
    dst.unlink(missing_ok=True)
    os.sync()
    drop_all_caches()
    common = ["--ioengine=io_uring", "--bs=8M", "--iodepth=32", "--direct=1", f"--size={size}"]
    began = time.perf_counter()
    subprocess.run([fio, "--output-format=json",
                    "--name=read", f"--filename={src}", "--rw=read", *common,
                    "--name=write", f"--filename={dst}", "--rw=write", "--end_fsync=1", *common],
                   check=True, capture_output=True)
    seconds = time.perf_counter() - began
    dst.unlink(missing_ok=True)
    return size / GB / seconds


def drain_once(local: Path, tier: Path) -> Dict[str, float]:
    shutil.rmtree(tier, ignore_errors=True)
    os.sync()
    drop_all_caches()
    began = time.perf_counter()
    out = subprocess.run([cli(), "drain", str(local), str(tier), "--json"], check=True,
                         capture_output=True, text=True).stdout
    seconds = time.perf_counter() - began
    report = json.loads(out)
    if len(report["drained"]) != 1 or report["failures"]:
        raise RuntimeError(f"the drain did not copy the checkpoint: {report}")
    return {"seconds": seconds, "bytes": report["bytes"], "gbps": report["bytes"] / GB / seconds}


def flat_state(gib: float, seed: int) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = int(gib * (1 << 30)) // 4 // 8
    return {f"t{i}": torch.randn(n, generator=g) for i in range(8)}


def blocking_once(folder: Path, gib: float, with_drain: bool) -> Dict[str, Any]:
    local, tier = folder / "blocking-local", folder / "blocking-tier"
    for p in (local, tier):
        shutil.rmtree(p, ignore_errors=True)
    tiers = [fastpersist.Tier(tier)] if with_drain else None
    a, b = flat_state(gib, 1), flat_state(gib, 2)
    mgr = fastpersist.CheckpointManager(local, tiers=tiers)
    try:
        mgr.save("a", a)  # commits; with a tier, its drain starts now
        drop_all_caches()
        began = time.perf_counter()
        handle = mgr.save_async("b", b)
        draining = with_drain and mgr.tier_status()[0].draining == "a"
        handle.wait_snapshot()
        blocked = time.perf_counter() - began
        handle.wait()
        mgr.wait()
    finally:
        mgr.close()
    return {"blocked_s": blocked, "drain_running": draining}


def rotate(cases: List[str], r: int) -> List[str]:
    return cases[r % len(cases):] + cases[:r % len(cases)]


def med(values: List[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", default=str(ROOT / "bench-data"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="gpt2-large", choices=sorted(models.MODELS))
    ap.add_argument("--blocking-gib", type=float, default=2.0)
    ap.add_argument("--fio", default=shutil.which("fio") or "fio")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    folder = Path(args.folder) / "tier-bench"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    results: Dict[str, Any] = {"model": args.model, "rounds": []}
    try:
        log(f"building {args.model} with its Adam state ...")
        model = models.build(args.model)
        opt = models.with_optimizer_state(model)
        local = folder / "local"
        with fastpersist.CheckpointManager(local) as mgr:
            mgr.save(1, {"model": model.state_dict(), "optim": opt.state_dict()})
        del model, opt
        size = tree_bytes(local / "step-00000001")
        fio_size = (size + FIO_BLOCK - 1) // FIO_BLOCK * FIO_BLOCK
        results["checkpoint_bytes"] = size
        log(f"checkpoint: {size / GB:.2f} GB")
        drains: List[float] = []
        fios: List[float] = []
        blocked: Dict[str, List[float]] = {"no tier": [], "draining": []}
        overlapped = 0
        for r in range(args.rounds):
            row: Dict[str, Any] = {}
            for case in rotate(["drain", "fio"], r):
                if case == "drain":
                    row["drain"] = drain_once(local, folder / "tier")
                    drains.append(row["drain"]["gbps"])
                else:
                    row["fio"] = fio_copy(args.fio, folder, fio_size)
                    fios.append(row["fio"])
            for case in rotate(["no tier", "draining"], r):
                m = blocking_once(folder, args.blocking_gib, case == "draining")
                row[case] = m
                blocked[case].append(m["blocked_s"])
                overlapped += int(m["drain_running"])
            log(f"round {r + 1}: drain {row['drain']['gbps']:.2f} GB/s, fio copy {row['fio']:.2f} GB/s; "
                f"save_async blocked {row['no tier']['blocked_s']:.3f} s alone, "
                f"{row['draining']['blocked_s']:.3f} s while draining")
            results["rounds"].append(row)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    d, f = med(drains), med(fios)
    alone, during = med(blocked["no tier"]), med(blocked["draining"])
    print(f"\nTier drain, {args.model} + Adam ({size / GB:.2f} GB), medians of {args.rounds} rounds")
    print("| case | GB/s | vs fio copy |\n|---|---|---|")
    print(f"| fio O_DIRECT read + write jobs together | {f:.2f} | 1.00 |")
    print(f"| `fastpersist drain` (verified, fdatasync, committed) | {d:.2f} | {d / f:.2f} |")
    print(f"\nsave_async blocking time, {args.blocking_gib:g} GiB state, medians of {args.rounds} rounds "
          f"(drain running during the snapshot in {overlapped} of {args.rounds})")
    print("| case | blocked (s) | vs no tier |\n|---|---|---|")
    print(f"| no tier | {alone:.3f} | 1.00 |")
    print(f"| while draining the previous save | {during:.3f} | {during / alone:.2f} |")
    print(f"\ntargets: drain >= 0.90 x fio copy: {'PASS' if d >= 0.9 * f else 'FAIL'} ({d / f:.2f}); "
          f"blocking <= 1.10 x: {'PASS' if during <= 1.1 * alone else 'FAIL'} ({during / alone:.2f})")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
