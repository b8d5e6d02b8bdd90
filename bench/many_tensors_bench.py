#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checkpoints of many small tensors: is every operation linear in the number of tensors?

A mixture-of-experts model holds 10^5 tensors or more, most of them small. For each count
(default 10,000, 30,000 and 100,000 tensors of 16 float32 values, named like the experts of an
MoE model: ``model.layers.7.mlp.experts.41.w2.weight``) this saves one checkpoint with
``CheckpointManager`` and times, on it:

- ``save``: ``CheckpointManager.save`` (durable, checksummed, committed);
- ``list (py)``: ``CheckpointManager.checkpoints()``, which decodes every manifest of the root;
- ``list (cli)``: ``fastpersist list ROOT``;
- ``inspect (cli)``: ``fastpersist inspect DIR --json``: decoding the manifest, cheap checks;
- ``verify (cli)``: ``fastpersist verify DIR``: every byte against its checksum;
- ``verify (py)``: ``CheckpointManager.verify``;
- ``load``: ``CheckpointManager.load`` of the whole state (verified).

The table gives the best of ``--repeat`` rounds (default 2) in seconds and microseconds per
tensor; linear steps keep a flat µs/tensor column
as the count grows tenfold. CLI times include starting the process (a few ms). Run with the
package installed in .venv and the CLI built (``make build python``):

    .venv/bin/python bench/many_tensors_bench.py --folder bench-data
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

import fastpersist

REPO = Path(__file__).resolve().parents[1]


def moe_state(count: int) -> Dict[str, object]:
    """`count` small tensors named like an MoE model's experts, in a nested state dict."""
    model: Dict[str, torch.Tensor] = {}
    experts, per_expert = 64, 3
    for i in range(count):
        layer, rest = divmod(i, experts * per_expert)
        expert, which = divmod(rest, per_expert)
        name = f"layers.{layer}.mlp.experts.{expert}.w{which + 1}.weight"
        model[name] = torch.full((4, 4), float(i % 1000), dtype=torch.float32)
    return {"model": model, "step": count}


def timed(fn: Callable[[], object]) -> Tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def run_cli(cli: str, *args: str) -> None:
    proc = subprocess.run([cli, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{cli} {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")


def measure(count: int, folder: Path, cli: str) -> List[Tuple[str, float]]:
    root = folder / f"many-tensors-{count}"
    shutil.rmtree(root, ignore_errors=True)
    state = moe_state(count)
    rows: List[Tuple[str, float]] = []
    with fastpersist.CheckpointManager(root) as mgr:
        seconds, tag = timed(lambda: mgr.save(1, state))
        rows.append(("save", seconds))
        seconds, infos = timed(mgr.checkpoints)
        assert infos[0].num_tensors == count, infos
        rows.append(("list (py)", seconds))
        rows.append(("list (cli)", timed(lambda: run_cli(cli, "list", str(root)))[0]))
        ckpt = str(root / tag)
        rows.append(("inspect (cli)", timed(lambda: run_cli(cli, "inspect", ckpt, "--json"))[0]))
        rows.append(("verify (cli)", timed(lambda: run_cli(cli, "verify", ckpt))[0]))
        seconds, problems = timed(lambda: mgr.verify(tag))
        assert problems == [], problems[:3]
        rows.append(("verify (py)", seconds))
        seconds, loaded = timed(lambda: mgr.load(tag))
        assert len(loaded["model"]) == count
        rows.append(("load", seconds))
    shutil.rmtree(root, ignore_errors=True)
    return rows


def best_of(repeat: int, count: int, folder: Path, cli: str) -> List[Tuple[str, float]]:
    """The fastest of `repeat` rounds for each operation (each round saves anew)."""
    rounds = [measure(count, folder, cli) for _ in range(repeat)]
    return [(op, min(r[i][1] for r in rounds)) for i, (op, _) in enumerate(rounds[0])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", default="bench-data", help="where the checkpoints go")
    parser.add_argument("--counts", default="10000,30000,100000",
                        help="comma-separated tensor counts")
    parser.add_argument("--cli", default=str(REPO / "build" / "tools" / "fastpersist"))
    parser.add_argument("--repeat", type=int, default=2,
                        help="rounds per count; the table shows the fastest of each operation")
    args = parser.parse_args()
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    counts = [int(c) for c in args.counts.split(",")]
    print("command: " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))
    print(f"fastpersist {fastpersist.__version__}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, folder {folder}\n")
    results: Dict[int, List[Tuple[str, float]]] = {}
    for count in counts:
        print(f"measuring {count} tensors ...", file=sys.stderr, flush=True)
        results[count] = best_of(args.repeat, count, folder, args.cli)
    ops = [op for op, _ in results[counts[0]]]
    header = "| operation | " + " | ".join(f"{c:,} tensors: s | µs/tensor" for c in counts) + " |"
    print(header)
    print("|---|" + "---:|---:|" * len(counts))
    for i, op in enumerate(ops):
        cells = []
        for count in counts:
            seconds = results[count][i][1]
            cells.append(f"{seconds:.3f} | {seconds / count * 1e6:.1f}")
        print(f"| {op} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
