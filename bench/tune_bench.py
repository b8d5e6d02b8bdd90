#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What `fastpersist tune` buys (issue 14), side by side in one run.

Runs ``fastpersist tune --folder F --budget B --output F/tuned.json`` once, then, for --rounds
rounds in rotated order, times one write and one cold read of --size bytes with
``fastpersist io-bench`` under three settings, and fio with the tuned settings (the limit the
same block size, queue depth and jobs give the kernel's own I/O path):

- ``library defaults``: EngineOptions as built (1 MiB blocks, queue depth 128, lock-step);
- ``io-bench defaults``: 8 MiB blocks, queue depth 32, overlapped events, one worker;
- ``tuned``: ``fastpersist --config F/tuned.json io-bench ...``;
- ``fio, tuned settings``: O_DIRECT, io_uring, the tuned block size and queue depth, one job
  per worker, end_fsync for writes.

    .venv/bin/python bench/tune_bench.py --folder bench-data --size 1GiB --budget 120s --rounds 3

Prints a table of medians; ``--json PATH`` writes every measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import fastpersist
from fastpersist.bench.loaders import drop_all_caches
from fastpersist.bench.table import markdown, rotated

ROOT = Path(__file__).resolve().parent.parent
CASES = ("library defaults", "io-bench defaults", "tuned", "fio, tuned settings")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cli() -> str:
    built = ROOT / "build" / "tools" / "fastpersist"
    return str(built) if built.exists() else shutil.which("fastpersist") or "fastpersist"



def io_bench(case: str, op: str, folder: Path, size: str, config: Path) -> float:
    flags = {"library defaults": ["--block-size", "1M", "--queue-depth", "128", "--sequential"],
             "io-bench defaults": [], "tuned": []}[case]
    pre = ["--config", str(config)] if case == "tuned" else []
    cmd = [cli(), *pre, "io-bench", "--folder", str(folder), "--size", size, "--loops", "1",
           f"--{op}", "--json", *flags]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPERSIST_")}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return float(json.loads(out)["best_gb_per_s"])


def fio(op: str, folder: Path, size_bytes: int, engine: Dict[str, int]) -> float:
    jobs = max(1, int(engine["intra_op_parallelism"]))
    path = folder / "tune-bench-fio.dat"
    common = ["--ioengine=io_uring", "--direct=1", f"--bs={engine['block_size']}",
              f"--iodepth={engine['queue_depth']}", f"--size={size_bytes // jobs}",
              f"--numjobs={jobs}", "--group_reporting", f"--filename={path}",
              "--output-format=json", "--name=tune-bench"]
    if op == "read":
        subprocess.run(["fio", *common, "--rw=write"], check=True, capture_output=True)
        drop_all_caches()
        out = subprocess.run(["fio", *common, "--rw=read"], check=True, capture_output=True, text=True)
        key = "read"
    else:
        path.unlink(missing_ok=True)
        out = subprocess.run(["fio", *common, "--rw=write", "--end_fsync=1"], check=True,
                             capture_output=True, text=True)
        key = "write"
    job = json.loads(out.stdout)["jobs"][0]
    path.unlink(missing_ok=True)
    return job[key]["io_bytes"] / (job[key]["runtime"] / 1000.0) / 1e9  # bytes per second


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", type=Path, default=Path("bench-data"))
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--budget", default="120s")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    config = args.folder / "tuned.json"
    log(f"tuning {args.folder} for {args.budget}")
    subprocess.run([cli(), "tune", "--folder", str(args.folder), "--size", args.size, "--budget",
                    args.budget, "--output", str(config), "--no-progress"], check=True,
                   stdout=sys.stderr)
    tuned = json.loads(config.read_text())
    engine = tuned["engine"]
    size_bytes = fastpersist.parse_size(args.size)
    runs: Dict[str, Dict[str, List[float]]] = {c: {"write": [], "read": []} for c in CASES}
    for r in range(args.rounds):
        for case in rotated(CASES, r):
            for op in ("write", "read"):
                drop_all_caches()
                rate = (fio(op, args.folder, size_bytes, engine) if case.startswith("fio")
                        else io_bench(case, op, args.folder, args.size, config))
                runs[case][op].append(rate)
                log(f"round {r + 1} {case} {op}: {rate:.2f} GB/s")
    med = {c: {op: statistics.median(v) for op, v in ops.items()} for c, ops in runs.items()}
    base = med["library defaults"]
    print(f"\nfastpersist tune on {args.folder}: {args.size} per measurement, budget {args.budget}; "
          f"tuned: {engine['backend']}, block {engine['block_size']}, queue depth "
          f"{engine['queue_depth']}, parallelism {engine['intra_op_parallelism']}, single_submit "
          f"{engine['single_submit']}, overlap_events {engine['overlap_events']}\n")
    print(f"medians of {args.rounds} rounds (GB/s), rotated order\n")
    print(markdown(["settings", "write", "read", "write vs library defaults", "read vs library defaults"],
                   [[c, f"{med[c]['write']:.2f}", f"{med[c]['read']:.2f}",
                     f"{med[c]['write'] / base['write']:.2f}", f"{med[c]['read'] / base['read']:.2f}"]
                    for c in CASES]))
    t, f = med["tuned"], med["fio, tuned settings"]
    print(f"\ntuned io-bench against fio with the same settings: write {t['write'] / f['write']:.2f}, "
          f"read {t['read'] / f['read']:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"config": tuned, "runs": runs, "medians": med}, indent=2))
    config.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
